"""Per-sample cost model and partitioners that balance samples across ranks (numpy only, no torch).

- :class:`CostModel`: per sample ``c(L) = c0 + a·L + b·L²`` (+ ``ids·num_ids``), and for a
  padded model a rank's ``batch`` constant and ``padded · n · max(L)²`` on top, with a JSON
  file format (what ``fsobs fit-cost`` writes and the optimizer reads). The partitioners here
  split per-sample costs (additive models); a padded model's batches are split by
  :mod:`optim.padded`.
- :func:`partition`: split sample indices into ``num_parts`` parts of near-equal total cost:

  - ``"kk"``: Karmarkar–Karp largest differencing, k-way (as in NVIDIA recsys-examples'
    balanced batch shuffler and verl's ``get_seqlen_balanced_partitions``). With
    ``equal_size=True`` the items, sorted by descending cost, are cut into groups of
    ``num_parts`` (one item per part), and the two partial partitions with the largest spread
    (max part - min part) are merged repeatedly, the heaviest part of one with the lightest of
    the other. Every part then holds exactly one item of each group, so its cost is at most the
    sum of the group maxima: never worse than a sorted round-robin deal.
    With a heavy tail that one-item-per-group structure costs balance, so the equal-size KK
    result is compared with capped LPT (below) and the one with the lower max part wins (KK on
    a tie): still never worse than round-robin. With ``equal_size=False`` every item starts as
    its own partial partition, merged by a heap on the spread; partitions list only their
    non-empty parts and the runs of items that a partition takes in a row skip the heap
    (:class:`_Differencing`): tens of milliseconds, not seconds, for 16k items into 256 parts.
  - ``"lpt"``: greedy longest processing time: items by descending cost, each to the currently
    lightest part (max <= mean + largest item). With ``equal_size=True`` a full part
    (``n / num_parts`` items) takes no more.
  - ``"random"``: the baseline: contiguous chunks in index order (what splitting an already
    shuffled batch does).

  ``equal_size=True`` (the default) requires ``len(costs) % num_parts == 0`` for every method.
  With ``equal_size=False``, KK and LPT place the samples of positive cost and then deal the
  zero-cost ones one at a time to a part with the fewest samples, so that no part is empty when
  there are at least ``num_parts`` samples (all-zero costs: counts differ by at most 1).
  Ties are broken by index, so equal inputs give equal outputs. Each part lists its indices in
  ascending order; parts are ordered by their smallest index, empty parts last. Every index
  appears exactly once.
- :func:`imbalance`: max part cost / mean part cost (1.0 is perfect).
- :func:`imbalance_bound`: the imbalance that no partition of the samples can go below (with
  any counts, or with equal counts per part): when a step's costliest sample alone costs more
  than the mean part, no split inside the step can balance it.
"""

from __future__ import annotations

import bisect
import heapq
import json
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Literal, get_args

import numpy as np

__all__ = ["METHODS", "SHAPES", "CostModel", "imbalance", "imbalance_bound", "partition"]

MAX_COST_MODEL_BYTES = 2**20
"""The largest cost-model file read (1 MiB; :meth:`CostModel.to_json` writes under 200 B)."""

Method = Literal["kk", "lpt", "random"]
"""A partitioner: Karmarkar-Karp, LPT or the random (contiguous) split."""
METHODS: tuple[Method, ...] = get_args(Method)
SHAPES: tuple[str, ...] = ("additive", "padded")
"""The shapes of :attr:`CostModel.shape`."""


