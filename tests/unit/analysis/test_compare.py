"""A/B comparison (docs/design.md §5 "Bubble reduction") and ``fsobs compare`` / ``dashboard``.

Two kinds of input:

- analyses whose bubble table is written by hand (``_analysis``; the KPIs come from the real
  :func:`fsobs.analysis.kpis`), for exact reductions, the bootstrap and the batch checks;
- hand-built two-rank GPU runs on disk (``write_allreduce_run`` of tests/support/kineto.py),
analyzed
  end to end, for the reduction through the whole pipeline and for the CLI.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from fsobs.analysis import Analysis, analyze_path, compare, kpis
from fsobs.analysis.bubbles.coverage import WINDOW_COLUMNS
from fsobs.analysis.bubbles.store import BubbleStore
from fsobs.analysis.bubbles.tables import caused_table
from fsobs.analysis.collectives.matching import Collectives
from fsobs.analysis.comparison.ab import batch_check, bootstrap_reduction
from fsobs.cli import main
from fsobs.cli.dashboard import dashboard_app
from fsobs.report import compare_json
from fsobs.report.comparison import render_comparison
from fsobs.runformat import RunMeta
from fsobs.trace.schema import Run
from tests.support.kineto import REFERENCE, write_allreduce_run

# ------------------------------------------------------------------ hand-written bubble tables


def _steps(rows: list[tuple[int, int, float, float, float, float, float]]) -> pd.DataFrame:
    """``(rank, step, window, busy, straggler_wait, exposed_comm, host_idle)`` in ms ->
    a table shaped like ``bubble_table`` (other = the rest of the window)."""
    out = []
    for rank, step_n, window, busy, wait, exposed, idle in rows:
        out.append(
            {
                "rank": rank,
                "step": step_n,
                "window_ms": window,
                "busy_ms": busy,
                "bubble_ms": window - busy,
                "straggler_wait_ms": wait,
                "exposed_comm_ms": exposed,
                "unattributed_comm_ms": 0.0,
                "host_idle_ms": idle,
                "other_ms": window - busy - wait - exposed - idle,
                "contention_ms": 0.0,
            }
        )
    return pd.DataFrame(out)


def _analysis(
    steps: pd.DataFrame,
    *,
    name: str = "run",
    world_size: int | None = None,
    meta: dict[str, Any] | None = None,
    sidecar: pd.DataFrame | None = None,
    device: str = "cpu",
    step_source: str = "ProfilerStep",
) -> Analysis:
    """An Analysis around a hand-written bubble table (the fields compare does not read are
    left empty; each rank only says its ``device`` and ``step_source``); ``meta`` is the
    content of its run.json."""
    ranks = sorted(set(steps["rank"]))
    colls = Collectives(pd.DataFrame(), pd.DataFrame(), dict.fromkeys(ranks, 0))
    run = Run(
        path=Path("/runs") / name,
        world_size=world_size or len(ranks),
        ranks={r: SimpleNamespace(device=device, step_source=step_source) for r in ranks},
        meta=None if meta is None else RunMeta.from_json(meta),
        sidecar=sidecar,
    )
    return Analysis(
        run=run,  # type: ignore[arg-type]
        overview=pd.DataFrame(),
        collectives=colls,
        bubbles=BubbleStore(),
        steps=steps,
        caused=caused_table([]),
        stragglers=None,  # type: ignore[arg-type]
        attribution=None,
        causes=None,
        summary=kpis(steps, colls),
        roles=pd.DataFrame(
            columns=["rank", "step", "role", "straggler_wait_ms", "exposed_comm_ms"]
        ),
        hta=None,
        windows=pd.DataFrame(columns=list(WINDOW_COLUMNS)),
    )


def _uniform(per_rank: list[tuple[float, float, float, float, float]], num_steps: int) -> list:
    """The same ``(window, busy, wait, exposed, idle)`` per rank in every step."""
    return [(r, s, *vals) for s in range(num_steps) for r, vals in enumerate(per_rank)]


# control: rank 0 waits 50 ms for rank 1 each step; test: the work is split evenly
CONTROL = _uniform([(100, 40, 50, 10, 0), (100, 90, 0, 10, 0)], 4)
TEST = _uniform([(70, 60, 0, 10, 0), (70, 70, 0, 0, 0)], 4)


def test_exact_reduction_per_class_and_per_rank():
    """Bubble per rank and step: control (60, 10) -> 35 ms; test (10, 0) -> 5 ms."""
    c = compare(_analysis(_steps(CONTROL), name="a"), _analysis(_steps(TEST), name="b"))
    assert (c.control_name, c.test_name) == ("a", "b")
    assert c.bubble_reduction == pytest.approx(1 - 5 / 35)
    # every step has the same bubble: every resample gives the point estimate
    assert c.bubble_reduction_ci == pytest.approx((1 - 5 / 35, 1 - 5 / 35))
    assert c.by_class["straggler_wait"] == pytest.approx(1.0)  # 25 -> 0
    assert c.by_class["exposed_comm"] == pytest.approx(1 - 5 / 10)  # 10 -> 5
    assert math.isnan(c.by_class["host_idle"]) and math.isnan(c.by_class["other"])  # 0 in control
    # per class too: constant per-step values give a zero-width interval; ~0 classes give NaN
    assert c.by_class_ci["straggler_wait"] == pytest.approx((1.0, 1.0))
    assert c.by_class_ci["exposed_comm"] == pytest.approx((0.5, 0.5))
    assert all(math.isnan(v) for v in c.by_class_ci["host_idle"])
    assert c.step_time_ratio == pytest.approx(70 / 100)
    assert c.kpis.loc["bubble_ms_per_step"].tolist() == pytest.approx([35, 5, -30, 5 / 35])
    assert c.kpis.loc["bubble_ratio", "control"] == pytest.approx(70 / 200)
    assert c.kpis.loc["bubble_ratio", "test"] == pytest.approx(10 / 140)
    assert math.isnan(c.kpis.loc["host_idle_ms_per_step", "ratio"])
    assert list(c.kpis.index) == list(_analysis(_steps(CONTROL)).summary)
    per_rank = c.per_rank.set_index("rank")
    assert per_rank["bubble_ms_control"].tolist() == [60, 10]
    assert per_rank["bubble_ms_test"].tolist() == [10, 0]
    assert per_rank["bubble_ms_delta"].tolist() == [-50, -10]
    assert per_rank["straggler_wait_ms_delta"].tolist() == [-50, 0]
    times = c.step_times.groupby("run")["step_time_ms"].agg(list)
    assert times.to_dict() == {"control": [100.0] * 4, "test": [70.0] * 4}
    assert c.same_batches is None


def test_a_run_against_itself():
    bubbles = np.random.default_rng(1).uniform(0, 40, size=(30, 2))  # (step, rank)
    a = _analysis(_steps([(r, s, 100, 100 - b, b, 0, 0) for (s, r), b in np.ndenumerate(bubbles)]))
    c = compare(a, a)
    assert c.bubble_reduction == 0.0
    lo, hi = c.bubble_reduction_ci
    assert lo < 0 < hi
    assert c.step_time_ratio == 1.0
    assert (c.kpis["delta"] == 0).all()
    assert (c.kpis["ratio"].dropna() == 1).all()


def test_ci_contains_the_estimate_and_narrows_with_more_steps():
    rng = np.random.default_rng(7)

    def run(num_steps: int, bubble_lo: float, bubble_hi: float) -> Analysis:
        bubbles = rng.uniform(bubble_lo, bubble_hi, size=num_steps)
        return _analysis(_steps([(0, s, 100, 100 - b, b, 0, 0) for s, b in enumerate(bubbles)]))

    widths = []
    for num_steps in (8, 128):
        c = compare(run(num_steps, 20, 40), run(num_steps, 5, 15))
        lo, hi = c.bubble_reduction_ci
        assert lo < c.bubble_reduction < hi
        # all of the bubble is straggler wait here, so its class interval is the same one
        assert c.by_class_ci["straggler_wait"] == pytest.approx((lo, hi))
        widths.append(hi - lo)
    assert widths[1] < widths[0] / 2  # ~1/sqrt(16) of it


def test_ci_is_deterministic_and_follows_the_seed():
    control = _analysis(_steps([(0, s, 100, 100 - b, b, 0, 0) for s, b in enumerate([9, 30, 21])]))
    test = _analysis(_steps([(0, s, 100, 100 - b, b, 0, 0) for s, b in enumerate([4, 11, 6])]))
    first = compare(control, test).bubble_reduction_ci
    assert compare(control, test).bubble_reduction_ci == first
    assert compare(control, test, seed=1).bubble_reduction_ci != first


def test_bootstrap_percentiles_on_a_two_step_run():
    """Control steps (10, 30): a resample's mean is 10, 20 or 30 with p = 1/4, 1/2, 1/4; the
    test's steps are both 5, so the reductions are 1/2, 3/4, 5/6 and the 5% / 95% percentiles
    are the extremes."""
    lo, hi = bootstrap_reduction(np.array([10.0, 30.0]), np.array([5.0, 5.0]), confidence=0.9)
    assert (lo, hi) == pytest.approx((0.5, 5 / 6))
    assert all(math.isnan(v) for v in bootstrap_reduction(np.array([]), np.array([1.0])))


@pytest.mark.parametrize(("control", "test"), [([10.0], [5.0, 6.0]), ([10.0, 30.0], [5.0])])
def test_no_interval_from_one_step_on_a_side(control, test):
    """Every resample of one step is that step: an interval of width 0 on that side, which
    says nothing (issue 36: 1 whole-trace window against 6 steps printed a CI of 0.5 points)."""
    assert all(math.isnan(v) for v in bootstrap_reduction(np.array(control), np.array(test)))


def test_paired_bootstrap_cancels_what_the_steps_share():
    """Test = half the control on every step: each paired resample gives exactly 50% less,
    while resampling the runs independently mixes slow and fast steps."""
    control = np.array([10.0, 20.0, 40.0, 80.0])
    paired = bootstrap_reduction(control, control / 2, paired=True)
    assert paired == pytest.approx((0.5, 0.5))
    lo, hi = bootstrap_reduction(control, control / 2)
    assert lo < 0.2 and hi > 0.7
    with pytest.raises(ValueError, match="paired"):
        bootstrap_reduction(control, control[:3], paired=True)


def test_no_bubble_in_the_control_gives_nan_not_a_division_by_zero():
    flat = _analysis(_steps(_uniform([(100, 100, 0, 0, 0)], 3)))
    c = compare(flat, _analysis(_steps(TEST)))
    assert math.isnan(c.bubble_reduction)
    assert all(math.isnan(v) for v in c.bubble_reduction_ci)
    assert all(math.isnan(v) for v in c.by_class.values())


@pytest.mark.parametrize("kwargs", [{"confidence": 1.0}, {"confidence": 0}, {"n_boot": 0}])
def test_bad_options(kwargs):
    a = _analysis(_steps(CONTROL))
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        compare(a, a, **kwargs)


# ------------------------------------------------------------------------------ same batches


def _sidecar(lengths: dict[tuple[int, int], list[int]], digests: dict[int, str] | None = None):
    """A sidecar frame from (rank, step) -> per-sample lengths (and step -> batch digest)."""
    rows = []
    for (rank, step_n), ls in sorted(lengths.items()):
        rows.append(
            {
                "rank": rank,
                "step": step_n,
                "num_samples": len(ls),
                "len_sum": sum(ls),
                "len_sq_sum": sum(v * v for v in ls),
                "len_max": max(ls),
                "est_cost": float("nan"),
            }
            | ({"batch_digest": digests[step_n]} if digests is not None else {})
        )
    return pd.DataFrame(rows)


def _runs_with(
    side_a: pd.DataFrame | None,
    side_b: pd.DataFrame | None,
    metas: tuple[dict[str, Any] | None, dict[str, Any] | None] = (None, None),
) -> tuple[Analysis, Analysis]:
    """The CONTROL and TEST tables with these sidecars and run.json."""
    return (
        _analysis(_steps(CONTROL), sidecar=side_a, meta=metas[0]),
        _analysis(_steps(TEST), sidecar=side_b, meta=metas[1]),
    )


LENGTHS = {(0, 0): [100, 10], (1, 0): [50, 60], (0, 1): [7, 8], (1, 1): [9, 300]}
# the same global batches, samples moved between the ranks (what balancing does)
MOVED = {(0, 0): [100, 60], (1, 0): [50, 10], (0, 1): [7, 300], (1, 1): [9, 8]}


def test_digests_decide_first():
    same = _sidecar(LENGTHS, {0: "aa", 1: "bb"})
    check = batch_check(*(a.run for a in _runs_with(same, same)))
    assert (check.same, check.warnings) == (True, [])
    # equal totals, but the digests say step 1 had other samples
    other = _sidecar(LENGTHS, {0: "aa", 1: "cc"})
    c = compare(*_runs_with(same, other))
    assert c.same_batches is False
    assert (
        "the runs did not see the same global batches: batch digests differ in 1 of 2 common "
        "steps (first: step 1)"
    ) in c.warnings


def test_totals_when_a_run_has_no_digests():
    with_digests = _sidecar(LENGTHS, {0: "aa", 1: "bb"})
    assert compare(*_runs_with(with_digests, _sidecar(MOVED))).same_batches is True
    changed = dict(MOVED) | {(1, 1): [9, 9]}
    c = compare(*_runs_with(_sidecar(LENGTHS), _sidecar(changed)))
    assert c.same_batches is False
    assert any(
        "batch totals" in w and "1 of 2 common steps (first: step 1)" in w for w in c.warnings
    )


def test_totals_skip_steps_that_not_every_rank_logged():
    partial = {k: v for k, v in LENGTHS.items() if k != (1, 1)}  # rank 1 lacks step 1
    changed = dict(LENGTHS) | {(1, 1): [1]}
    assert compare(*_runs_with(_sidecar(partial), _sidecar(changed))).same_batches is True


WORKLOAD = {"seed": 0, "batch_size": 32, "preset": "lognormal", "num_samples": 4096}


def _meta(**workload) -> dict[str, Any]:
    return {"name": "r", "world_size": 2, "workload": WORKLOAD | workload}


def test_workload_when_there_are_no_sidecars():
    c = compare(*_runs_with(None, None, metas=(_meta(), _meta(balance=True))))
    assert c.same_batches is True and c.warnings == []
    c = compare(*_runs_with(None, None, metas=(_meta(), _meta(seed=1, batch_size=16))))
    assert c.same_batches is False
    assert c.warnings == [
        "the runs did not see the same global batches: run.json workload differs in "
        "data.seed (0 vs 1), batch_size (32 vs 16)"
    ]


def test_workload_as_the_job_configs_json_against_an_old_flat_one():
    """A run whose workload is the job config's JSON against one with the older flat record:
    the same knobs, read at their paths and under their flat names."""
    nested = {"batch_size": 32, "data": {"seed": 0, "preset": "lognormal", "num_samples": 4096}}
    metas = ({"name": "r", "world_size": 2, "workload": nested}, _meta())
    assert compare(*_runs_with(None, None, metas=metas)).same_batches is True
    metas = (metas[0], _meta(num_samples=512))
    c = compare(*_runs_with(None, None, metas=metas))
    assert c.same_batches is False and "data.num_samples (4096 vs 512)" in c.warnings[0]


def test_cannot_tell():
    c = compare(*_runs_with(None, None, metas=({"name": "x"}, None)))
    assert c.same_batches is None
    assert c.warnings == [
        "cannot tell whether the runs saw the same global batches "
        "(no step sidecars and no workload in run.json)"
    ]


def test_world_size_simulated_and_incomplete_warnings():
    control = _analysis(_steps(CONTROL), meta=_meta())
    test = _analysis(
        _steps(TEST),
        world_size=4,
        meta=_meta()
        | {"world_size": 4, "simulated": True, "status": "incomplete"}
        | {"reason": "rank 3 crashed"},
    )
    c = compare(control, test)
    assert c.same_batches is False  # world_size is part of the workload check
    assert c.warnings[:3] == [
        "world sizes differ: control 2, test 4",
        "the test run is simulated and the other is not",
        "the test run is incomplete (rank 3 crashed; 2 of 4 ranks loaded)",
    ]
    assert "world_size (2 vs 4)" in c.warnings[-1]


# ------------------------------------------------------- what the two runs can be compared on


def test_device_and_world_size_mismatch_warnings():
    control = _analysis(_steps(CONTROL), device="gpu")
    test = _analysis(_steps(TEST), world_size=4)
    c = compare(control, test)
    assert c.warnings[:2] == [
        "world sizes differ: control 2, test 4",
        "devices differ: control gpu, test cpu (busy time is the GPU's on a GPU run, the "
        "training thread's on a CPU run)",
    ]
    assert not any("devices" in w for w in compare(test, _analysis(_steps(TEST))).warnings)


def _toggle(requested: bool, applied: bool, reason: str | None = None) -> dict[str, Any]:
    return {"requested": requested, "applied": applied, "reason": reason}


def test_toggles_that_do_not_measure_what_they_say():
    """balance: on in the test only (the A/B itself, no line); sm_free: asked for by the test
    only, applied in neither; priority_overlap: asked for by both, applied in the test only;
    sync_gc: off in both (no line)."""
    control = {
        "balance": _toggle(False, False),
        "priority_overlap": _toggle(True, False, "torchrec < 1.9.2"),
        "sm_free": _toggle(False, False),
        "sync_gc": _toggle(False, False),
    }
    test = {
        "balance": _toggle(True, True),
        "priority_overlap": _toggle(True, True),
        "sm_free": _toggle(True, False, "no GPU"),
        "sync_gc": _toggle(False, False),
    }
    runs = _runs_with(
        None, None, metas=(_meta() | {"toggles": control}, _meta() | {"toggles": test})
    )
    c = compare(*runs)
    assert c.warnings == [
        "priority_overlap was requested in both runs but applied only in the test (control: "
        "torchrec < 1.9.2): the runs differ in it although they asked alike",
        "sm_free was requested in the test only and applied in neither (test: no GPU): the "
        "comparison does not measure it",
    ]


def test_a_whole_trace_window_against_steps_is_not_comparable(capsys):
    """Issue 36: a run without ProfilerStep (one whole-trace window of 5.2 s) against a run of
    six steps printed "bubble reduction: 98.9% (95% CI 98.7% – 99.2%)". The control here: one
    window of 5200 ms with 5000 ms of host idle; the test: six 100 ms steps with 10 ms of
    bubble each. The reduction is still computed (1 - 10 / 5000 = 99.8%), but with no interval
    (one step on a side) and marked."""
    whole = _analysis(_steps([(0, 0, 5200, 200, 0, 0, 5000)]), name="w", step_source="whole trace")
    steps = _analysis(_steps([(0, s, 100, 90, 0, 0, 10) for s in range(6)]), name="s")
    c = compare(whole, steps)
    assert c.bubble_reduction == pytest.approx(1 - 10 / 5000)
    assert all(math.isnan(v) for v in c.bubble_reduction_ci)
    reason = (
        "the control run is one whole-trace window (no ProfilerStep: the profiler's start and "
        "stop idle are in it) and the test run has 6 step(s); the reduction sets the one "
        "against the other"
    )
    assert c.not_comparable == reason
    assert f"not comparable: {reason}" in c.warnings
    render_comparison(c, Console(width=400, force_terminal=False))
    out = capsys.readouterr().out
    assert "bubble reduction: 99.8% (no CI: fewer than 2 steps on a side) [NOT COMPARABLE: " in out
    assert "95% CI" not in out.split("bubble reduction:")[1].splitlines()[0]
    # the other way round, and two runs of one kind, are named as such or not at all
    assert compare(steps, whole).not_comparable.startswith("the test run is one whole-trace")
    assert compare(whole, whole).not_comparable is None
    assert compare(steps, steps).not_comparable is None


def test_toggles_recorded_in_one_run_only():
    """A run.json without toggles (a plain job's): the test's applied toggle cannot be checked
    against it; one that is off says nothing."""
    test = {"balance": _toggle(True, True), "sync_gc": _toggle(False, False)}
    c = compare(*_runs_with(None, None, metas=(_meta(), _meta() | {"toggles": test})))
    assert c.warnings == ["balance is applied in the test and not recorded in the control"]


def test_json_is_strict():
    c = compare(_analysis(_steps(CONTROL), name="a"), _analysis(_steps(TEST), name="b"))
    out = json.loads(json.dumps(compare_json(c), allow_nan=False))
    assert set(out) == {
        "control",
        "test",
        "kpis",
        "bubble_reduction",
        "by_class",
        "bubble_reduction_ci",
        "by_class_ci",
        "ci_over",
        "by_role",
        "roles_known",
        "toggles",
        "confidence",
        "step_time_ratio",
        "per_rank",
        "same_batches",
        "same_batches_check",
        "warnings",
        "not_comparable",
    }
    assert out["not_comparable"] is None
    assert out["same_batches_check"] == {
        "same": None,
        "basis": "none",
        "unit": "step",
        "window_steps": 1,
        "checked": 0,
        "differing": 0,
        "first_differing": None,
        "weaker_because": ["neither run has step sidecars"],
    }
    assert out["bubble_reduction"] == pytest.approx(1 - 5 / 35)
    assert out["by_class"]["host_idle"] is None
    assert out["kpis"]["host_idle_ms_per_step"] == {
        "control": 0.0,
        "test": 0.0,
        "delta": 0.0,
        "ratio": None,
    }
    assert out["per_rank"][0]["rank"] == 0 and out["per_rank"][0]["bubble_ms_delta"] == -50
    assert out["confidence"] == 0.95 and out["same_batches"] is None
    assert out["ci_over"] == "steps"
    # no matched collective in either run: no wait to split, every role's 0 ms is exact
    assert out["roles_known"] == {"control": True, "test": True}


# ------------------------------------------------------------- hand-built GPU runs on disk

UNEVEN = [(100.0, 300.0)] * 4
EVEN = [(200.0, 200.0)] * 4
# mean bubble per step over the ranks: three steps of M + 50 - mean(c), then M + 20 - mean(c)
CONTROL_BUBBLE_US = (3 * (300 + 50 - 200) + (300 + 20 - 200)) / 4
TEST_BUBBLE_US = (3 * (200 + 50 - 200) + (200 + 20 - 200)) / 4


@pytest.fixture
def gpu_runs(tmp_path):
    batch = [([10, 20], [30, 40])] * 4
    meta = {"name": "uneven", "world_size": 2, "status": "complete", "workload": WORKLOAD}
    control = write_allreduce_run(tmp_path / "control", UNEVEN, lengths=batch, meta=meta)
    moved = [([10, 40], [30, 20])] * 4  # same global batch, other split
    meta = meta | {"name": "even"}
    test = write_allreduce_run(tmp_path / "test", EVEN, lengths=moved, meta=meta)
    return control, test


def test_reduction_on_analyzed_gpu_runs(gpu_runs):
    control, test = (analyze_path(p) for p in gpu_runs)
    assert control.steps["bubble_ms"].tolist() == pytest.approx(
        [0.250, 0.250, 0.250, 0.220, 0.050, 0.050, 0.050, 0.020]  # rank 0, then rank 1
    )
    c = compare(control, test)
    assert c.bubble_reduction == pytest.approx(1 - TEST_BUBBLE_US / CONTROL_BUBBLE_US)
    assert c.by_class["straggler_wait"] == pytest.approx(1.0)  # 100 µs -> 0
    assert c.by_class["exposed_comm"] == pytest.approx(0.0)  # 20 µs in both
    assert c.by_class["host_idle"] == pytest.approx(0.0)  # (3 * 30 + 0) / 4 µs in both
    assert math.isnan(c.by_class["other"])
    assert c.step_time_ratio == pytest.approx(250 / 350)  # medians of (350 x3, 320), (250 x3, 220)
    lo, hi = c.bubble_reduction_ci
    assert lo <= c.bubble_reduction <= hi
    assert c.same_batches is True
    # NCCL kernels with no marker, no group description, no run.json groups: no roles
    assert (c.control_roles_known, c.test_roles_known) == (False, False)
    assert c.by_role[["control", "test", "reduction"]].isna().all().all()
    assert c.warnings == [
        "neither run's collectives carry roles (no FreeScale markers, process-group "
        "descriptions or run.json process groups): the per-role numbers are unknown"
    ]
    medians = c.step_times.groupby("run")["step_time_ms"].median()
    assert medians["control"] == control.summary["step_time_ms_p50"]  # same rule as kpis
    same = compare(control, control)
    assert same.bubble_reduction == 0 and same.step_time_ratio == 1


def test_unlabelled_control_gives_unknown_per_role_numbers(tmp_path, capsys):
    """A plain job's control (no markers, no process groups in run.json: every collective
    falls back to ``other``) against a test whose run.json names the all_reduce's group as
    the dense one. The test's dense exposed comm is the 20 µs after the last arrival, every
    step; its straggler wait is 0 (both ranks compute 200 µs). The control's share of each
    role is unknown, so no reduction: before, its whole wait (100 µs) counted as ``other``
    and came out as a 100% reduction of "other straggler wait"."""
    batch = [([10, 20], [30, 40])] * 4
    meta = {"name": "plain", "world_size": 2, "status": "complete", "workload": WORKLOAD}
    control = write_allreduce_run(tmp_path / "control", UNEVEN, lengths=batch, meta=meta)
    groups = {"dense": {"pg_name": "0"}}
    meta = meta | {"name": "labelled", "process_groups": groups}
    test = write_allreduce_run(tmp_path / "test", EVEN, lengths=batch, meta=meta)
    c = compare(analyze_path(control), analyze_path(test))
    assert (c.control_roles_known, c.test_roles_known) == (False, True)
    roles = c.by_role.set_index(["role", "class"])
    assert roles["control"].isna().all() and roles["reduction"].isna().all()
    assert roles["ci_lo"].isna().all() and roles["ci_hi"].isna().all()
    assert roles.loc[("dense", "exposed_comm"), "test"] == pytest.approx(0.020)
    assert roles.loc[("dense", "straggler_wait"), "test"] == 0
    assert roles.loc[("other", "straggler_wait"), "test"] == 0
    assert (
        "the control run's collectives carry no roles (no FreeScale markers, process-group "
        "descriptions or run.json process groups): its per-role numbers are unknown"
    ) in c.warnings
    assert c.by_class["straggler_wait"] == pytest.approx(1.0)  # the classes stay known
    assert main(["compare", str(control), str(test)]) == 0
    out = capsys.readouterr().out
    assert "  dense exposed comm: unknown -> 0.02 ms per step (reduction unknown)\n" in out
    assert "other straggler wait" not in out and "embedding" not in out
    assert main(["compare", str(control), str(test), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["roles_known"] == {"control": False, "test": True}
    dense = next(r for r in out["by_role"] if (r["role"], r["class"]) == ("dense", "exposed_comm"))
    assert dense["control"] is None and dense["reduction"] is None and dense["ci_lo"] is None
    assert dense["test"] == pytest.approx(0.020)


def test_device_mismatch_on_analyzed_runs(gpu_runs):
    """A 2-rank GPU run against the 4-rank gloo reference run: both lines."""
    c = compare(
        analyze_path(gpu_runs[0]), analyze_path(REFERENCE / "synthetic_gloo_a2a_straggler_4rank")
    )
    assert c.warnings[:2] == [
        "world sizes differ: control 2, test 4",
        "devices differ: control gpu, test cpu (busy time is the GPU's on a GPU run, the "
        "training thread's on a CPU run)",
    ]


def test_self_comparison_of_the_gloo_reference_run():
    a = analyze_path(REFERENCE / "synthetic_gloo_a2a_straggler_4rank")
    c = compare(a, a)
    assert c.bubble_reduction == 0.0
    lo, hi = c.bubble_reduction_ci
    assert lo <= 0 <= hi
    assert c.step_time_ratio == 1.0
    assert len(c.per_rank) == 4 and (c.per_rank["bubble_ms_delta"] == 0).all()


# ------------------------------------------------------------------------------ fsobs compare


def test_cli_compare_human(gpu_runs, capsys):
    assert main(["compare", *map(str, gpu_runs)]) == 0
    out = capsys.readouterr().out
    expected = 1 - TEST_BUBBLE_US / CONTROL_BUBBLE_US
    assert f"bubble reduction: {expected:.1%} (95% CI " in out
    assert "uneven (control) vs even (test)" in out
    assert "straggler wait: 100.0%" in out and "other: n/a" in out
    assert f"step time ratio (median, test / control): {250 / 350:.3f}" in out
    assert "same global batches: yes" in out
    assert "bubble_ms_per_step" in out
    assert "(the CI resamples this pair's steps: run-to-run variation is not in it;" in out
    assert "  per role: unknown (neither run's collectives carry roles)" in out


def test_cli_compare_json(gpu_runs, capsys):
    assert main(["compare", *map(str, gpu_runs), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["control"], out["test"]) == ("uneven", "even")
    assert out["bubble_reduction"] == pytest.approx(1 - TEST_BUBBLE_US / CONTROL_BUBBLE_US)
    assert out["kpis"]["bubble_ms_per_step"]["control"] == pytest.approx(CONTROL_BUBBLE_US / 1e3)
    assert out["by_class"]["other"] is None and out["same_batches"] is True


def test_cli_compare_several_tests_and_toggles(gpu_runs, capsys):
    """One control against two tests: two reports; these run.json have no toggles, and the
    report says so rather than inventing them."""
    control, test = map(str, gpu_runs)
    assert main(["compare", control, test, control]) == 0
    out = capsys.readouterr().out
    assert out.count("bubble reduction: ") == 2
    assert "bubble reduction: 0.0%" in out  # the control against itself
    assert out.count("toggles of the control: not recorded (no run.json, or no toggles") == 2
    assert out.count("toggles of the test: not recorded") == 2
    assert main(["compare", control, test, control, "--json"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert [b["test"] for b in both] == ["even", "uneven"]


def test_toggles_line_says_what_applied_and_why_not():
    from fsobs.report import toggles_line

    toggles = {
        "balance": {"requested": True, "applied": True, "reason": None},
        "priority_overlap": {"requested": False, "applied": False, "reason": None},
        "sm_free": {"requested": True, "applied": False, "reason": "backend gloo: no SMs"},
    }
    assert toggles_line(toggles) == (
        "balance on; priority_overlap off; sm_free requested, not applied (backend gloo: no SMs)"
    )
    assert toggles_line({}) == "not recorded (no run.json, or no toggles in it)"
    partly = {
        "priority_overlap": {
            "requested": True,
            "applied": True,
            "reason": "partly applied: PEC on tables t_item; not on ebc: a bag",
        }
    }
    assert toggles_line(partly) == (
        "priority_overlap partly applied (PEC on tables t_item; not on ebc: a bag)"
    )


def test_cli_compare_bad_input(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nope"), str(tmp_path / "nope2")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fsobs: error: ") and err.count("\n") == 1 and "nope" in err


# -------------------------------------------------------------------------- fsobs dashboard


def test_dashboard_runs_streamlit_on_the_store(tmp_path, monkeypatch, capsys):
    app = tmp_path / "dashboard" / "streamlit_app.py"
    app.parent.mkdir()
    app.write_text("")
    calls = []
    monkeypatch.setattr("fsobs.cli.dashboard.dashboard_app", lambda: app)
    # the server itself (and its stopping on SIGTERM) runs in
    # tests/integration/dashboard/test_cli_serve.py
    monkeypatch.setattr("fsobs.cli.dashboard.serve", lambda cmd, env: calls.append((cmd, env)) or 0)
    monkeypatch.chdir(tmp_path)
    assert main(["dashboard", "--port", "8600"]) == 0
    ((cmd, env),) = calls
    assert cmd[0] == sys.executable
    assert cmd[1:] == [
        str(app.parent / "serve.py"),
        str(app),
        "--server.headless",
        "true",
        "--server.port",
        "8600",
        "--server.address",
        "127.0.0.1",  # loopback unless --host says otherwise
        "--browser.gatherUsageStats",
        "false",
    ]
    assert env["FSOBS_STORE"] == str((tmp_path / "traces").resolve())
    assert main(["dashboard", "--store", "runs"]) == 0
    assert calls[1][1]["FSOBS_STORE"] == str((tmp_path / "runs").resolve())
    assert "8501" in calls[1][0]


def test_dashboard_app_is_in_the_checkout():
    assert dashboard_app() == Path(__file__).resolve().parents[3] / "dashboard/streamlit_app.py"


def test_dashboard_without_the_app(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("fsobs.cli.dashboard.dashboard_app", lambda: tmp_path / "none.py")
    assert main(["dashboard"]) == 2
    err = capsys.readouterr().err
    assert "none.py: no dashboard app here" in err and err.count("\n") == 1


# a window of 2 steps (optim.window): samples moved between the ranks *and* the two steps
WINDOWED = {(0, 0): [100, 300, 7], (1, 0): [50], (0, 1): [10, 8], (1, 1): [60, 9]}


def test_a_window_run_has_the_same_samples_within_each_window():
    """LENGTHS and WINDOWED: per step the totals differ (step 0: 220 vs 457 tokens), over the
    window of steps 0-1 both hold 8 samples of 544 tokens (sum of squares 106_394)."""
    base = _sidecar(LENGTHS, {0: "aa", 1: "bb"})
    moved = _sidecar(WINDOWED, {0: "xx", 1: "yy"})  # its steps' digests are other sets
    plain = (_meta(), _meta())
    assert compare(*_runs_with(base, moved, metas=plain)).same_batches is False
    windowed = (_meta(), _meta(balance_window=2))
    c = compare(*_runs_with(base, moved, metas=windowed))
    assert c.same_batches is True and c.warnings == []
    changed = dict(WINDOWED) | {(1, 1): [60, 10]}
    c = compare(*_runs_with(base, _sidecar(changed, {0: "xx", 1: "yy"}), metas=windowed))
    assert c.same_batches is False
    assert (
        "the runs did not see the same global batches: batch totals over each window of 2 "
        "steps differ in 1 of 1 common windows (first: window 0)"
    ) in c.warnings
