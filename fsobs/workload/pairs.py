"""Interleaved A/B pairs of the reference job's arms: the run order, and what-if's prediction of
an arm from a control run. Shared by ``make demo`` (:mod:`fsobs.workload.demo`) and
``benchmarks/bench_ab.py``.

Each pair runs every arm once, the control first on even pairs and last on odd ones, so that
a drift of the machine (a neighbour starting, a warming cache) does not favour one arm::

    pair 0:  control  A  B        pair 1:  A  B  control        pair 2:  control  A  B
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

from fsobs.analysis.pipeline import Analysis
from fsobs.analysis.whatif.predict import TOGGLES, available_toggles, whatif

__all__ = ["interleaved", "pair_order", "predicted_reductions", "whatif_toggles"]

T = TypeVar("T")


def pair_order(arms: Sequence[T], index: int) -> list[T]:
    """The run order of pair ``index`` (module docstring); ``arms[0]`` is the control."""
    return list(arms) if index % 2 == 0 else [*arms[1:], arms[0]]


def interleaved(arms: Sequence[T], num_pairs: int) -> Iterator[tuple[int, T]]:
    """``(pair index, arm)`` in the order the runs are made: pair after pair, each in
    :func:`pair_order`."""
    for index in range(num_pairs):
        for arm in pair_order(arms, index):
            yield index, arm


def whatif_toggles(applied: Sequence[str]) -> tuple[str, ...]:
    """The toggles of ``applied`` that what-if models, in what-if's order (``sync_gc`` is not
    one)."""
    return tuple(t for t in TOGGLES if t in applied)


def predicted_reductions(
    control: Analysis, combos: Sequence[tuple[str, ...]], *, draws: int
) -> dict[tuple[str, ...], float | None]:
    """What-if's predicted bubble reduction (median over ``draws``) of each combination of
    toggles from the ``control`` run: one :func:`~fsobs.analysis.whatif.predict.whatif` over
    their union. None for a combination it cannot predict (empty, or a toggle the run lacks the
    data for, e.g. ``balance`` without per-sample lengths)."""
    wanted = {tuple(sorted(c, key=TOGGLES.index)) for c in combos if c}
    union = tuple(t for t in available_toggles(control) if any(t in c for c in wanted))
    found: dict[tuple[str, ...], float] = {}
    if union:
        result = whatif(control, union, draws=draws)
        found = {p.toggles: p.bubble_reduction for p in result.predictions}
    return {c: found.get(tuple(sorted(c, key=TOGGLES.index))) for c in combos}
