"""The ``balance`` toggle's modes, and the what-if's re-split of a baseline's recorded global
batches with one of them (no torch).

A mode (:class:`BalanceSplit`, named as ``fsobs whatif --balance-split`` takes it):

- ``kk``: Karmarkar-Karp, equal counts per rank (``BalanceConfig(method="kk")``, the default);
- ``lpt``: LPT, unequal counts (``BalanceConfig(method="lpt")``);
- ``kk-unequal``: Karmarkar-Karp, unequal counts (``BalanceConfig(method="kk", counts="unequal")``);
- ``window:K``: the samples of ``K`` consecutive global batches dealt into ``K`` steps
  (``BalanceConfig(window=K)``, :func:`optim.plan.plan_window`).

:func:`resplit` runs optim's own planner on every recorded step, on the lengths in rank order
(the order of the global batch under the random split) and the job's partition cost model (a
padded one plans with the padded objective, :mod:`optim.padded`, as the job does; a window
refuses it); a rank's predicted compute is the busy model fitted on the run (``P``) on its
new share. A window
groups the steps as the job does, from step 0 (``s // K``), over every step whose lengths the
sidecars hold, traced or not; a window that lacks some of its steps (the run's end) is dealt
over the ones it has, like the job's last window::

    cost = L, 2 ranks    step 0: [9 7 6] [5 4 1]      step 1: [10 3 3] [2 1 1]    (max 22, 16)
    window:2  pooled     9 7 6 5 4 1 10 3 3 2 1 1
              dealt      step 0: [10 3] [9 3 1]       step 1: [7 4 2] [6 5 1 1]  (max 13, 13)

What a prediction assumes, beyond the calibration's ``s_r · P · eta``: a baseline whose ranks
all hold the same number of samples cannot tell a per-sample constant from a per-step one, so
the fitted ``c0`` is taken per sample (a share with fewer samples is predicted lighter by
``c0`` each); the replay scales all of a rank's busy pieces in the step by its new compute
over its measured one (fixed kernels too); and every step keeps its measured host time and
transfers: a mode that moves samples between ranks or steps (unequal counts, a window) changes
a step's tokens, but not its all-to-all time here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from fsobs.analysis.whatif.calibration import Calibration
from fsobs.errors import FsobsError, RunError
from fsobs.runformat.names import sidecar_file_name
from optim.balance import CostModel
from optim.padded import PaddedCosts, split_costs
from optim.plan import BalanceConfig, StepPlan, plan_window

SPLITS = ("kk", "lpt", "kk-unequal", "window:K")
"""The modes' names (``K``: an int >= 2)."""


@dataclass(frozen=True)
class BalanceSplit:
    """One mode of the ``balance`` toggle (the module docstring): the job's own config, under
    the name ``fsobs whatif --balance-split`` gives it."""

    config: BalanceConfig = BalanceConfig(enabled=True)
    """The ``balance`` toggle in this mode (on; ``kk`` or ``lpt``; a window is named
    ``lpt``'s)."""

    def __post_init__(self) -> None:
        config = self.config
        if not config.enabled or config.method not in ("kk", "lpt"):
            raise ValueError(
                f"balance_split: the toggle on with method kk or lpt, got {config.method!r}"
                + ("" if config.enabled else " (off)")
            )
        if config.window > 1 and config.method != "lpt":
            raise ValueError(f"balance_split: window {config.window} is named lpt's (window:K)")

    @property
    def name(self) -> str:
        """``kk``, ``lpt``, ``kk-unequal`` or ``window:K`` (what :meth:`parse` reads)."""
        config = self.config
        if config.window > 1:
            return f"window:{config.window}"
        return config.method if config.method == "lpt" or config.equal_size else "kk-unequal"

    @classmethod
    def parse(cls, text: str) -> BalanceSplit:
        """The mode named ``text`` (:data:`SPLITS`); ValueError naming ``balance_split``."""
        named = {
            "kk": KK,
            "lpt": cls(BalanceConfig(enabled=True, method="lpt")),
            "kk-unequal": cls(BalanceConfig(enabled=True, counts="unequal")),
        }
        if text in named:
            return named[text]
        head, _, k = text.partition(":")
        if head == "window" and k.isdigit() and int(k) >= 2:
            return cls(BalanceConfig(enabled=True, method="lpt", window=int(k)))
        raise ValueError(
            f"balance_split: unknown {text!r}, expected one of {', '.join(SPLITS)} (K >= 2)"
        )

    def plan(self, costs: list[np.ndarray | PaddedCosts], world_size: int) -> list[StepPlan]:
        """optim's plans of one window (one global batch unless ``window > 1``): the job's own
        calls."""
        if self.config.window > 1:
            return plan_window(costs, world_size)
        (batch,) = costs
        return [StepPlan.make(batch, world_size, self.config)]


