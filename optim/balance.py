"""Per-sample cost model and partitioners that balance samples across ranks (numpy only, no torch).

- :class:`CostModel`: ``c(L) = c0 + a·L + b·L²`` (+ ``ids·num_ids``), with a JSON file format
  (what ``fsobs fit-cost`` writes and the optimizer reads).
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
    its own partial partition (pure Python, O(n·k): seconds for 16k items into 256 parts).
  - ``"lpt"``: greedy longest processing time: items by descending cost, each to the currently
    lightest part (max <= mean + largest item). With ``equal_size=True`` a full part
    (``n / num_parts`` items) takes no more.
  - ``"random"``: the baseline: contiguous chunks in index order (what splitting an already
    shuffled batch does).

  ``equal_size=True`` (the default) requires ``len(costs) % num_parts == 0`` for every method.
  Ties are broken by index, so equal inputs give equal outputs. Each part lists its indices in
  ascending order; parts are ordered by their smallest index, empty parts last. Every index
  appears exactly once.
- :func:`imbalance`: max part cost / mean part cost (1.0 is perfect).
"""

from __future__ import annotations

import heapq
import json
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

__all__ = ["METHODS", "CostModel", "imbalance", "partition"]

METHODS: tuple[str, ...] = ("kk", "lpt", "random")


@dataclass(kw_only=True, frozen=True)
class CostModel:
    """``c(L) = c0 + a·L + b·L²`` (+ ``ids·num_ids``) per sample; all coefficients finite, >= 0."""

    c0: float
    a: float
    b: float
    ids: float = 0.0
    """Coefficient of the number of embedding ids of a sample (0: no such term)."""

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

    def __call__(self, lengths: np.ndarray, num_ids: np.ndarray | None = None) -> np.ndarray:
        """The cost of each sample (float64, shaped like ``lengths``). ``num_ids`` is required
        when ``ids > 0`` and must have the shape of ``lengths``."""
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
        """Write ``{"c0": .., "a": .., "b": .., "ids": ..}`` atomically (temp file + rename)."""
        target = Path(path)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)  # as open() would create it, not mkstemp's 0600
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(asdict(self), fh, indent=2)
                fh.write("\n")
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> CostModel:
        """Read a file written by :meth:`to_json`; ValueError naming the file (and field)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from exc
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


def _check_costs(costs: Sequence[float] | np.ndarray) -> np.ndarray:
    arr = np.asarray(costs, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"costs: must be 1-D, got shape {arr.shape}")
    if arr.size and not (np.all(np.isfinite(arr)) and arr.min() >= 0):
        raise ValueError("costs: must be finite and >= 0")
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


def _kk_unequal(arr: np.ndarray, k: int) -> list[np.ndarray]:
    order = _descending(arr)
    heap: list[tuple[float, int, list[float], list[list[int]]]] = []
    for rank, idx in enumerate(order.tolist()):
        sums = [float(arr[idx])] + [0.0] * (k - 1)
        heap.append((-sums[0], rank, sums, [[idx]] + [[] for _ in range(k - 1)]))
    heapq.heapify(heap)
    counter = len(heap)
    while len(heap) > 1:
        _, _, s1, m1 = heapq.heappop(heap)
        _, _, s2, m2 = heapq.heappop(heap)
        pairs = sorted(
            ((s1[i] + s2[k - 1 - i], m1[i] + m2[k - 1 - i]) for i in range(k)),
            key=lambda p: -p[0],
        )
        sums = [p[0] for p in pairs]
        heapq.heappush(heap, (-(sums[0] - sums[-1]), counter, sums, [p[1] for p in pairs]))
        counter += 1
    if not heap:
        return [np.empty(0, dtype=np.int64) for _ in range(k)]
    return [np.asarray(p, dtype=np.int64) for p in heap[0][3]]


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
    if isinstance(num_parts, bool) or not isinstance(num_parts, (int, np.integer)):
        raise ValueError(f"num_parts: must be an int, got {num_parts!r}")
    if num_parts < 1:
        raise ValueError(f"num_parts: must be >= 1, got {num_parts}")
    if method not in METHODS:
        raise ValueError(f"method: unknown {method!r}, expected one of {list(METHODS)}")
    arr = _check_costs(costs)
    n, k = arr.size, int(num_parts)
    if equal_size and n % k:
        raise ValueError(
            f"equal_size: {n} samples do not split into {k} equal parts (n % num_parts != 0)"
        )
    if method == "kk":
        if equal_size:
            raw = _kk_equal(arr, k)
            capped = _lpt(arr, k, n // k)
            if _max_load(arr, capped) < _max_load(arr, raw):
                raw = capped
        else:
            raw = _kk_unequal(arr, k)
    elif method == "lpt":
        raw = _lpt(arr, k, n // k if equal_size else None)
    else:
        raw = np.array_split(np.arange(n, dtype=np.int64), k)
    parts = [np.sort(p).tolist() for p in raw]
    parts.sort(key=lambda p: p[0] if p else n)
    return parts


def imbalance(costs: Sequence[float] | np.ndarray, parts: Sequence[Sequence[int]]) -> float:
    """Max part cost / mean part cost over ``parts`` (1.0 when every part costs the same or
    the total is 0)."""
    arr = _check_costs(costs)
    if not parts:
        raise ValueError("parts: must not be empty")
    loads = np.array([arr[np.asarray(p, dtype=np.int64)].sum() for p in parts])
    mean = loads.mean()
    return float(loads.max() / mean) if mean > 0 else 1.0
