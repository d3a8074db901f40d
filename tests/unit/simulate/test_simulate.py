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
from fsobs.runformat import read_run_json, read_sidecars
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
from optim.balance import CostModel

ROOT = Path(__file__).resolve().parents[3]
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


def test_pec_schedule_by_hand() -> None:
    """PEC on two identical ranks, every time worked out from the module docstring's rule:
    100-token samples at 1 µs per token, 2 per rank (compute 200 µs: K1 30 µs, K2 170 µs),
    X0 = 20 µs + 1 ns x 200 / 2 = 20.1 µs, X1 = 20 µs + 10 ns x 200 / 2 = 21 µs,
    X2 = 30 µs + 5 ms / 2 = 2.53 ms; overlapped share 0 in step 0, 0.75 in step 1."""
    cfg = SimConfig(
        world_size=2,
        steps=2,
        batch_per_rank=2,
        lengths=(100,),
        cost=CostModel(c0=0.0, a=1000.0, b=0.0),
        speed_sigma=0.0,
        noise_sigma=0.0,
        host_sigma=0.0,
    )
    sched = simulate(cfg, {"priority_overlap"})
    t, tr = sched.t, sched.truth
    t0 = t["t0"][:, 0]
    # step 0: F moves the 1 µs floor (nothing overlaps yet), then the masks (X0 each)
    assert t["E1"][0] - t0[0] == 200_000 + 30_000 + 1_000 + 2 * 20_100
    # C0, and no deferred gradient behind it
    assert t["EG"][0] == t["E0"][0]
    # two prologue kernels, the first under the side channel (x1.3), no re-lookup in step 0
    assert list(sched.chunk_dur[0]) == [130_000, 100_000]
    assert t["k2_end"][0, 0] - t["E1"][0] == 10_000 + 230_000 + 170_000
    # B (1 µs), then the all-reduce behind it and the ahead lookup of step 1 (0.25 x 21 µs)
    # beside it, under 20 slowed update kernels
    assert t["E2"][0] - t["k2_end"][0, 0] == 1_000 + 2_530_000
    assert t["EN"][0] - t["E3"][0] == 5_250
    assert (sched.upd_dur[0] == 130_000).all()
    # step 1: F = 0.75 x 21 µs; the deferred gradient (all of step 0's: 21 µs) lands under the
    # prologue; the re-lookup 2 x 1 x 30 µs; B = 15.75 µs
    assert t["E1"][1] - t0[1] == 230_000 + 15_750 + 2 * 20_100
    assert t["EG"][1] - t["E0"][1] == 21_000 and t["EN"][1] == t["E3"][1]
    assert t["k2_end"][1, 0] - t["E1"][1] == 10_000 + 230_000 + 60_000 + 170_000
    expected = {
        # exposed: F + masks, B, the launch gap under the all-reduce; the update outlasts it
        "exposed_comm": [41_200 + 1_000 + 10_000, 55_950 + 15_750 + 10_000],
        "busy": [200_000 + 230_000 + 2_600_000 + 1_000_000, 260_000 + 230_000 + 3_600_000],
        "straggler_wait": [0, 0],
        "other": [200_000, 200_000],
        # two launch gaps, and the 0.5 ms data loading before step 1
        "host_idle": [520_000, 20_000],
        "contention": [21 * 30_000, 21 * 30_000],
    }
    for name, per_step in expected.items():
        assert tr[name].tolist() == [[v, v] for v in per_step], name
    # the baseline of the same job: every transfer exposed
    base = simulate(cfg).truth["exposed_comm"]
    assert base.tolist() == [[2 * 21_000 + 2_530_000] * 2] * 2
    assert sched.overlap.tolist() == [0.0, 0.75]


def test_pec_ranges_give_pec_roles(tmp_path: Path) -> None:
    sched = simulate(replace(SMALL, steps=4), {"priority_overlap"})
    write_run(sched, tmp_path, workers=1)
    colls = analyze_path(tmp_path).collectives.instances
    colls = colls[colls["rank"] == 1]
    per_step = colls[colls["step"] == 2]["role"].value_counts().to_dict()
    # F, two masks, G, N, B; C0 (the input dist) and the dense all-reduce keep their roles
    assert per_step == {
        "pec_mask": 2,
        "pec_overlapped": 1,
        "pec_deferred_grad": 1,
        "pec_ahead": 1,
        "pec_overlapped_grad": 1,
        "embedding": 1,
        "dense": 1,
    }
    first, last = (colls[colls["step"] == s]["role"].tolist() for s in (0, 3))
    assert "pec_deferred_grad" not in first and "pec_ahead" not in last
    sidecar = read_sidecars(tmp_path)
    assert {tuple(d.values()) for d in sidecar[sidecar["step"] == 2]["id_overlap"]} == {
        (0.75, 0.75)
    }


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
