"""The N-rank simulator: the truth by hand on a tiny job, the simulate -> analyze round trip
within 1% of every step, run.json, calibration from a measured run, the scale study, CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fsobs.analysis import analyze_path
from fsobs.cli import main
from fsobs.runformat import read_run_json
from fsobs.simulate.schedule import transfers
from fsobs.simulate.simulator import (
    SimConfig,
    calibrate,
    simulate,
    truth_error,
    truth_frame,
    write_run,
)
from fsobs.simulate.study import scale_curve, toggle_study

ROOT = Path(__file__).resolve().parents[1]
SMALL = SimConfig(world_size=4, steps=3, seed=1, batch_per_rank=8, host_sigma=0.5)


def test_truth_of_a_tiny_job_by_hand() -> None:
    sched = simulate(SMALL)
    t, tr = sched.t, sched.truth
    x = transfers(SMALL, np.array([[p.sum() for p in step] for step in sched.lengths]))
    g = SMALL.launch_gap_ns
    for i in range(SMALL.steps):
        a1, a2 = t["k1_end"][i], t["k2_end"][i]
        # every rank waits from its own arrival to the last one's, at C1 and at C2
        assert (tr["straggler_wait"][i] == (a1.max() - a1) + (a2.max() - a2)).all()
        assert (tr["exposed_comm"][i] == 2 * x["X1"][i] + x["X2"][i]).all()
        assert (tr["other"][i] == SMALL.memcpy_ns).all()
        # three launch gaps, plus the data loading before the next step
        loading = t["next_t0"][i] - t["k4_end"][i] if i < SMALL.steps - 1 else 0
        assert (tr["host_idle"][i] == 3 * g + loading).all()
        # the kernels under the input-dist prefetch run gamma times slower
        assert (tr["contention"][i] > 0).all()
    total = sum(tr[k] for k in ("busy", "straggler_wait", "exposed_comm", "host_idle", "other"))
    assert (total == tr["window"]).all()
    # the last rank to arrive never waits at C1
    assert (tr["straggler_wait"].min(axis=1) >= 0).all()


def test_priority_overlap_truth_by_hand() -> None:
    sched = simulate(SMALL, {"priority_overlap", "sm_free"})
    t, tr = sched.t, sched.truth
    x = transfers(SMALL, np.array([[p.sum() for p in step] for step in sched.lengths]))
    g = SMALL.launch_gap_ns
    for i in range(SMALL.steps):
        upd_end = t["upd_start"][i] + sched.upd_dur[i].sum()
        e2 = t["E3"][i] + x["X2"][i]
        assert t["E2"][i] == e2  # the dense transfer follows the embedding one
        expected = 2 * x["X1"][i] + min(x["X2"][i], g) + max(0, e2 - upd_end)
        assert (tr["exposed_comm"][i] == expected).all()
    # sm_free: the prefetch no longer slows the kernels under it; only the dense one does
    assert (sched.chunk_dur == SMALL.chunk_ns).all()


@pytest.mark.parametrize(
    "toggles", [(), ("balance",), ("priority_overlap",), ("balance", "priority_overlap", "sm_free")]
)
def test_round_trip_within_one_percent(tmp_path: Path, toggles: tuple[str, ...]) -> None:
    cfg = replace(SMALL, world_size=12, ranks_per_host=8)  # two hosts: clocks aligned
    sched = simulate(cfg, toggles)
    write_run(sched, tmp_path, workers=2)
    analysis = analyze_path(tmp_path)
    err = truth_error(truth_frame(sched), analysis.steps)
    assert len(err) == 12 * 3
    assert err.drop(columns=["rank", "step"]).to_numpy().max() <= 0.01
    assert analysis.collectives.problems.empty
    truth = json.loads((tmp_path / "truth.json").read_text())
    assert set(truth["steps"][0]) >= {
        "rank",
        "step",
        "busy_ms",
        "straggler_wait_ms",
        "exposed_comm_ms",
        "host_idle_ms",
        "other_ms",
    }


def test_run_json_is_the_run_format(tmp_path: Path) -> None:
    write_run(simulate(SMALL, {"balance"}), tmp_path, workers=1)
    meta = json.loads((tmp_path / "run.json").read_text())
    assert meta["simulated"] is True and meta["status"] == "complete"
    assert meta["toggles"]["balance"]["applied"] is True
    assert read_run_json(tmp_path).to_json() == meta  # the strict reader takes it whole
    lines = (tmp_path / "steps.rank0.jsonl").read_text().splitlines()
    assert len(lines) == SMALL.steps and len(json.loads(lines[0])["seq_lengths"]) == 8


def test_same_seed_same_batches_under_every_policy() -> None:
    a, b = simulate(SMALL), simulate(SMALL, {"balance"})
    for step_a, step_b in zip(a.lengths, b.lengths, strict=True):
        assert sorted(np.concatenate(step_a)) == sorted(np.concatenate(step_b))
    assert b.imbalance_after.mean() < a.imbalance_after.mean()


def test_calibrate_from_a_measured_run() -> None:
    analysis = analyze_path(ROOT / "traces" / "ab_balance_2rank" / "control")
    cfg = calibrate(analysis)
    assert cfg.world_size == 2 and cfg.batch_per_rank == 32
    # every sample of every logged step, traced or not
    assert len(cfg.lengths) == int(analysis.run.sidecar["num_samples"].sum())
    assert cfg.noise_sigma > 0 and cfg.cost.b > 0 and cfg.partition is not None
    assert "calibrated from" in cfg.source
    sched = simulate(replace(cfg, world_size=8, steps=2))
    assert sched.truth["busy"].mean() / 1e6 == pytest.approx(
        analysis.steps["busy_ms"].mean(), rel=0.5
    )


def test_scale_study() -> None:
    cfg = replace(SMALL, steps=4)
    curve = scale_curve(cfg, world_sizes=(4, 16), seeds=(0, 1))
    assert len(curve) == 4 and (curve["bubble_ratio"] > 0).all()
    study = toggle_study(cfg, world_size=8, seeds=(0,))
    assert study["toggles"].iloc[0] == "baseline" and len(study) == 8
    by = study.set_index("toggles")["bubble_reduction"]
    assert by["baseline"] == 0 and by["balance"] > 0.2
    assert isinstance(study, pd.DataFrame)


def test_cli_simulate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sim"
    assert (
        main(
            [
                "simulate",
                "--world-size",
                "4",
                "--steps",
                "2",
                "--out",
                str(out),
                "--toggles",
                "balance",
                "--workers",
                "1",
            ]
        )
        == 0
    )
    assert "truth: bubble" in capsys.readouterr().out
    assert {"run.json", "truth.json", "rank3.trace.json.gz", "steps.rank3.jsonl"} <= {
        p.name for p in out.iterdir()
    }
    assert main(["analyze", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)
    assert main(["simulate", "--world-size", "4", "--out", str(out)]) == 2  # not empty
    assert main(["simulate", "--world-size", "1", "--out", str(tmp_path / "x")]) == 2
    assert (
        main(
            [
                "simulate",
                "--world-size",
                "2",
                "--out",
                str(tmp_path / "y"),
                "--calibrate",
                str(tmp_path / "missing"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("fsobs: error:") == 3 and err.count("\n") == 3
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--world-size", "2", "--out", str(tmp_path / "z"), "--toggles", "x"])
    assert exc.value.code == 2