@dataclass(kw_only=True, frozen=True)
class CostModel:
    """The cost of a rank's batch of ``n`` samples of lengths ``L_i`` (all coefficients finite,
    >= 0)::

        cost = batch + Σ_i (c0 + a·L_i + b·L_i² + ids·num_ids_i) + padded · n · max(L)²

    With ``batch = padded = 0`` (the *additive* shape, :attr:`shape`) the cost is a sum of
    per-sample costs, :meth:`__call__`, and the partitioners balance those. Otherwise (the
    *padded* shape: attention over a batch padded to its longest sample costs every sample
    ``max(L)²``) a sample has no cost of its own: :meth:`__call__` refuses, and only
    :meth:`batch_cost` of a whole batch is defined (:func:`optim.padded.partition_padded` splits
    by it).
    """

    c0: float
    a: float
    b: float
    ids: float = 0.0
    """Coefficient of the number of embedding ids of a sample (0: no such term)."""
    batch: float = 0.0
    """Per rank and step, whatever its samples (0: none; > 0 makes the shape padded)."""
    padded: float = 0.0
    """Coefficient of ``n · max(L)²`` of a rank's batch (0: none; > 0 makes the shape padded)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(
                value, (int, float, np.integer, np.floating)
            ):
                raise ValueError(f"{f.name}: must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{f.name}: must be finite and >= 0, got {value!r}")
            object.__setattr__(self, f.name, float(value))

    @property
    def shape(self) -> str:
        """``"additive"`` (a rank costs the sum of its samples' costs) or ``"padded"``
        (:data:`SHAPES`)."""
        return "additive" if self.batch == 0 and self.padded == 0 else "padded"

    def __call__(self, lengths: np.ndarray, num_ids: np.ndarray | None = None) -> np.ndarray:
        """The cost of each sample (float64, shaped like ``lengths``); additive models only
        (ValueError naming ``padded`` otherwise). ``num_ids`` is required when ``ids > 0`` and
        must have the shape of ``lengths``."""
        if self.shape != "additive":
            raise ValueError(
                f"padded: a cost model with padded={self.padded:g}, batch={self.batch:g} costs "
                "a rank's batch as a whole, not per sample: use CostModel.batch_cost(lengths)"
            )
        return self._per_sample(lengths, num_ids)

    def batch_cost(self, lengths: np.ndarray, num_ids: np.ndarray | None = None) -> float:
        """The cost of one rank's batch of samples of ``lengths`` (any shape; the sum of
        :meth:`__call__` for an additive model); ``batch`` also for an empty batch."""
        length = np.asarray(lengths, dtype=np.float64)
        cost = self.batch + float(self._per_sample(length, num_ids).sum())
        if length.size and self.padded > 0:
            cost += self.padded * length.size * float(length.max()) ** 2
        return cost

    def additive_part(self) -> CostModel:
        """The per-sample terms alone (``batch = padded = 0``)."""
        return CostModel(c0=self.c0, a=self.a, b=self.b, ids=self.ids)

    def _per_sample(self, lengths: np.ndarray, num_ids: np.ndarray | None) -> np.ndarray:
        length = np.asarray(lengths, dtype=np.float64)
        cost = self.c0 + self.a * length + self.b * length * length
        if num_ids is None:
            if self.ids > 0:
                raise ValueError("num_ids: required when the ids coefficient is > 0")
            return cost
        n_ids = np.asarray(num_ids, dtype=np.float64)
        if n_ids.shape != length.shape:
            raise ValueError(f"num_ids: shape {n_ids.shape} differs from lengths {length.shape}")
        return cost + self.ids * n_ids

    def to_json(self, path: str | os.PathLike[str]) -> None:
        """Write ``{"c0": .., "a": .., "b": .., "ids": ..}``, with ``"batch"`` and ``"padded"``
        for a padded model, atomically (temp file + rename). A field a file lacks besides
        ``c0, a, b`` reads as 0: the additive files of before the padded shape read as they did,
        and an additive model's file is what they were."""
        target = Path(path)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)  # as open() would create it, not mkstemp's 0600
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(self._fields(), fh, indent=2)
                fh.write("\n")
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _fields(self) -> dict[str, float]:
        data = asdict(self)
        if self.shape == "additive":
            del data["batch"], data["padded"]
        return data

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> CostModel:
        """Read a file written by :meth:`to_json`; ValueError naming the file (and field),
        also for a file over :data:`MAX_COST_MODEL_BYTES` (never read further)."""
        with open(path, "rb") as fh:
            data = fh.read(MAX_COST_MODEL_BYTES + 1)
        if len(data) > MAX_COST_MODEL_BYTES:
            raise ValueError(
                f"{path}: over the {MAX_COST_MODEL_BYTES / 2**20:g} MiB limit of a cost model file"
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from exc
        return cls.from_json_text(text, str(path))

    @classmethod
    def from_json_text(cls, text: str, source: str) -> CostModel:
        """The model in ``text`` (what :meth:`to_json` writes), read from ``source`` (named in
        the errors)."""
        path = source
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from exc
        except RecursionError as exc:
            raise ValueError(f"{path}: not a cost model (nested too deep to read)") from exc
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ValueError(f"{path}: unknown field(s) {unknown}, expected {names}")
        for name in ("c0", "a", "b"):
            if name not in data:
                raise ValueError(f"{path}: field {name!r} is missing")
        try:
            return cls(**data)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc


def check_split(
    costs: Sequence[float] | np.ndarray, num_parts: int, equal_size: bool, name: str = "costs"
) -> tuple[np.ndarray, int]:
    """The checked values (per sample: ``costs``, or ``name``) and number of parts of a split
    (:func:`partition`, :func:`imbalance_bound`, :func:`optim.padded.partition_padded`);
    ValueError naming the argument."""
    if isinstance(num_parts, bool) or not isinstance(num_parts, (int, np.integer)):
        raise ValueError(f"num_parts: must be an int, got {num_parts!r}")
    if num_parts < 1:
        raise ValueError(f"num_parts: must be >= 1, got {num_parts}")
    arr = check_values(costs, name)
    if equal_size and arr.size % num_parts:
        raise ValueError(
            f"equal_size: {arr.size} samples do not split into {num_parts} equal parts "
            "(n % num_parts != 0)"
        )
    return arr, int(num_parts)


def check_values(values: Sequence[float] | np.ndarray, name: str = "costs") -> np.ndarray:
    """``values`` (one per sample) as a 1-D float64 array, finite and >= 0; ValueError naming
    ``name`` otherwise."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name}: must be 1-D, got shape {arr.shape}")
    if arr.size and not (np.all(np.isfinite(arr)) and arr.min() >= 0):
        raise ValueError(f"{name}: must be finite and >= 0")
    return arr


def _descending(arr: np.ndarray) -> np.ndarray:
    """Indices by descending cost, ties by ascending index."""
    return np.lexsort((np.arange(arr.size), -arr))


def _kk_equal(arr: np.ndarray, k: int) -> list[np.ndarray]:
    order = _descending(arr)
    m = arr.size // k
    # Each partial partition: (sums descending, members (k, j)); row i's items sum to sums[i].
    heap: list[tuple[float, int, np.ndarray, np.ndarray]] = []
    for g in range(m):
        members = order[g * k : (g + 1) * k].reshape(k, 1)
        sums = arr[members[:, 0]]
        heap.append((-(sums[0] - sums[-1]), g, sums, members))
    heapq.heapify(heap)
    counter = m
    while len(heap) > 1:
        _, _, s1, m1 = heapq.heappop(heap)
        _, _, s2, m2 = heapq.heappop(heap)
        sums = s1 + s2[::-1]  # heaviest of one with lightest of the other
        members = np.concatenate([m1, m2[::-1]], axis=1)
        resort = np.argsort(-sums, kind="stable")
        sums, members = sums[resort], members[resort]
        heapq.heappush(heap, (-(sums[0] - sums[-1]), counter, sums, members))
        counter += 1
    if not heap:
        return [np.empty(0, dtype=np.int64) for _ in range(k)]
    return list(heap[0][3])


_Part = tuple[float, int]
"""One non-empty part of a partial partition: (its cost, its representative item)."""


class _Differencing:
    """k-way Karmarkar–Karp differencing of positive-cost items given by descending cost; item
    ``i`` is the ``i``-th of that order, so that the run depends on the costs alone.

    Same merges as a heap of ``n`` partitions of ``k`` sums each (item ``i`` of the descending
    order starts as ``(cost, 0, ..., 0)`` with priority ``(cost, -i)``; a merge gets priority
    ``(max - min, -counter)``), but cheap: items wait in their sorted order instead of a heap, a
    partition lists only its non-empty parts (ascending ``(cost, representative)``), and the run
    of items merged into the partition just built is taken without touching the heap.
    Members are tracked by union: each merge of two non-empty parts makes one representative
    the parent of the other.
    """

    def __init__(self, costs: list[float], k: int) -> None:
        self.costs = [*costs, -math.inf]  # a sentinel: "the item after the last"
        self.k, self.num_items = k, len(costs)
        self.negated = [-c for c in costs]  # ascending, for bisect
        self.next = 0  # the first item not yet merged
        self.counter = len(costs)  # priority tie-break of the next merge (items have 0..n-1)
        self.heap: list[tuple[float, int, list[_Part]]] = []  # (-spread, counter, parts)
        self.children: list[int] = []
        self.parents: list[int] = []

    def spread(self, parts: list[_Part]) -> float:
        """Max part - min part (a missing part costs 0)."""
        return parts[-1][0] - (parts[0][0] if len(parts) == self.k else 0.0)

    def take(self) -> list[_Part]:
        """Remove the entry of highest priority: the next item unless the heap's top spreads
        more (an item wins a tie: its counter is lower)."""
        j = self.next
        if self.heap and -self.heap[0][0] > self.costs[j]:  # the sentinel loses
            return heapq.heappop(self.heap)[2]
        self.next = j + 1
        return [(self.costs[j], j)]

    def solve(self) -> list[_Part]:
        """Merge until one partition is left and return its parts."""
        while len(self.heap) + self.num_items - self.next > 1:
            merged = self._equal_run() or self.merge(self.take(), self.take())
            merged = self.absorb(merged)
            heapq.heappush(self.heap, (-self.spread(merged), self.counter - 1, merged))
        return self.take()

    def _equal_run(self) -> list[_Part] | None:
        """The next ``r`` items (2 <= r <= k) cost the same ``c`` and every heap entry spreads
        less: the heap would pair them up (each pair spreads ``c``, more than any later item),
        then merge the pairs first in, first out: ``r - 1`` merges into one partition of ``r``
        parts costing ``c``. None when that does not apply."""
        j = self.next
        cost = self.costs[j]
        if j + 1 >= self.num_items or self.costs[j + 1] != cost:
            return None
        if self.heap and -self.heap[0][0] >= cost:
            return None
        num = bisect.bisect_right(self.negated, -cost, j) - j
        if num > self.k:
            return None
        self.next += num
        self.counter += num - 1
        return [(cost, item) for item in range(j, j + num)]

    def merge(self, x: list[_Part], y: list[_Part]) -> list[_Part]:
        """The i-th heaviest part of one with the i-th lightest of the other."""
        self.counter += 1
        p, q, k = len(x), len(y), self.k
        if p + q <= k:  # every non-empty part meets an empty one
            return sorted(x + y)
        lo = k - q  # x's parts from position lo on (heaviest first) meet y's (lightest first)
        heavy = x[::-1]
        both = heavy[lo:p]
        self.children.extend(part[1] for part in y[: p - lo])
        self.parents.extend(part[1] for part in both)
        paired = [(a[0] + b[0], a[1]) for a, b in zip(both, y, strict=False)]
        return sorted(heavy[:lo] + paired + y[p - lo :])

    def absorb(self, parts: list[_Part]) -> list[_Part]:
        """Merge the next items into ``parts`` while the two are the entries of highest priority
        (``parts``, the newest merge, loses every tie)."""
        top = -self.heap[0][0] if self.heap else -math.inf
        if len(parts) < self.k:
            parts = self._fill(parts, top)
        if len(parts) == self.k:
            self._feed(parts, top)
        return parts

    def _fill(self, parts: list[_Part], top: float) -> list[_Part]:
        """Items into empty parts; the spread stays the heaviest part, and every item of the
        run costs no more than any part (they come later in the descending order)."""
        costs, j, spread = self.costs, self.next, parts[-1][0]
        if j == self.num_items or costs[j] < top or spread <= top or spread <= costs[j + 1]:
            return parts
        # the spread then beats every later item too: take the items that beat the heap's top
        num = min(self.k - len(parts), bisect.bisect_right(self.negated, -top, j) - j)
        self.next += num
        self.counter += num
        return [(costs[i], i) for i in range(j + num - 1, j - 1, -1)] + parts

    def _feed(self, parts: list[_Part], top: float) -> None:
        """Items into the lightest part (``parts`` is full), in place."""
        costs, j, end = self.costs, self.next, self.num_items
        pop, insort = parts.pop, bisect.insort
        add_child, add_parent = self.children.append, self.parents.append
        while j < end:
            cost = costs[j]
            spread = parts[-1][0] - parts[0][0]
            if cost < top or spread <= top or spread <= costs[j + 1]:
                break
            load, rep = pop(0)
            insort(parts, (load + cost, rep))
            add_child(j)
            add_parent(rep)
            j += 1
        self.counter += j - self.next
        self.next = j


def _kk_unequal(arr: np.ndarray, k: int) -> list[np.ndarray]:
    """KK differencing of items of positive cost, each starting as its own partition."""
    order = _descending(arr)
    if k == 1 or arr.size <= 1:
        return [order] + [np.empty(0, dtype=np.int64) for _ in range(k - 1)]
    run = _Differencing(arr[order].tolist(), k)
    parts = run.solve()
    parent = np.arange(arr.size)  # by position in ``order``
    parent[np.asarray(run.children, dtype=np.int64)] = run.parents
    while True:  # pointer jumping: every item to its root
        grand = parent[parent]
        if np.array_equal(grand, parent):
            break
        parent = grand
    slot = np.empty(arr.size, dtype=np.int64)
    slot[[rep for _, rep in parts]] = np.arange(len(parts))
    return _group(order, slot[parent], k)


def _lpt(arr: np.ndarray, k: int, cap: int | None) -> list[np.ndarray]:
    order = _descending(arr)
    values = arr[order].tolist()
    owner = [0] * arr.size
    counts = [0] * k
    heap = [(0.0, p) for p in range(k)]
    for pos, value in enumerate(values):
        load, p = heap[0]
        owner[pos] = p
        counts[p] += 1
        if cap is None or counts[p] < cap:
            heapq.heapreplace(heap, (load + value, p))
        else:
            heapq.heappop(heap)
    owners = np.asarray(owner, dtype=np.int64)
    return [order[owners == p] for p in range(k)] if k <= 64 else _group(order, owners, k)


def _group(items: np.ndarray, owners: np.ndarray, k: int) -> list[np.ndarray]:
    """``items`` split by ``owners`` (0..k-1), one array per part."""
    by_owner = np.argsort(owners, kind="stable")
    bounds = np.searchsorted(owners[by_owner], np.arange(1, k))
    return np.split(items[by_owner], bounds)


def _unequal(arr: np.ndarray, k: int, method: str) -> list[np.ndarray]:
    """KK or LPT with unequal counts on the samples of positive cost; then the zero-cost samples
    to the parts with the fewest samples, so that no part is left empty if it can be helped."""
    positive = np.flatnonzero(arr > 0)
    raw = _kk_unequal(arr[positive], k) if method == "kk" else _lpt(arr[positive], k, None)
    return _deal_by_count([positive[p] for p in raw], np.flatnonzero(arr == 0))


def _deal_by_count(parts: list[np.ndarray], extra: np.ndarray) -> list[np.ndarray]:
    """``parts`` plus the ``extra`` items (ascending), dealt one at a time to a part with the
    fewest items (the first such part on a tie)."""
    counts = np.array([p.size for p in parts], dtype=np.int64)
    num = extra.size
    # the level every part ends at or above: the largest L with sum(max(L - counts, 0)) <= num
    lo, hi = int(counts.min()), int(counts.min()) + num
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if int(np.maximum(mid - counts, 0).sum()) <= num:
            lo = mid
        else:
            hi = mid - 1
    take = np.maximum(lo - counts, 0)
    left = num - int(take.sum())  # fewer than the parts now at level lo: one each, in order
    take[np.flatnonzero(counts <= lo)[:left]] += 1
    chunks = np.split(extra, np.cumsum(take)[:-1])
    return [np.concatenate([p, c]) for p, c in zip(parts, chunks, strict=True)]


def _max_load(arr: np.ndarray, parts: list[np.ndarray]) -> float:
    return max((float(arr[p].sum()) for p in parts), default=0.0)


def partition(
    costs: Sequence[float] | np.ndarray,
    num_parts: int,
    *,
    method: str = "kk",
    equal_size: bool = True,
) -> list[list[int]]:
    """Split ``range(len(costs))`` into ``num_parts`` parts of near-equal total cost.

    See the module docstring for the methods and the order of the result.
    """
    if method not in METHODS:
        raise ValueError(f"method: unknown {method!r}, expected one of {list(METHODS)}")
    arr, k = check_split(costs, num_parts, equal_size)
    n = arr.size
    if method == "kk":
        if equal_size:
            raw = _kk_equal(arr, k)
            capped = _lpt(arr, k, n // k)
            if _max_load(arr, capped) < _max_load(arr, raw):
                raw = capped
        else:
            raw = _unequal(arr, k, "kk")
    elif method == "lpt":
        raw = _lpt(arr, k, n // k) if equal_size else _unequal(arr, k, "lpt")
    else:
        raw = np.array_split(np.arange(n, dtype=np.int64), k)
    parts = [np.sort(p).tolist() for p in raw]
    parts.sort(key=lambda p: p[0] if p else n)
    return parts


def imbalance(costs: Sequence[float] | np.ndarray, parts: Sequence[Sequence[int]]) -> float:
    """Max part cost / mean part cost over ``parts`` (1.0 when every part costs the same or
    the total is 0)."""
    arr = check_values(costs)
    if not parts:
        raise ValueError("parts: must not be empty")
    if len({len(p) for p in parts}) == 1:  # a row's sum is the part's own, bit for bit
        loads = arr[np.asarray(parts, dtype=np.int64)].sum(axis=1)
    else:
        loads = np.array([arr[np.asarray(p, dtype=np.int64)].sum() for p in parts])
    mean = loads.mean()
    return float(loads.max() / mean) if mean > 0 else 1.0


def imbalance_bound(
    costs: Sequence[float] | np.ndarray, num_parts: int, *, equal_size: bool = False
) -> float:
    """A lower bound on :func:`imbalance` of every split of ``costs`` into ``num_parts`` parts
    (with ``equal_size=True``: every split with ``len(costs) / num_parts`` items per part);
    1.0 when the total is 0.

    With ``c_1 >= c_2 >= ... >= c_n``, total ``T`` and mean part ``T / N`` (``N = num_parts``):

    - any counts: some part holds ``c_1`` and the heaviest part is at least the mean, so
      ``max part >= max(c_1, T / N)``: the bound is ``max(c_1, T/N) / (T/N)``, above 1 exactly
      when the costliest sample alone costs more than the mean part (a *whale*);
    - equal counts, ``k = n / N`` items per part: for each ``j <= N``, the ``j`` costliest items
      lie on some ``p`` parts, ``ceil(j / k) <= p <= j``. Those ``p`` parts hold ``p·k`` items:
      the ``j`` costliest and ``p·k - j`` others, which cost at least the ``p·k - j`` cheapest
      ``F(p·k - j)`` (``p·k - j <= n - j``, so these are not among the ``j``). The heaviest of
      the ``p`` parts is at least their mean, so ``max part >= min_p (S_j + F(p·k - j)) / p``
      with ``S_j = c_1 + ... + c_j``, whatever ``p`` is. The bound is the largest of these over
      ``j`` and ``T / N``, over ``T / N``. ``j = p = 1`` says: the part that takes the costliest
      sample takes ``k - 1`` more, at best the ``k - 1`` cheapest. It is never below the bound
      with any counts.

    Neither bound need be reached by a split; both are reached when every part can get the same
    cost. ``equal_size=True`` requires ``len(costs) % num_parts == 0`` (as :func:`partition`).
    """
    arr, parts = check_split(costs, num_parts, equal_size)
    total = float(arr.sum())
    if total <= 0:
        return 1.0
    mean = total / parts
    desc = np.sort(arr)[::-1]
    best = max(mean, float(desc[0]))
    if equal_size:
        best = max(best, _equal_count_bound(desc, parts))
    return best / mean


def _equal_count_bound(desc: np.ndarray, num_parts: int) -> float:
    """``max_j min_p (S_j + F(p·k - j)) / p`` of :func:`imbalance_bound` (``desc``: the costs in
    descending order, ``len(desc) = k · num_parts``)."""
    k = desc.size // num_parts
    top = np.cumsum(desc)  # top[j - 1] = S_j
    cheapest = np.concatenate([[0.0], np.cumsum(desc[::-1])])  # cheapest[m] = F(m)
    best = 0.0
    for j in range(1, num_parts + 1):
        p = np.arange(-(-j // k), j + 1)
        best = max(best, float(((top[j - 1] + cheapest[p * k - j]) / p).min()))
    return best
