"""Simulated jobs that degrade at a known step (a slow rank, a data shift, GC pauses), written in
the live layout, analyzed window by window, and the alerts they raise: from the first windows
after the step on, never before, with the slow rank told from the data."""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fsobs.analysis import analyze_path
from fsobs.cli import main
from fsobs.live.alerts import AlertConfig, evaluate
from fsobs.live.model import Alert, WindowEntry
from fsobs.live.state import LiveRun
from fsobs.runformat import read_sidecars
from fsobs.runformat.windows import WindowSchedule, list_windows, read_schedule
from fsobs.simulate.schedule import Schedule
from fsobs.simulate.simulator import (
    SimConfig,
    SimWindows,
    simulate,
    truth_error,
    truth_frame,
    write_run,
)

# 40 steps of 4 ranks; data even enough (lengths sigma 0.2) that, before step 20, the
# straggler moves from step to step and the windows look alike
BASE = SimConfig(
    world_size=4, steps=40, seed=1, batch_per_rank=8, speed_sigma=0.0, length_sigma=0.2
)
S = 20
SLOW = replace(BASE, slow_rank=2, slow_from=S, slow_factor=2.5)
SHIFT = replace(BASE, shift_rank=1, shift_from=S, shift_factor=2.0)
GC = replace(BASE, gc_rank=3, gc_from=S, gc_ms=30.0)
# a window of 4 steps every 5, after a warm-up step: w00000001 (steps 1-4), ..., w00000036
LIVE = SimWindows(schedule=WindowSchedule(every=5, wait=0, warmup=1, active=4))
FIRSTS = [first for first, _ in LIVE.spans(BASE.steps)]
FIRST_AFTER = 21
"""The first window after step S."""
RECENT_STEPS = 10


def _index(run: Path) -> tuple[WindowEntry, ...]:
    """The run's windows as a live view lists them, each closed one analyzed alone with the
    sidecar lines of its steps (:mod:`fsobs.live.index`)."""
    return LiveRun(run).poll().windows


def _recent(sidecar: pd.DataFrame, last_step: int) -> pd.DataFrame:
    return sidecar[sidecar["step"].between(last_step - RECENT_STEPS + 1, last_step)]


