"""The `fsobs` command: JSON contract and human report."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from fsobs.analysis.bubbles.parts import CLASSES
from fsobs.cli import build_parser, main
from fsobs.trace import LoadConfig, loader
from fsobs.workload import launch
from fsobs.workload.launch import LaunchConfig
from tests.support.kineto import REFERENCE

ROOT = Path(__file__).resolve().parents[3]


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
        "step_clock": "GPU window",
        "hosts": None,
        "simulated": False,
        "warnings": None,
        "left_out_ranks": {},
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


# ---- the command line: version, help examples, progress on a terminal ----
def test_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"fsobs {version('freescale')}"


def test_every_subcommand_help_has_an_example():
    parser = build_parser()
    assert "example: fsobs " in parser.format_help()
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(commands.choices) >= {"analyze", "export", "compare", "fit-cost", "dashboard", "run"}
    for name, sub in commands.choices.items():
        assert f"example: fsobs {name} " in sub.format_help(), name


STRAGGLER_RUN = REFERENCE / "synthetic_gloo_a2a_straggler_4rank"


def test_analyze_shows_progress_on_stderr_only_on_a_terminal(capsys, monkeypatch):
    assert main(["analyze", str(STRAGGLER_RUN), "--json"]) == 0
    plain = capsys.readouterr()
    assert plain.err == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["analyze", str(STRAGGLER_RUN), "--json"]) == 0
    shown = capsys.readouterr()
    assert json.loads(shown.out) == json.loads(plain.out)  # stdout stays clean
    err = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown.err)  # colors, cursor moves
    assert "fsobs: parsing synthetic_gloo_a2a_straggler_4rank" in err
    assert "4/4 ranks" in err


def test_map_run_reports_each_rank_parsed_in_the_pool(monkeypatch):
    monkeypatch.setattr(loader, "_PARALLEL_MIN_BYTES", 0)  # use the process pool
    seen: list[tuple[int, int]] = []
    config = LoadConfig(workers=2, scheduler="local")
    run = loader.map_run(
        STRAGGLER_RUN, loader._identity, config, progress=lambda *a: seen.append(a)
    )
    assert seen == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]
    assert run.rank_ids == [0, 1, 2, 3]


# ---- fsobs run: logs, progress, failure report (no torchrun: see tests/integration/workload) ----
def test_the_ranks_run_through_the_log_wrapper():
    """Each rank gets only the run directory: it reads the job from its job.json."""
    config = LaunchConfig(world_size=2, out=Path("/x/run"))
    cmd = launch.torchrun_command(config)
    assert cmd[cmd.index("-m") + 1] == "torch.distributed.run"
    assert "--standalone" in cmd and "--local-addr=127.0.0.1" in cmd
    wrapper = cmd.index("fsobs.workload.launch")
    assert cmd[wrapper:] == [
        "fsobs.workload.launch", "--log-dir", "/x/run/logs", "--", "fsobs.workload.train",
        "/x/run",
    ]  # fmt: skip
    multi = LaunchConfig(world_size=2, out=Path("/x/run"), rdzv=("--nnodes", "2"))
    assert "--standalone" not in launch.torchrun_command(multi)


def test_a_rank_writes_everything_to_its_log(tmp_path):
    """Python's and the C libraries' output alike (file descriptors 1 and 2); an exception is
    noted with its time."""
    (tmp_path / "noisy.py").write_text(
        "import os, sys, warnings\n"
        "print('to stdout')\n"
        "warnings.warn('a third-party warning', FutureWarning)\n"
        "os.write(2, b'from C\\n')\n"
        "raise ValueError('boom')\n"
    )
    env = os.environ | {"RANK": "3", "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    cmd = [sys.executable, "-m", "fsobs.workload.launch", "--log-dir", str(tmp_path / "logs")]
    proc = subprocess.run(
        [*cmd, "--", "noisy"], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 1 and proc.stdout == proc.stderr == ""
    log = (tmp_path / "logs" / "rank3.log").read_text()
    for line in ("to stdout", "FutureWarning: a third-party warning", "from C", "ValueError: boom"):
        assert line in log
    error = json.loads((tmp_path / "logs" / "rank3.error.json").read_text())
    assert error["rank"] == 3 and error["error"] == "ValueError: boom"


TORCHRUN_FAILURE = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
fsobs.workload.launch FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-30_19:58:17
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 18310)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_19:58:17
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 18311)
============================================================
"""


