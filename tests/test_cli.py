"""The `fsobs` command: JSON contract and human report."""

from __future__ import annotations

import json
import subprocess
import sys

from fsobs.analysis.bubbles import CLASSES
from fsobs.cli import main
from tests.test_hta_agreement import REFERENCE


def _json(capsys, *args):
    assert main(["analyze", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_gpu_run(capsys):
    out = _json(capsys, str(REFERENCE / "hta_recsys_a2a_2rank"))
    assert out["run"] | {"path": None, "warnings": None, "hosts": None} == {
        "path": None,
        "world_size": 128,
        "ranks": [0, 1],
        "device": "gpu",
        "num_steps": 2,
        "steps": [551, 552],
        "step_source": ["ProfilerStep"],
        "hosts": None,
        "simulated": False,
        "warnings": None,
    }
    assert out["run"]["warnings"] == ["loaded 2 of 128 ranks (missing: 2, 3, 4, 5, 6, 7, 8, 9 ...)"]
    temporal = out["hta"]["temporal_breakdown"]
    assert [
        set(r)
        >= {"rank", "idle_time_us", "compute_time_us", "non_compute_time_us", "kernel_time_us"}
        for r in temporal
    ] == [True, True]
    assert temporal[0]["idle_time_us"] == 321378
    assert out["hta"]["comm_comp_overlap"] == [
        {"rank": 0, "comp_comm_overlap_pctg": 11.81},
        {"rank": 1, "comp_comm_overlap_pctg": 20.05},
    ]


def test_json_cpu_run_has_no_hta(capsys):
    out = _json(capsys, str(REFERENCE / "synthetic_gloo_a2a_straggler_4rank"))
    assert out["hta"] is None
    assert (out["run"]["device"], out["run"]["world_size"], out["run"]["num_steps"]) == (
        "cpu",
        4,
        4,
    )
    assert [r["num_comm_events"] for r in out["ranks_overview"]] == [8, 8, 8, 8]


def test_json_nan_becomes_null(capsys):
    out = _json(capsys, str(REFERENCE / "hta_ns_resolution"))
    assert out["hta"]["comm_comp_overlap"] == [{"rank": 0, "comp_comm_overlap_pctg": None}]


def test_json_from_a_list_of_files(capsys):
    files = sorted(str(p) for p in (REFERENCE / "hta_recsys_a2a_2rank").glob("*.gz"))
    assert _json(capsys, *files)["run"]["ranks"] == [0, 1]


def test_human_report_names_the_tables(capsys):
    assert main(["analyze", str(REFERENCE / "hta_recsys_a2a_2rank")]) == 0
    out = capsys.readouterr().out
    for heading in ("Ranks", "GPU temporal breakdown", "GPU idle time by stream", "321,378"):
        assert heading in out


def test_console_script_bad_input_exit_code(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    proc = subprocess.run(
        [sys.executable, "-m", "fsobs.cli", "analyze", str(bad)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "bad.json" in proc.stderr


def test_usage_error_exits_2(capsys):
    try:
        main(["analyze"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("argparse should exit")


def test_max_trace_gb_must_be_positive(capsys):
    for value in ("0", "-1", "nan", "abc"):
        try:
            main(["analyze", str(REFERENCE / "hta_amd_mi250"), "--max-trace-gb", value])
        except SystemExit as exc:
            assert exc.code == 2
        else:
            raise AssertionError(value)
    assert "--max-trace-gb" in capsys.readouterr().err


def test_json_bubble_keys_on_the_gloo_straggler_run(capsys):
    out = _json(capsys, str(REFERENCE / "synthetic_gloo_a2a_straggler_4rank"))
    assert set(out["summary"]) >= {
        "bubble_ratio",
        "bubble_ms_per_step",
        "straggler_wait_ms_per_step",
        "exposed_comm_ms_per_step",
        "host_idle_ms_per_step",
        "contention_ms_per_step",
        "step_time_ms_p50",
        "step_time_ms_p90",
        "clock_skew_ms",
    }
    assert 0 < out["summary"]["bubble_ratio"] < 1
    assert len(out["steps"]) == 4 * 4
    assert set(out["steps"][0]) == {
        "rank",
        "step",
        "window_ms",
        "busy_ms",
        "bubble_ms",
        "straggler_wait_ms",
        "exposed_comm_ms",
        "unattributed_comm_ms",
        "host_idle_ms",
        "other_ms",
        "contention_ms",
    }
    for row in out["steps"]:
        classes = sum(row[f"{k}_ms"] for k in CLASSES)
        assert abs(classes - row["window_ms"]) < 1e-6
    assert [(r["step"], r["rank"]) for r in out["stragglers"]["per_step"]] == [
        (s, 2) for s in (2, 3, 4, 5)
    ]
    per_rank = {r["rank"]: r for r in out["stragglers"]["per_rank"]}
    assert per_rank[2]["times_last"] == 4 and per_rank[2]["wait_caused_ms"] > 200
    assert out["stragglers"]["verdict"] == "stable"
    assert out["data_attribution"] is None
    assert out["collectives"]["unmatched"] == []


def test_human_report_leads_with_findings(capsys):
    assert main(["analyze", str(REFERENCE / "synthetic_gloo_a2a_straggler_4rank")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("- bubbles take ")
    assert lines[2].startswith("- straggler wait dominates")
    assert lines[3].startswith("- rank 2 is the straggler in 4 of 4 steps (stable)")
