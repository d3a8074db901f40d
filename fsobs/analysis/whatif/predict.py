"""What-if: predict each FreeScale toggle, and every combination, from one baseline run.

Method (docs/design.md §7). The run is cut into a segment graph
(:mod:`fsobs.analysis.whatif.graph`): per rank and step, local pieces (busy, host idle, ...)
between the matched collectives, which are joint events with the ranks' arrivals and a
transfer time::

    rank 0  |--busy------|a|====wait====|xx|--busy------|a|xx|--busy--|
    rank 1  |--busy-------------------|a|xx|--busy--|a|=wait=|xx|--busy--|
                                       A_k = last arrival,  end = A_k + X_k

First the graph is replayed unchanged: it must give back the measured step times and classes
(the replay check, :func:`fsobs.analysis.whatif.replay.replay_error`). Then each toggle changes the
graph and the graph is replayed; a combination applies all of its changes in one replay, its
effect is never the sum of single ones:

- ``balance``: optim's planner re-splits every recorded global batch (the job's own cost
  model) in one of the toggle's modes (:mod:`fsobs.analysis.whatif.splits`: ``kk``, ``lpt``,
  ``kk-unequal``, or a window of ``K`` batches dealt into ``K`` steps); each rank's busy time
  becomes ``s_r · P(new share) · eta``, with ``P`` the cost model fitted on the run, ``s_r``
  the rank's speed and ``eta`` a residual resampled from the run's
  (:mod:`fsobs.analysis.whatif.calibration`); on a CPU run the planner's time is added as
  host time (the training thread plans).
- ``priority_overlap``: torchrec's PEC from the sidecars' ``id_overlap`` (the non-overlapped
  share of the embedding all-to-alls hidden, the mask exchange and extra lookups added) and
  embedding communication ahead of dense communication (:mod:`fsobs.analysis.whatif.priority`).
- ``sm_free``: compute no longer slowed by communication: each rank's busy time loses the
  measured contention of its step.

The ``oracle`` gives every rank the same compute in every step (the step's mean busy time), no
toggle: what is left of the straggler wait then comes from neither data nor noise. Replays in
which only the data (``P``) or only the noise (``s_r · eta``) differs between the ranks give
the data's share of the two waits, and the run's straggler wait is split in that share. The two
replays' waits are not parts of it: where the data and the noise offset each other on a rank
(heavier data, a faster draw), either alone spreads the ranks further than both did.

Intervals: every draw resamples the residuals (the baseline is replayed with the same draw, so
a reduction compares like with like), and the steps are resampled with replacement; the
interval is the central ``confidence`` share of ``1 - bubble(toggles) / bubble(baseline)``.
Everything here is a prediction from the baseline alone: no toggled run is read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations
from typing import cast

import numpy as np
import pandas as pd

from fsobs.analysis.pipeline import Analysis
from fsobs.analysis.whatif._gc import full_collections_held
from fsobs.analysis.whatif.bounds import BoundSummary, run_bounds
from fsobs.analysis.whatif.calibration import (
    Calibration,
    calibrate,
    noise_draws,
    partition_model,
    rank_step_ns,
)
from fsobs.analysis.whatif.priority import embedding_ms, pec_overlap, prioritize
from fsobs.analysis.whatif.replay import (
    BUSY,
    GAP,
    KINDS,
    Changes,
    SegmentGraph,
    build_graph,
    replay_batch,
    replay_error,
    totals_table,
)
from fsobs.analysis.whatif.results import (
    FittedCost,
    Oracle,
    Prediction,
    ReplayCheck,
    ResplitEffect,
    WhatIf,
    WhatIfCalibration,
    WhatIfRun,
)
from fsobs.analysis.whatif.splits import KK, BalanceSplit, Resplit, resplit
from fsobs.errors import RunError
from optim.balance import CostModel

TOGGLES = ("balance", "priority_overlap", "sm_free")
CLASSES = KINDS[1:6]
REPLAY_GATE = {"step_time_median": 0.03, "step_time_p90": 0.08}
"""The replay must reproduce the run this closely for the predictions to hold."""
Progress = Callable[[int, int, str], None]
"""``progress(done, total, next)``: stages done, of how many, and what comes next."""
_PIECE_BUDGET = 3_000_000
"""Piece visits the draws may take in all (large runs get fewer draws)."""


@dataclass
class _Setup:
    graph: SegmentGraph
    measured: pd.DataFrame
    cal: Calibration | None
    partition: CostModel | None
    busy_ns: np.ndarray
    contention_ns: np.ndarray


def available_toggles(analysis: Analysis) -> tuple[str, ...]:
    """The toggles this run can predict (balance needs step sidecars with per-sample lengths)."""
    sidecar = analysis.run.sidecar
    if sidecar is None or sidecar.empty:
        return TOGGLES[1:]
    return TOGGLES


def whatif(
    analysis: Analysis,
    toggles: tuple[str, ...] = TOGGLES,
    *,
    draws: int = 200,
    seed: int = 0,
    confidence: float = 0.95,
    balance_split: BalanceSplit = KK,
    cost_model: CostModel | None = None,
    planner_ns: float | None = None,
    progress: Progress | None = None,
) -> WhatIf:
    """Predict every non-empty combination of ``toggles`` (see the module docstring).

    ``balance_split``: the ``balance`` toggle's mode; ``cost_model``: the balancer's model
    (default: the run's own, else the fitted one);
    ``planner_ns``: the planner's time per step, added to every rank's step (default: timed
    here on a CPU run, where it holds up the training thread; 0 on a GPU run, where the host
    plans while the GPU works). ``progress(done, total, next)``, when given, is called before
    each stage of the work (``next`` names it) and once with ``done == total`` at the end.
    Full garbage collections are held off meanwhile (:mod:`fsobs.analysis.whatif._gc`).
    """
    with full_collections_held():
        return _whatif(
            analysis,
            toggles,
            draws=draws,
            seed=seed,
            confidence=confidence,
            balance_split=balance_split,
            cost_model=cost_model,
            planner_ns=planner_ns,
            progress=progress,
        )


def _whatif(
    analysis: Analysis,
    toggles: tuple[str, ...],
    *,
    draws: int,
    seed: int,
    confidence: float,
    balance_split: BalanceSplit,
    cost_model: CostModel | None,
    planner_ns: float | None,
    progress: Progress | None,
) -> WhatIf:
    """:func:`whatif`'s work."""
    toggles = _check_toggles(toggles)
    stages = _Stages(progress, 3 + ("priority_overlap" in toggles))
    stages.next("the segment graph of the run")
    setup = _setup(analysis, "balance" in toggles)
    notes = _notes(analysis, toggles, setup)
    split = None
    if "balance" in toggles:
        assert setup.cal is not None
        model = cost_model or setup.partition or setup.cal.fit.model
        if planner_ns is None and analysis.run.device == "gpu":
            planner_ns = 0.0
        split = resplit(setup.cal, model, balance_split, planner_ns)
        notes += _split_notes(split)
    prio_graph, overlap = None, None
    if "priority_overlap" in toggles:
        overlap = pec_overlap(analysis.run.sidecar)
        prio_graph, prio_notes = prioritize(setup.graph, overlap)
        if overlap is None:
            prio_notes.insert(0, "no id_overlap in the step sidecars: PEC not modelled")
        notes += [f"priority_overlap: {n}" for n in prio_notes]
    combos = [c for n in range(1, len(toggles) + 1) for c in combinations(toggles, n)]
    num = _num_draws(setup.graph, draws, len(combos))
    rng = np.random.default_rng(seed)
    etas = noise_draws(setup.cal, num, rng) if setup.cal is not None else None
    own_eta = setup.cal.eta if setup.cal is not None else None
    runs = _Runner(setup, split, prio_graph)
    replays, walks = runs.replay([(), *combos], [*_each(etas, num), own_eta], stages)
    if prio_graph is not None and overlap is not None:
        notes.append(_pec_note(setup.graph, walks[False], prio_graph, walks[True]))
    *base, own = replays[()]
    predictions = []
    for combo in combos:
        *pred, same = replays[combo]
        predictions.append(_predict(combo, base, pred, own, same, confidence, rng))
    # what the predictions' absolute figures compare with: the baseline under the same draws
    resampled = float(np.median([b["bubble_ms"].mean() for b in base]))
    stages.next("the oracle and the replay check")
    result = WhatIf(
        run=_run_facts(analysis, setup),
        baseline=_baseline(analysis, setup.measured),
        replay=_replay_check(setup, walks[False].totals[0], resampled),
        calibration=_calibration(setup, split),
        predictions=predictions,
        oracle=_oracle(setup, [_per_step(t) for t in walks[False].totals], confidence, rng),
        split_bound=_split_bound(analysis),
        notes=notes,
        draws=num,
        confidence=confidence,
    )
    stages.next("")
    return result


class _Stages:
    """Calls ``progress`` as the work moves from stage to stage."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress, self.total, self.done = progress, total, -1

    def next(self, what: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(min(self.done, self.total), self.total, what)


def _check_toggles(toggles: tuple[str, ...]) -> tuple[str, ...]:
    unknown = [t for t in toggles if t not in TOGGLES]
    if unknown or not toggles:
        raise RunError(f"toggles: unknown {unknown} or none; expected some of {list(TOGGLES)}")
    return tuple(t for t in TOGGLES if t in toggles)


def _setup(analysis: Analysis, need_lengths: bool) -> _Setup:
    graph = build_graph(analysis)
    measured = analysis.steps[analysis.steps["step"].isin(graph.steps)]
    if len(graph.steps) < 2:
        raise RunError("the what-if needs at least 2 analyzed steps", path=analysis.run.path)
    cal = partition = None
    sidecar = analysis.run.sidecar
    if sidecar is not None and not sidecar.empty:
        try:
            cal = calibrate(analysis, graph.ranks, graph.steps)
            partition, _ = partition_model(sidecar, cal.fit.model)
        except RunError:
            if need_lengths:
                raise
    elif need_lengths:
        raise RunError(
            "balance needs step sidecars (steps.rank<R>.jsonl) with per-sample lengths; "
            "predict the other toggles with --toggles priority_overlap,sm_free",
            path=analysis.run.path,
        )
    busy = rank_step_ns(measured, "busy_ms", graph.ranks, graph.steps)
    contention = rank_step_ns(measured, "contention_ms", graph.ranks, graph.steps)
    return _Setup(graph, measured, cal, partition, busy, contention)


def _num_draws(graph: SegmentGraph, draws: int, num_combos: int) -> int:
    pieces = sum(len(p) for p in graph.pieces.values())
    fit = _PIECE_BUDGET // max(1, pieces * (num_combos + 1))
    return int(max(1, min(draws, max(20, fit))))


def _each(etas: np.ndarray | None, num: int) -> list[np.ndarray | None]:
    return [None] * num if etas is None else list(etas)


@dataclass
class _Walk:
    """What one walk of a graph gives beside the combinations' replays
    (:meth:`_Runner.replay`)."""

    totals: list[np.ndarray]
    """Replayed ns ``[rank, step, class]``: the unchanged graph, then (on the baseline's
    graph) the oracle's replays (:func:`_oracle_batch`)."""
    blocked_ns: dict[int, float]
    """Blocked ns per instance in the unchanged replay (``by_owner``)."""


class _Runner:
    """Replays of the baseline and of toggle combinations for one residual draw."""

    def __init__(
        self, setup: _Setup, split: Resplit | None, prio_graph: SegmentGraph | None
    ) -> None:
        # split is set when a combo has balance, prio_graph when one has priority_overlap
        self.setup, self.split, self.prio_graph = setup, split, prio_graph

    def replay(
        self,
        combos: list[tuple[str, ...]],
        etas: list[np.ndarray | None],
        stages: _Stages,
    ) -> tuple[dict[tuple[str, ...], list[dict[str, np.ndarray]]], dict[bool, _Walk]]:
        """Per combination, one replay per residual draw; and per graph (prioritized or not),
        its :class:`_Walk`. Every replay of one graph shares one walk of it
        (:func:`replay_batch`: each replay exactly what it gives alone): at 256 ranks a walk
        costs seconds, whatever its width."""
        by_graph: dict[bool, list[tuple[str, ...]]] = {}
        for combo in combos:
            by_graph.setdefault("priority_overlap" in combo, []).append(combo)
        out, walks = {}, {}
        for prioritized, group in by_graph.items():
            graph = cast(SegmentGraph, self.prio_graph) if prioritized else self.setup.graph
            stages.next(f"{len(group) * len(etas)} replays{' with priority_overlap' * prioritized}")
            more = [Changes()] + ([] if prioritized else _oracle_batch(self.setup))
            batch = [self._changes(combo, eta) for combo in group for eta in etas] + more
            first = len(batch) - len(more)  # the unchanged replay's place in the batch
            blocked: dict[int, float] = {}
            replayed = replay_batch(graph, batch, blocked, first)
            walks[prioritized] = _Walk(list(replayed[first:]), blocked)
            totals = iter(replayed)
            for combo in group:
                out[combo] = [_per_step(next(totals)) for _ in etas]
        return out, walks

    def _changes(self, combo: tuple[str, ...], eta: np.ndarray | None) -> Changes:
        s = self.setup
        busy = s.busy_ns
        if s.cal is not None and eta is not None:
            predicted = (
                cast(Resplit, self.split).predicted_ns if "balance" in combo else s.cal.predicted_ns
            )
            busy = s.cal.busy_for(predicted, eta)
        if "sm_free" in combo:
            share = np.zeros_like(s.busy_ns)
            np.divide(s.contention_ns, s.busy_ns, where=s.busy_ns > 0, out=share)
            busy = busy * np.clip(1.0 - share, 0.0, 1.0)
        changes = _busy_changes(s.busy_ns, busy)
        if "balance" in combo:
            changes.extra_idle_ns = np.full(busy.shape, cast(Resplit, self.split).planner_ns)
        return changes


def _busy_changes(measured: np.ndarray, busy: np.ndarray) -> Changes:
    """Scale every rank's busy time in every step from ``measured`` to ``busy`` (ns)."""
    factor = np.divide(busy, measured, where=measured > 0, out=np.ones_like(measured))
    scale = np.ones((*measured.shape, len(KINDS)))
    scale[:, :, BUSY] = factor
    return Changes(scale=scale)


def _per_step(totals: np.ndarray) -> dict[str, np.ndarray]:
    """Per step (ms): the mean over ranks of the bubble and each class (``<class>_ms``), and
    the step time, from replayed ``[rank, step, class]`` ns."""
    window = totals[:, :, :GAP].sum(axis=2)
    out = {"bubble_ms": (window - totals[:, :, BUSY]).mean(axis=0) / 1e6}
    for i, c in enumerate(CLASSES, start=1):
        out[f"{c}_ms"] = totals[:, :, i].mean(axis=0) / 1e6
    out["step_time_ms"] = window.max(axis=0) / 1e6
    return out


def _predict(
    combo: tuple[str, ...],
    b: list[dict[str, np.ndarray]],
    p: list[dict[str, np.ndarray]],
    own_s: dict[str, np.ndarray],
    same_s: dict[str, np.ndarray],
    confidence: float,
    rng: np.random.Generator,
) -> Prediction:
    bubble_b = np.stack([x["bubble_ms"] for x in b])
    bubble_p = np.stack([x["bubble_ms"] for x in p])
    ratio = _ratios(bubble_b, bubble_p)
    by_class = {}
    for c in CLASSES:
        cb = np.stack([x[f"{c}_ms"] for x in b])
        cp = np.stack([x[f"{c}_ms"] for x in p])
        by_class[c] = {
            "ms_per_step": float(np.median(cp.mean(axis=1))),
            "reduction": float(np.median(_ratios(cb, cp))) if cb.sum() > 0 else math.nan,
        }
    steps = np.stack([x["step_time_ms"] for x in p])
    p50 = np.median(steps, axis=1)
    boot = _bootstrap(bubble_b, bubble_p, rng)
    alpha = (1 - confidence) / 2
    return Prediction(
        toggles=combo,
        bubble_ms_per_step=float(np.median(bubble_p.mean(axis=1))),
        bubble_reduction=float(np.median(ratio)),
        bubble_reduction_interval=_interval(boot, alpha),
        by_class=by_class,
        step_time_ms_p50=float(np.median(p50)),
        step_time_ms_p50_interval=_interval(_bootstrap_p50(steps, rng), alpha),
        same_noise_reduction=float(1 - same_s["bubble_ms"].sum() / own_s["bubble_ms"].sum())
        if own_s["bubble_ms"].sum() > 0
        else math.nan,
    )


def _ratios(base: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """Per draw, ``1 - Σ pred / Σ base`` over the steps."""
    total = base.sum(axis=1)
    return np.where(total > 0, 1 - pred.sum(axis=1) / np.where(total > 0, total, 1), np.nan)


def _bootstrap(base: np.ndarray, pred: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Reductions over every draw with the steps resampled (paired), about 4000 in all."""
    draws, steps = base.shape
    per = max(1, 4000 // draws)
    idx = rng.integers(steps, size=(draws, per, steps))
    rows = np.arange(draws)[:, None, None]
    b = base[rows, idx].sum(axis=2)
    p = pred[rows, idx].sum(axis=2)
    return cast(np.ndarray, (1 - p[b > 0] / b[b > 0]).reshape(-1))


def _bootstrap_p50(steps: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    draws, num = steps.shape
    idx = rng.integers(num, size=(draws, max(1, 2000 // draws), num))
    return cast(
        np.ndarray, np.median(steps[np.arange(draws)[:, None, None], idx], axis=2).reshape(-1)
    )


def _interval(values: np.ndarray, alpha: float) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if not len(values):
        return (math.nan, math.nan)
    lo, hi = np.quantile(values, [alpha, 1 - alpha])
    return (float(lo), float(hi))


def _pec_note(graph: SegmentGraph, walk: _Walk, prio_graph: SegmentGraph, prio: _Walk) -> str:
    """The embedding collectives' blocked time before and after PEC (unchanged replays)."""
    before, after = embedding_ms(graph, walk.blocked_ns), embedding_ms(prio_graph, prio.blocked_ns)
    cut = 1 - after / before if before > 0 else math.nan
    return (
        f"priority_overlap: embedding wait + exposed (PEC's roles included) {before:.2f} -> "
        f"{after:.2f} ms per rank and step ({cut:.1%} less), measured compute"
    )


def _oracle_batch(setup: _Setup) -> list[Changes]:
    """The oracle's replays beside the unchanged one: every rank given the step's mean busy
    time, then (with a calibration) only the data, only the noise, differing (:func:`_alone`)."""
    busy = setup.busy_ns
    mean = busy.mean(axis=0, keepdims=True)
    equal = np.broadcast_to(mean, busy.shape).copy()
    return [_busy_changes(busy, b) for b in (equal, *_alone(setup, mean))]


def _oracle(
    setup: _Setup,
    replayed: list[dict[str, np.ndarray]],
    confidence: float,
    rng: np.random.Generator,
) -> Oracle:
    """Equal compute on every rank in every step; and the wait from the data or noise alone.
    ``replayed``: :func:`_per_step` of the unchanged replay, then of :func:`_oracle_batch`."""
    m, e, *split = replayed
    base = m["bubble_ms"][None, :]
    pred = e["bubble_ms"][None, :]
    alpha = (1 - confidence) / 2
    wait = float(m["straggler_wait_ms"].mean())
    data, noise, share = _wait_split(split) or (None, None, None)
    parts = _wait_parts(wait, share)
    return Oracle(
        bubble_ms_per_step=float(pred.mean()),
        bubble_reduction=float(_ratios(base, pred)[0]),
        bubble_reduction_interval=_interval(_bootstrap(base, pred, rng), alpha),
        by_class={c: float(e[f"{c}_ms"].mean()) for c in CLASSES},
        step_time_ms_p50=float(np.median(e["step_time_ms"])),
        straggler_wait_ms_per_step=wait,
        wait_from_data_ms_per_step=data,
        wait_from_noise_ms_per_step=noise,
        data_share=share,
        data_part_ms_per_step=parts[0],
        noise_part_ms_per_step=parts[1],
    )


def _split_bound(analysis: Analysis) -> BoundSummary | None:
    """The imbalance no split inside a step can beat (:mod:`fsobs.analysis.whatif.bounds`),
    over the run's steps; None without the per-sample lengths or a cost model."""
    bounds = run_bounds(analysis)
    return None if bounds is None or bounds.per_step.empty else bounds.summary()


def _alone(setup: _Setup, mean: np.ndarray) -> list[np.ndarray]:
    """Busy ns ``[rank, step]`` when only the data, and when only the noise, differs between
    the ranks (each step's mean kept); none without a calibration."""
    cal = setup.cal
    if cal is None:
        return []
    data = mean * cal.predicted_ns / cal.predicted_ns.mean(axis=0, keepdims=True)
    noise_part = cal.speed[:, None] * cal.eta
    noise = mean * noise_part / noise_part.mean(axis=0, keepdims=True)
    return [data, noise]


def _wait_split(replays: list[dict[str, np.ndarray]]) -> tuple[float, float, float] | None:
    """The straggler wait (ms per step) of the data-alone and the noise-alone replays, and the
    data's share of the two; None without them."""
    if not replays:
        return None
    wait_data, wait_noise = replays
    d = float(wait_data["straggler_wait_ms"].mean())
    n = float(wait_noise["straggler_wait_ms"].mean())
    return d, n, (d / (d + n) if d + n > 0 else math.nan)


def _wait_parts(wait: float, share: float | None) -> tuple[float | None, float | None]:
    """The run's straggler wait split between the data and the noise in the data's ``share``
    of the two counterfactual waits (:func:`_wait_split`); NaNs when the share is NaN, Nones
    without one. The counterfactuals themselves are no parts: the waits of unequal ranks do
    not add up (the data and the noise can offset each other on a rank)."""
    if share is None:
        return None, None
    if math.isnan(share):
        return math.nan, math.nan
    return wait * share, wait - wait * share


def _run_facts(analysis: Analysis, setup: _Setup) -> WhatIfRun:
    run = analysis.run
    meta = run.meta
    return WhatIfRun(
        path=str(run.path),
        name=(meta and meta.name) or (run.path.name if run.path is not None else ""),
        world_size=run.world_size,
        device=run.device,
        simulated=meta is not None and meta.simulated,
        num_steps=len(setup.graph.steps),
        num_ranks=len(setup.graph.ranks),
    )


def _baseline(analysis: Analysis, measured: pd.DataFrame) -> dict[str, float]:
    keys = ("bubble_ratio", "bubble_ms_per_step", "step_time_ms_p50", "step_time_ms_p90")
    out = {k: float(analysis.summary[k]) for k in keys}
    for c in CLASSES:
        out[f"{c}_ms_per_step"] = float(measured[f"{c}_ms"].mean())
    out["busy_ms_per_step"] = float(measured["busy_ms"].mean())
    return out


def _replay_check(setup: _Setup, unchanged: np.ndarray, resampled_bubble_ms: float) -> ReplayCheck:
    """The unchanged replay (ns ``[rank, step, class]``) against the measured run."""
    err = replay_error(setup.measured, totals_table(setup.graph, unchanged))
    return ReplayCheck(
        step_time_median=err["step_time_median"],
        step_time_p90=err["step_time_p90"],
        step_time_max=err["step_time_max"],
        classes_median=err["classes_median"],
        classes_p90=err["classes_p90"],
        classes_max=err["classes_max"],
        num_steps=int(err["steps"]),
        gate=dict(REPLAY_GATE),
        passed=all(err[k] <= limit for k, limit in REPLAY_GATE.items()),
        baseline_resampled_bubble_ms_per_step=resampled_bubble_ms,
    )


def _calibration(setup: _Setup, split: Resplit | None) -> WhatIfCalibration | None:
    cal = setup.cal
    if cal is None:
        return None
    m = cal.fit.model
    effect = None
    if split is not None:
        effect = ResplitEffect(
            balance_split=split.split.name,
            imbalance_before=float(split.imbalance_before.mean()),
            imbalance_after=float(split.imbalance_after.mean()),
            planner_ms=split.planner_ns / 1e6,
        )
    return WhatIfCalibration(
        cost_fit=FittedCost(c0_ns=m.c0, a_ns=m.a, b_ns=m.b, r2=cal.fit.r2),
        rank_speed={int(r): float(s) for r, s in zip(cal.ranks, cal.speed, strict=True)},
        residual_sigma=cal.residual_sigma,
        partition_model=setup.partition,
        resplit=effect,
    )


def _split_notes(split: Resplit) -> list[str]:
    """What a window's prediction assumes (:mod:`fsobs.analysis.whatif.splits`)."""
    k = split.split.config.window
    if k == 1:
        return []
    notes = [
        f"balance {split.split.name}: {k} consecutive recorded global batches dealt into {k} "
        "steps (optim.plan.plan_window, windows from step 0); each step keeps its measured "
        "host time and transfers, its busy time follows the fitted cost model on its new "
        "samples (c0 per sample; fixed kernels scaled with the rest)"
    ]
    if split.short_windows:
        notes.append(
            f"balance {split.split.name}: {split.short_windows} window(s) dealt over fewer "
            f"than {k} steps (the sidecars have no lengths for the others)"
        )
    return notes


def _notes(analysis: Analysis, toggles: tuple[str, ...], setup: _Setup) -> list[str]:
    meta = analysis.run.meta
    applied = {k for k, v in meta.toggles.items() if v.applied} if meta is not None else set()
    notes = list(analysis.gaps.lines)  # what the baseline lacks, rank by rank
    notes += [f"{t}: already applied in this run" for t in toggles if t in applied]
    if "sm_free" in toggles and analysis.run.device == "cpu":
        notes.append(
            "sm_free: a CPU run; what is removed is the contention measured here (gloo threads "
            "competing for cores), an analogue of SM contention, not the GPU toggle itself"
        )
    if setup.cal is not None and not math.isnan(setup.cal.fit.r2) and setup.cal.fit.r2 < 0.5:
        notes.append(
            f"the cost model explains R² = {setup.cal.fit.r2:.2f} of the busy time; the rest is "
            "resampled as noise, so balance cannot remove it"
        )
    return notes