def _failed_run(tmp_path: Path, errors: dict[int, int]) -> Path:
    out = tmp_path / "run"
    logs = launch.log_dir(out)
    logs.mkdir(parents=True)
    (logs / launch.AGENT_LOG).write_text(TORCHRUN_FAILURE)
    for rank in (0, 1):
        lines = [f"rank {rank} line {i}" for i in range(30)]
        (logs / f"rank{rank}.log").write_text("\n".join(lines) + "\n")
    for rank, time_ns in errors.items():
        record = {"rank": rank, "time_ns": time_ns, "error": "E"}
        (logs / f"rank{rank}.error.json").write_text(json.dumps(record))
    return out


def test_the_failure_report_names_the_first_failed_rank_and_its_log(tmp_path):
    out = _failed_run(tmp_path, {})
    report = launch.failure_report(out, lines=3)
    assert report.splitlines() == [
        f"rank 1 failed first (exit code 1), then torchrun stopped rank(s) 0; "
        f"last lines of {out / 'logs' / 'rank1.log'}:",
        "  rank 1 line 27",
        "  rank 1 line 28",
        "  rank 1 line 29",
    ]
    # torchrun saw rank 1 exit first, but rank 0 raised first: its exception is the cause
    out = _failed_run(tmp_path / "b", {0: 10, 1: 20})
    assert launch.failed_rank(out) == (0, -15)
    assert launch.failure_report(out, lines=1).endswith("rank0.log:\n  rank 0 line 29")
    # rank 1 died without an exception (killed, os._exit); rank 0 raised after, on the broken
    # connection: torchrun's root cause stands
    assert launch.failed_rank(_failed_run(tmp_path / "c", {0: 10})) == (1, 1)


def test_the_progress_bar_follows_rank_0s_sidecar(tmp_path):
    console = Console(file=io.StringIO(), force_terminal=False, width=100)
    bar = launch._Progress(tmp_path, 4, console)
    sidecar = tmp_path / "steps.rank0.jsonl.partial"
    for step in range(3):
        with open(sidecar, "a") as f:
            f.write(json.dumps({"step": step, "wall_start_ns": 0, "wall_end_ns": 25_000_000}))
            f.write("\n" if step < 2 else "")  # the last line is still being written
        bar.update()
    task = bar._bar.tasks[0]
    assert (task.completed, task.description, task.fields["last"]) == (2, "training", "25 ms")
    sidecar.rename(tmp_path / "steps.rank0.jsonl")  # the rank closed it
    with open(tmp_path / "steps.rank0.jsonl", "a") as f:
        f.write("\n" + json.dumps({"step": 3, "wall_start_ns": 0, "wall_end_ns": 10**6}) + "\n")
    bar.close(0)
    shown = console.file.getvalue()
    assert "fsobs run: done" in shown and "4/4 steps · last 1 ms" in shown


def test_verbose_streams_each_log_line_with_its_source(tmp_path):
    console = Console(file=io.StringIO(), force_terminal=False, width=40)
    follow = launch._Follow(tmp_path, console)
    (tmp_path / "rank0.log").write_text("first\n\nsecond, still being writ")
    (tmp_path / "torchrun.log").write_text("agent line that is longer than forty columns\n")
    follow.update()
    with open(tmp_path / "rank0.log", "a") as log:
        log.write("ten\nlast")
    follow.close(0)
    assert console.file.getvalue().splitlines() == [
        "[rank0] first",
        "[rank0] ",
        "[torchrun] agent line that is longer than forty columns",
        "[rank0] second, still being written",
        "[rank0] last",
    ]


def test_run_verbose_is_its_own_flag_or_the_global_one():
    parse = build_parser().parse_args
    run = ["run", "--world-size", "2", "--out", "x"]
    assert parse([*run, "--verbose"]).verbose and parse(["-v", *run]).verbose
    assert not parse(run).verbose
