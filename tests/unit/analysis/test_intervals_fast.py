"""Interval primitives and the one-pass classification against simple references.

The reference for a set is a boolean grid over small integer ranges (an instant ``x`` is in
``[s, e)`` when ``s <= x < e``); the same sets are also checked shifted to ~1.8e18 ns, where a
float64 is exact to 256 ns only, so that nothing may go through floats. The classification of
all steps of a rank in one pass is checked against the rules evaluated instant by instant, and
against classifying each step alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from fsobs.analysis import intervals as iv
from fsobs.analysis.bubbles.classify import EXPOSED_ORDER, RankWaits, classify
from fsobs.analysis.bubbles.parts import CLASSES, StepParts
from optim.markers import ALL_ROLES

SPAN = 40
GRID = 160
HUGE = 1_800_000_000_000_000_123


def _random_set(rng: np.random.Generator, *, empty_ok: bool = True) -> iv.Intervals:
    """Up to 6 intervals in [0, SPAN): overlapping, nested, touching or empty ones included."""
    n = int(rng.integers(0, 7))
    starts = rng.integers(0, SPAN, n)
    ends = starts + rng.integers(0 if empty_ok else 1, 12, n)
    if n > 1 and rng.random() < 0.5:  # move the second one to touch the first
        ends[1] += ends[0] - starts[1]
        starts[1] = ends[0]
    return starts.astype(np.int64), ends.astype(np.int64)


def _grid(intervals: iv.Intervals) -> np.ndarray:
    covered = np.zeros(GRID, bool)
    for s, e in zip(*(a.tolist() for a in intervals), strict=True):
        covered[s:e] = True
    return covered


def _canonical(covered: np.ndarray) -> iv.Intervals:
    """The sorted, disjoint, non-touching intervals of a boolean grid."""
    edges = np.diff(np.concatenate([[0], covered.astype(np.int64), [0]]))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


def _assert_same(got: iv.Intervals, want: iv.Intervals, offset: int = 0) -> None:
    assert got[0].dtype == np.int64 and got[1].dtype == np.int64
    np.testing.assert_array_equal(got[0], want[0] + offset)
    np.testing.assert_array_equal(got[1], want[1] + offset)


def _shift(intervals: iv.Intervals, offset: int) -> iv.Intervals:
    return intervals[0] + offset, intervals[1] + offset


@pytest.mark.parametrize("offset", [0, HUGE], ids=["small", "1.8e18"])
@pytest.mark.parametrize("seed", range(100))
def test_set_operations_equal_the_grid(seed, offset):
    rng = np.random.default_rng(seed)
    raw_a, raw_b = _random_set(rng), _random_set(rng)
    a = iv.union(*_shift(raw_a, offset))
    b = iv.union(*_shift(raw_b, offset))
    grid_a, grid_b = _grid(raw_a), _grid(raw_b)
    # union keeps an isolated empty interval; every other operation drops it
    _assert_same(iv.clip(a, offset, offset + GRID), _canonical(grid_a), offset)
    _assert_same(iv.intersect(a, b), _canonical(grid_a & grid_b), offset)
    _assert_same(iv.subtract(a, b), _canonical(grid_a & ~grid_b), offset)
    _assert_same(iv.merge(a, b), _canonical(grid_a | grid_b), offset)
    lo, hi = sorted(rng.integers(0, SPAN, 2).tolist())
    clipped = np.zeros_like(grid_a)
    clipped[lo:hi] = grid_a[lo:hi]
    _assert_same(iv.clip(a, offset + lo, offset + hi), _canonical(clipped), offset)
    points = np.arange(GRID)
    np.testing.assert_array_equal(iv.covered(a, points + offset), grid_a)


@pytest.mark.parametrize("offset", [0, HUGE], ids=["small", "1.8e18"])
@pytest.mark.parametrize("seed", range(100))
def test_segments_and_runs_equal_the_grid(seed, offset):
    rng = np.random.default_rng(seed)
    raw = [_random_set(rng) for _ in range(int(rng.integers(1, 5)))]
    bounds, cover = iv.segments([_shift(layer, offset) for layer in raw])
    every = np.concatenate([np.concatenate(layer) for layer in raw])
    np.testing.assert_array_equal(bounds, np.unique(every) + offset)
    assert cover.shape == (max(len(bounds) - 1, 0), len(raw))
    for column, layer in enumerate(raw):
        grid = _grid(layer)
        np.testing.assert_array_equal(cover[:, column], grid[bounds[:-1] - offset])
        _assert_same(iv.runs(bounds, cover[:, column]), _canonical(grid), offset)
    if len(bounds) > 1:  # labels split runs where they change
        cut = bounds[int(rng.integers(0, len(bounds)))]
        label = (bounds[:-1] >= cut).astype(np.int64)
        starts, ends = iv.runs(bounds, cover[:, 0], label)
        assert not np.any((starts < cut) & (ends > cut))
        grid = _grid(raw[0])
        want = _canonical(grid)
        assert (ends - starts).sum() == (want[1] - want[0]).sum()


def test_segments_of_nothing():
    empty = np.zeros(0, np.int64)
    bounds, cover = iv.segments([(empty, empty), (empty, empty)])
    assert len(bounds) == 0 and cover.shape == (0, 2)
    _assert_same(iv.runs(bounds, cover[:, 0]), (empty, empty))
    point = np.array([5], np.int64)
    bounds, cover = iv.segments([(point, point)])
    assert bounds.tolist() == [5] and cover.shape == (0, 1)


# ----------------------------------------------------------------- classification in one pass


def _random_rank(rng: np.random.Generator, device: str, *, overlapping: bool):
    """Random steps of one rank (windows tiling [0, 120), or overlapping) and random matched
    collectives, every set clipped to its step's window as :mod:`fsobs.analysis.bubbles`
    builds them."""
    cuts = np.sort(rng.choice(np.arange(1, 120), 3, replace=False))
    bounds = [0, *cuts.tolist(), 120]
    windows = list(zip(bounds, bounds[1:], strict=False))
    if overlapping:
        windows[1] = (max(windows[1][0] - 5, 0), windows[1][1])
    num = int(rng.integers(0, 8))
    start = np.sort(rng.integers(0, 110, num)).astype(np.int64)
    end = start + rng.integers(0, 30, num)
    last = start + rng.integers(0, 20, num)
    waits = RankWaits(
        rows=np.arange(num, dtype=np.int64) * 2,
        start=start,
        wait_end=np.minimum(last, end),
        end=end,
        last_rank=rng.integers(0, 4, num).astype(np.int64),
        priority=rng.permutation(num).astype(np.int64),
        role=rng.integers(0, len(ALL_ROLES), num).astype(np.int64),
    )
    parts = []
    for step, (lo, hi) in enumerate(windows):
        in_flight = (start < hi) & (end > lo)
        unmatched = np.array([1, 3], np.int64)[: int(rng.integers(0, 3))]

        def clipped(lo: int = lo, hi: int = hi) -> iv.Intervals:
            return iv.clip(iv.union(*_shift(_random_set(rng), lo)), lo, hi)

        extra = {"transfer": clipped(), "everything": clipped()}
        if device == "cpu":
            extra = {"loading": clipped(), "loader_comm": clipped()}
        parts.append(
            StepParts(
                rank=0,
                step=step,
                device=device,
                window=(lo, hi),
                compute=clipped(),
                comm=clipped(),
                comm_rows=np.sort(np.concatenate([waits.rows[in_flight], unmatched])),
                contention_ns=int(rng.integers(0, 9)),
                **extra,
            )
        )
    return parts, waits


def _rules(part: StepParts, waits: RankWaits) -> dict[str, np.ndarray]:
    """The classes of one step, instant by instant (the module docstring's rules)."""
    lo, hi = part.window
    window = np.zeros(GRID, bool)
    window[lo:hi] = True
    mine = np.flatnonzero(np.isin(waits.rows, part.comm_rows))
    wait_set = _grid((waits.start[mine], waits.wait_end[mine])) & window
    matched = (_grid((waits.start[mine], waits.end[mine])) & window) | _grid(part.transfer)
    compute, comm = _grid(part.compute), _grid(part.comm)
    if part.device == "gpu":
        everything = _grid(part.everything)
        blocked = comm & ~compute
        idle = window & ~everything
        other = everything & ~compute & ~comm
        busy = compute
    else:
        loading, loader_comm = _grid(part.loading), _grid(part.loader_comm)
        inside = loader_comm & ~compute
        blocked = (comm & ~compute & ~loading) | inside
        idle = loading & ~compute & ~inside
        other = np.zeros_like(idle)
        busy = window & ~blocked & ~idle
    wait = blocked & wait_set
    return {
        "busy": busy,
        "straggler_wait": wait,
        "exposed_comm": blocked & matched & ~wait,
        "unattributed_comm": blocked & ~matched,
        "host_idle": idle,
        "other": other,
    }


def _reference_charges(part: StepParts, waits: RankWaits, rules: dict[str, np.ndarray]):
    """Instant by instant: the wait goes to the covering collective whose last arrival is
    latest (lowest priority), exposed time to the covering collective whose role comes first in
    EXPOSED_ORDER."""
    mine = np.flatnonzero(np.isin(waits.rows, part.comm_rows)).tolist()
    caused: dict[int, int] = {}
    by_role: dict[tuple[str, str], int] = {}
    for name, until in (("straggler_wait", waits.wait_end), ("exposed_comm", waits.end)):
        for x in np.flatnonzero(rules[name]).tolist():
            cover = [j for j in mine if waits.start[j] <= x < until[j]]
            if not cover:
                continue
            if name == "straggler_wait":
                j = min(cover, key=lambda j: waits.priority[j])
                culprit = int(waits.last_rank[j])
                caused[culprit] = caused.get(culprit, 0) + 1
            else:
                j = min(cover, key=lambda j: EXPOSED_ORDER.index(ALL_ROLES[waits.role[j]]))
            key = (name, ALL_ROLES[waits.role[j]])
            by_role[key] = by_role.get(key, 0) + 1
    return caused, by_role


@pytest.mark.parametrize("device", ["gpu", "cpu"])
@pytest.mark.parametrize("overlapping", [False, True], ids=["tiling", "overlapping"])
@pytest.mark.parametrize("seed", range(40))
def test_one_pass_equals_the_rules_and_each_step_alone(seed, device, overlapping):
    rng = np.random.default_rng(seed)
    parts, waits = _random_rank(rng, device, overlapping=overlapping)
    together = classify(parts, waits)
    assert [(sb.step, sb.window) for sb in together] == [(p.step, p.window) for p in parts]
    for part, sb in zip(parts, together, strict=True):
        alone = classify([part], waits)[0]
        rules = _rules(part, waits)
        for name in CLASSES:
            _assert_same(sb.classes[name], _canonical(rules[name]))
            _assert_same(sb.classes[name], alone.classes[name])
        assert (sb.caused_ns, sb.by_role_ns) == _reference_charges(part, waits, rules)
        assert (sb.caused_ns, sb.by_role_ns) == (alone.caused_ns, alone.by_role_ns)
        assert sum(sb.caused_ns.values()) == sb.total_ns("straggler_wait")
        assert sb.contention_ns == part.contention_ns


@pytest.mark.parametrize("offset", [0, HUGE], ids=["small", "1.8e18"])
@pytest.mark.parametrize("seed", range(50))
def test_clip_each_equals_the_grid_in_every_window(seed, offset):
    """Windows at random (overlapping, touching, empty, outside the set): each window's part
    of the set is the grid's cells of the set inside the window."""
    rng = np.random.default_rng(seed)
    a = _random_set(rng)
    lo = rng.integers(0, SPAN + 10, int(rng.integers(0, 8)))
    hi = lo + rng.integers(0, 15, len(lo))
    got = iv.clip_each(_shift(iv.union(*a), offset), lo + offset, hi + offset)
    assert len(got) == len(lo)
    for start, stop, part in zip(lo.tolist(), hi.tolist(), got, strict=True):
        inside = np.zeros(GRID, bool)
        inside[start:stop] = True
        _assert_same(part, _canonical(_grid(a) & inside), offset)


def test_concat_ranges():
    owner, at = iv.concat_ranges(np.array([5, 0, 2]), np.array([2, 0, 3]))
    assert owner.tolist() == [0, 0, 2, 2, 2]
    assert at.tolist() == [5, 6, 2, 3, 4]