KK = BalanceSplit()
"""The default mode."""


@dataclass
class Resplit:
    """The balance toggle's split of every step, and what the cost model says of it."""

    split: BalanceSplit
    predicted_ns: np.ndarray
    """``[rank, step]``: fitted busy model on each rank's new share."""
    imbalance_before: np.ndarray
    imbalance_after: np.ndarray
    """Per step, max / mean partition cost (a window's: of the step's shares)."""
    planner_ns: float
    """Median planning time per step (a window's call shared by its steps; every rank plans
    in plan mode)."""
    short_windows: int = 0
    """Windows dealt over fewer than ``window`` steps (the sidecars lack the others)."""


def resplit(
    cal: Calibration,
    model: CostModel,
    split: BalanceSplit = KK,
    planner_ns: float | None = None,
) -> Resplit:
    """Run optim's planner in mode ``split`` on every recorded step (the module docstring)."""
    _check_lengths(cal)
    if split.config.window > 1 and model.shape == "padded":
        raise FsobsError(
            f"balance_split: {split.name} deals per-sample costs and the cost model is padded "
            "(a rank's cost is its batch's, not a sum over samples); take kk, lpt or kk-unequal"
        )
    ranks, k = cal.ranks, split.config.window
    seen = {s for _, s in cal.lengths}
    recorded = sorted(s for s in seen if all((r, s) in cal.lengths for r in ranks))
    windows = sorted({s // k for s in cal.steps})
    column = {s: i for i, s in enumerate(cal.steps)}
    fitted = cal.fit.model
    predicted = np.zeros_like(cal.predicted_ns)
    before, after = np.zeros(len(cal.steps)), np.zeros(len(cal.steps))
    timings, short = [], 0
    for w in windows:
        steps = [s for s in recorded if s // k == w]
        short += len(steps) < k
        batches = [np.concatenate([cal.lengths[(r, s)] for r in ranks]) for s in steps]
        started = time.perf_counter()
        plans = split.plan([split_costs(model, b) for b in batches], len(ranks))
        timings += [(time.perf_counter() - started) * 1e9 / len(steps)] * len(steps)
        pooled = np.concatenate(batches)
        for step, plan in zip(steps, plans, strict=True):
            if step not in column:
                continue  # in the window, not traced
            si = column[step]
            before[si], after[si] = plan.imbalance_before, plan.imbalance_after
            for ri, part in enumerate(plan.parts):
                predicted[ri, si] = float(fitted(pooled[part]).sum())
    return Resplit(
        split=split,
        predicted_ns=predicted,
        imbalance_before=before,
        imbalance_after=after,
        planner_ns=float(np.median(timings)) if planner_ns is None else planner_ns,
        short_windows=short if k > 1 else 0,
    )


def _check_lengths(cal: Calibration) -> None:
    missing = [(r, s) for r in cal.ranks for s in cal.steps if (r, s) not in cal.lengths]
    if missing:
        r, s = missing[0]
        raise RunError(
            f"balance needs the per-sample lengths of every rank and step; its step sidecar "
            f"has none for step {s} ({len(missing)} (rank, step) missing); predict the other "
            "toggles with --toggles priority_overlap,sm_free",
            path=cal.run_path / sidecar_file_name(r),
            rank=r,
        )