def _replay(run: Path, config: AlertConfig) -> list[dict[str, Alert]]:
    """The alerts as a live view sees them after each window closes: the windows so far and
    the sidecar lines up to that window's last step."""
    index, sidecar = _index(run), read_sidecars(run)
    assert sidecar is not None
    out = []
    for k, window in enumerate(index):
        alerts = evaluate(index[: k + 1], _recent(sidecar, window.last_step), config)
        out.append({a.name: a for a in alerts})
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The slow-rank and the data-shift runs, in the live layout."""
    root = tmp_path_factory.mktemp("degrade")
    for name, cfg in (("slow", SLOW), ("shift", SHIFT)):
        write_run(simulate(cfg), root / name, workers=1, windows=LIVE)
    return {name: root / name for name in ("slow", "shift")}


@pytest.fixture(scope="module")
def replays(runs: dict[str, Path]) -> dict[str, list[dict[str, Alert]]]:
    """Both runs replayed under the default thresholds (their windows analyzed once: later
    polls read each window's summary.json)."""
    return {name: _replay(path, AlertConfig()) for name, path in runs.items()}


@pytest.mark.parametrize(("name", "rank", "cause"), [("slow", 2, "node"), ("shift", 1, "data")])
def test_alerts_fire_after_the_degradation_and_not_before(
    replays: dict[str, list[dict[str, Alert]]], name: str, rank: int, cause: str
) -> None:
    """With the default thresholds: the bubble ratio and the straggler wait of every window
    from step 20 on stand above 1.5x the median of the earlier ones (at most 3 of the 7
    earlier windows are degraded, so the median is a healthy one); late_rank needs 60% of the 12
    steps of the 3 recent windows: a rank late in every step of two of them has 8 of 12."""
    replay = replays[name]
    assert len(replay) == len(FIRSTS) == 8
    for first, alerts in zip(FIRSTS, replay, strict=True):
        after = first >= S
        for rule in ("bubble_ratio_up", "straggler_wait_up"):
            assert alerts[rule].firing is after, (first, alerts[rule].message)
        late = alerts["late_rank"]
        if first < S:  # no recent window after S
            assert not late.firing, late.message
        if first > FIRST_AFTER:  # two or three recent windows after S
            assert late.firing and late.rank == rank and late.cause == cause, late.message
        assert not alerts["gc_storm"].firing and not alerts["window_missing"].firing
    # the first window after S is named, with its steps
    message = replay[FIRSTS.index(FIRST_AFTER)]["straggler_wait_up"].message
    assert "w00000021 (steps 21-24)" in message


def test_the_late_ranks_cause_says_which_evidence_decided(
    replays: dict[str, list[dict[str, Alert]]],
) -> None:
    slow = replays["slow"][-1]["late_rank"]
    assert "of its wait" in slow.message and "the other ranks' median" in slow.message
    assert slow.evidence["causes"]["data"] < 0.5
    shift = replays["shift"][-1]["late_rank"]
    assert "the data caused" in shift.message and shift.evidence["causes"]["data"] >= 0.5
    # the data shift doubles rank 1's lengths: its est_cost (quadratic in length) more than
    # doubles against the others'
    assert shift.evidence["est_cost_ratio"] > 2


@pytest.mark.parametrize(("name", "rank", "cause"), [("slow", 2, "node"), ("shift", 1, "data")])
def test_a_live_view_of_the_finished_run_shows_the_alerts(
    runs: dict[str, Path], name: str, rank: int, cause: str
) -> None:
    state = LiveRun(runs[name]).poll()
    assert state.status == "complete"
    assert [a.name for a in state.firing] == ["bubble_ratio_up", "straggler_wait_up", "late_rank"]
    late = state.firing[-1]
    assert (late.rank, late.cause, late.window) == (rank, cause, "w00000036")
    assert state.late_rank is not None and state.late_rank.rank == rank


def test_a_gc_storm_fires_from_the_step_the_pauses_start(tmp_path: Path) -> None:
    """30 ms of GC per step on rank 3 from step 20: in each window of 10 recent steps, its
    share of the wall time is 30 ms x (steps after 20) over that wall time."""
    write_run(simulate(GC), tmp_path, workers=1)
    sidecar = read_sidecars(tmp_path)
    assert sidecar is not None
    config = AlertConfig()
    for last in range(RECENT_STEPS - 1, GC.steps):
        recent = _recent(sidecar, last)
        mine = recent[recent["rank"] == 3]
        share = 30.0 * int((mine["step"] >= S).sum()) / mine["wall_ms"].sum()
        alert = next(a for a in evaluate([], recent, config) if a.name == "gc_storm")
        assert alert.firing is bool(share >= config.gc_share), (last, alert.message)
        assert (alert.rank == 3) is alert.firing
    assert alert.firing and f"steps {GC.steps - RECENT_STEPS}-{GC.steps - 1}" in alert.message


def test_windows_some_or_every_rank_did_not_publish(tmp_path: Path) -> None:
    """Rank 1 leaves w00000011 unpublished, every rank w00000006 (no folder at all: the live
    view lists it from windows/schedule.json)."""
    gone = ((11, 1), *((6, r) for r in range(4)))
    live = replace(LIVE, unpublished=gone)
    write_run(simulate(replace(BASE, steps=20)), tmp_path, workers=1, windows=live)
    folder = tmp_path / "windows" / "w00000011"
    assert sorted(p.name for p in folder.iterdir() if "rank1" in p.name) == []
    assert not (tmp_path / "windows" / "w00000006").exists()
    index = _index(tmp_path)
    assert [w.state for w in index] == ["closed", "missing", "missing", "closed"]
    sidecar = read_sidecars(tmp_path)
    assert sidecar is not None
    alert = evaluate(index, _recent(sidecar, 19), AlertConfig())[-1]
    assert alert.firing and alert.rank is None and alert.window == "w00000011"
    assert alert.message == (
        "2 windows missing: w00000006 (steps 6-9): ranks 0, 1, 2, 3 did not publish it; "
        "w00000011 (steps 11-14): rank 1 did not publish it"
    )


# -- the simulator's degradation, by hand ------------------------------------------------------


def test_a_slow_rank_runs_its_compute_slow_factor_times_longer_from_its_step() -> None:
    """The same draws with and without the slow rank: its data-dependent busy time (busy less
    the fixed kernels, the same on every rank) is 2.5x from step 20, within rounding; the
    other ranks' and the steps before are the same, and so is the data."""
    cfg = replace(BASE, steps=24)
    base, slow = simulate(cfg), simulate(replace(cfg, slow_rank=2, slow_from=S, slow_factor=2.5))

    def compute(sched: Schedule) -> np.ndarray:
        fixed = sched.chunk_dur.sum(axis=1) + sched.upd_dur.sum(axis=1) + cfg.optimizer_ns
        return np.asarray(sched.truth["busy"] - fixed[:, None], np.float64)

    expected = compute(base)
    expected[S:, 2] *= 2.5
    assert np.allclose(compute(slow), expected, atol=3)
    assert np.array_equal(slow.est_cost, base.est_cost)


def test_a_data_shift_lengthens_the_ranks_samples_and_its_est_cost(tmp_path: Path) -> None:
    cfg = replace(BASE, steps=24)
    base = simulate(cfg)
    shifted = simulate(replace(cfg, shift_rank=1, shift_from=S, shift_factor=2.0))
    for i in range(cfg.steps):
        for r in range(cfg.world_size):
            want = base.lengths[i][r] * (2 if (i >= S and r == 1) else 1)
            assert np.array_equal(shifted.lengths[i][r], want)
    write_run(shifted, tmp_path, workers=1)
    sidecar = read_sidecars(tmp_path)
    assert sidecar is not None
    row = sidecar[(sidecar["rank"] == 1) & (sidecar["step"] == S)].iloc[0]
    assert row["est_cost"] == pytest.approx(float(cfg.cost(shifted.lengths[S][1]).sum()))
    est = shifted.est_cost[S]
    assert row["imbalance_after"] == pytest.approx(est.max() / est.mean())


def test_gc_pauses_are_host_time_and_sidecar_fields(tmp_path: Path) -> None:
    cfg = replace(BASE, steps=24)
    base, gc = simulate(cfg), simulate(replace(cfg, gc_rank=3, gc_from=S, gc_ms=30.0))
    # rank 3's embedding lookup starts 30 ms later: GPU idle on it (host), the others wait
    moved = gc.t["k1_end"] - base.t["k1_end"]
    assert (moved[S:, 3] - moved[S:, 0] == 30_000_000).all() and (moved[:S] == 0).all()
    write_run(gc, tmp_path, workers=1)
    sidecar = read_sidecars(tmp_path)
    assert sidecar is not None
    gc_ms = sidecar.set_index(["rank", "step"])["gc_ms"]
    assert gc_ms[(3, S)] == 30.0 and gc_ms[(3, S - 1)] == 0.0 and gc_ms[(0, S)] == 0.0
    assert sidecar.loc[sidecar["gc_ms"] > 0, "gc_count"].eq(1).all()
    # the analysis finds the pause as rank 3's host idle and the others' wait (within 1% of
    # each step, as for any simulated run)
    analysis = analyze_path(tmp_path)
    error = truth_error(truth_frame(gc), analysis.steps).drop(columns=["rank", "step"])
    assert error.to_numpy().max() < 0.01
    host = analysis.steps.set_index(["rank", "step"])["host_idle_ms"]
    assert host[(3, S)] - host[(0, S)] == pytest.approx(30.0, abs=0.5)


def test_truth_json_records_the_degradation_and_the_layout(tmp_path: Path) -> None:
    cfg = replace(SLOW, steps=24, shift_from=22, shift_factor=1.5)
    write_run(simulate(cfg), tmp_path, workers=1, windows=LIVE)
    truth = json.loads((tmp_path / "truth.json").read_text())
    assert truth["degradation"] == {
        "slow": {"rank": 2, "from_step": S, "factor": 2.5},
        "shift": {"rank": None, "from_step": 22, "factor": 1.5},
        "gc": None,
    }
    schedule = {"every": 5, "wait": 0, "warmup": 1, "active": 4}
    assert truth["windows"] == {"schedule": schedule, "unpublished": []}


def test_the_live_layout(tmp_path: Path) -> None:
    """A window of 3 steps every 4 after a warm-up step, over 10 steps: w1 (1-3), w5 (5-7),
    and none from 9 (the run ends in it); each rank's trace holds its window's steps only, the
    top-level sidecars every step, and the top level has no trace."""
    cfg = replace(BASE, steps=10)
    schedule = WindowSchedule(every=4, wait=0, warmup=1, active=3)
    write_run(simulate(cfg), tmp_path, workers=1, windows=SimWindows(schedule=schedule))
    assert read_schedule(tmp_path) == schedule
    assert not list(tmp_path.glob("*.trace.json.gz"))
    folders = list_windows(tmp_path)
    assert [(f.wid, sorted(f.notes)) for f in folders] == [
        (f"w{s:08d}", [0, 1, 2, 3]) for s in (1, 5)
    ]
    for folder, (first, last) in zip(folders, [(1, 3), (5, 7)], strict=True):
        note = folder.notes[2]
        assert (note.first_step, note.last_step, note.trigger) == (first, last, "schedule")
        text = gzip.decompress((folder.path / "rank2.trace.json.gz").read_bytes()).decode()
        steps = sorted(int(s) for s in re.findall(r"ProfilerStep#(\d+)", text))
        assert steps == list(range(first, last + 1))
    sidecar = read_sidecars(tmp_path)
    assert sidecar is not None and sorted(set(sidecar["step"])) == list(range(10))
    # a window folder is a run of its own for fsobs analyze (no sidecars yet)
    assert main(["analyze", str(folders[1].path)]) == 0


def test_cli_simulate_degradation_and_windows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["simulate", "--world-size", "4", "--steps", "12", "--workers", "1"]
    flags = ["--slow-rank", "2", "--slow-from", "6", "--slow-factor", "1.5"]
    flags += ["--shift-from", "8", "--shift-factor", "2", "--gc-rank", "1", "--gc-ms", "3"]
    flags += ["--window-every", "4", "--window-steps", "3", "--unpublished", "5:1"]
    assert main([*args, *flags, "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "rank 2 1.5x slower from step 6" in out
    assert "every rank's samples 2x longer from step 8" in out
    assert "rank 1 pauses 3 ms for GC from step 0" in out
    assert "rank 1 leaves w00000005 unpublished" in out
    assert "fsobs analyze " + str(tmp_path / "run" / "windows" / "w00000001") in out
    truth = json.loads((tmp_path / "run" / "truth.json").read_text())
    assert truth["degradation"]["gc"] == {"rank": 1, "from_step": 0, "gc_ms": 3.0}
    assert truth["windows"]["unpublished"] == [[5, 1]]
    assert not (tmp_path / "run" / "windows" / "w00000005" / "window.rank1.json").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--slow-from", "3"], "bad simulate option: slow_from: needs slow_rank"),
        (["--slow-rank", "4"], "slow_rank: must be a rank in [0, 4), got 4"),
        (["--shift-from", "12"], "shift_from: must be a step in [0, 12), got 12"),
        (["--gc-rank", "0"], "gc_ms: must be > 0 with gc_rank"),
        (["--window-every", "4"], "--window-every and --window-steps go together"),
        (["--window-every", "3", "--window-steps", "3"], "every: a cycle of 3 steps cannot"),
        (
            ["--window-every", "20", "--window-steps", "15"],
            "schedule: no window ends within the run's 12 steps",
        ),
        (["--unpublished", "8:1"], "--unpublished needs --window-every and --window-steps"),
        (
            ["--window-every", "4", "--window-steps", "2", "--unpublished", "4:1"],
            "unpublished: (4, 1) names no window's first step and rank",
        ),
    ],
)
def test_cli_simulate_degradation_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    args = ["simulate", "--world-size", "4", "--steps", "12", "--out", str(tmp_path / "x")]
    assert main([*args, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"slow_rank": 0, "slow_factor": 0.0}, "slow_factor"),
        ({"slow_rank": 0}, "slow_factor"),  # 1: no slower
        ({"shift_from": 1}, "shift_factor"),
        ({"shift_from": 1, "shift_factor": -1.0}, "shift_factor"),
        ({"shift_rank": 1}, "shift_rank"),
        ({"gc_from": 2}, "gc_from"),
        ({"gc_ms": 1.0}, "gc_ms"),
        ({"gc_rank": -1, "gc_ms": 1.0}, "gc_rank"),
    ],
)
def test_sim_config_names_the_bad_degradation_field(fields: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        SimConfig(world_size=4, steps=10, **fields)  # type: ignore[arg-type]
