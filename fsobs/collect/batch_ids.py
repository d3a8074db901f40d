"""The IDs of a step's global batch per embedding table, for the sidecar's ``id_overlap``.

Each rank holds the IDs of its own samples; the overlap PEC can use is a property of the global
batch (every rank's samples), the same on every rank. :func:`gather_ids` all-gathers them on a
process group (the recorder's own gloo group, never the training's), sizes uneven and empty
ranks allowed, in two collectives::

    1. all_gather [fingerprint of the table names, total IDs of the rank]   (fixed size)
    2. all_gather [IDs per table (T counts), then the IDs, padded to the largest total]
    3. per table, the ranks' IDs concatenated in rank order: the same on every rank

Ranks with other table names all raise the same ``ValueError`` after step 1 (every rank sees
every fingerprint), so none waits in step 2 for a rank that left. :func:`table_ids` reads a
rank's IDs per table from a torchrec ``KeyedJaggedTensor`` (a table looks up several features).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

__all__ = ["gather_ids", "table_ids"]

IntArray = Sequence[int] | np.ndarray | torch.Tensor
"""Integers per sample or per ID: a sequence, a 1-D numpy array or a 1-D tensor."""


def gather_ids(
    local: Mapping[str, IntArray], group: dist.ProcessGroup | None, world_size: int
) -> dict[str, np.ndarray]:
    """Per table, every rank's ``local`` IDs concatenated in rank order (module docstring);
    ``local`` itself as int64 arrays when ``world_size`` is 1. Collective on ``group``."""
    if not isinstance(local, Mapping):
        raise ValueError(f"local: must map table -> IDs, got {type(local).__name__}")
    tables = sorted(local)
    mine = {t: int_array(local[t], f"local[{t!r}]") for t in tables}
    if world_size == 1:
        return mine
    counts = [len(mine[t]) for t in tables]
    fingerprint = zlib.crc32("\0".join(tables).encode())
    heads = _all_gather(torch.tensor([fingerprint, sum(counts)], dtype=torch.int64), group)
    if len({int(h[0]) for h in heads}) > 1:
        raise ValueError(
            f"local: the ranks name other tables (this rank: {tables}); every rank must pass "
            "the same table names, an empty array for a table it has no IDs of"
        )
    width = max(int(h[1]) for h in heads)
    flat = [torch.tensor(counts, dtype=torch.int64)]
    flat += [torch.from_numpy(mine[t]) for t in tables]
    flat.append(torch.zeros(width - sum(counts), dtype=torch.int64))
    rows = _all_gather(torch.cat(flat), group)
    parts: dict[str, list[np.ndarray]] = {t: [] for t in tables}
    for row in rows:
        sizes = row[: len(tables)].tolist()
        values = row[len(tables) :].numpy()
        for t, piece in zip(tables, np.split(values, np.cumsum(sizes))[:-1], strict=True):
            parts[t].append(piece)
    return {t: np.concatenate(parts[t]).astype(np.int64, copy=False) for t in tables}


def table_ids(
    kjt: KeyedJaggedTensor, tables: Mapping[str, Sequence[str]]
) -> dict[str, torch.Tensor]:
    """Per table, the IDs of its features in ``kjt`` (a torchrec ``KeyedJaggedTensor``),
    concatenated in the order of ``tables[table]``, e.g. ``{c.name: c.feature_names for c in
    table_configs}``. A table's features must be keys of ``kjt``."""
    if not isinstance(tables, Mapping):
        raise ValueError(f"tables: must map table -> feature names, got {type(tables).__name__}")
    keys = set(kjt.keys())
    out = {}
    for table, features in tables.items():
        if isinstance(features, str) or not isinstance(features, Sequence) or not features:
            raise ValueError(
                f"tables[{table!r}]: must be a non-empty list of feature names, got {features!r}"
            )
        missing = [f for f in features if f not in keys]
        if missing:
            raise ValueError(f"tables[{table!r}]: features {missing} are not in the KJT's keys")
        out[table] = torch.cat([kjt[f].values() for f in features])
    return out


def int_array(values: IntArray, name: str) -> np.ndarray:
    """``values`` as a 1-D int64 array (``ValueError`` naming the field otherwise)."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.ndim != 1 or not (array.size == 0 or np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"{name}: must be a 1-D sequence of integers, got {values!r}")
    return array.astype(np.int64, copy=False)


def _all_gather(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> list[torch.Tensor]:
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, tensor, group=group)
    return out
