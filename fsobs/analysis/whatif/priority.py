"""The ``priority_overlap`` toggle as a rewrite of a run's segment graph
(:mod:`fsobs.analysis.whatif.graph`), replayed by :mod:`fsobs.analysis.whatif.replay`.

With the toggle, embedding collectives run on a channel of their own, ahead of dense ones, and
the dense all-reduce is issued behind the backward embedding all-to-all. On a baseline run,
two patterns show that embedding communication was held up by dense communication of the same
process group:

1. **shared**: an embedding transfer ran while a dense one was transferring. Sharing the
   channel, each moves at half speed; on its own channel the embedding transfer is shorter by
   half the overlap::

       dense     [A_d ================ E_d)
       embedding        [A_k ====== E_k)         X'_k = X_k - |overlap| / 2

2. **queued**: on every rank, an embedding collective started within ``QUEUE_SLACK_NS`` of the
   end of a dense one: it was queued behind it. With the toggle it starts where the dense one
   started, the dense transfer follows it, and the rank's compute after the embedding
   collective (its first busy part: the embedding update) runs while the dense transfer
   goes on; the rank blocks on the dense result only after that::

       before  |wait d|xx d|xx k|--busy--|...        after  |wait k|xx k|--busy--|xx d|...
                                                            (xx d: only what is left of it)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import numpy as np
import pandas as pd

from fsobs.analysis.whatif.replay import BUSY, EXPOSED, LOCAL, Piece, SegmentGraph
from optim.markers import EMBEDDING_ROLES

QUEUE_SLACK_NS = 50_000


def prioritize(graph: SegmentGraph) -> tuple[SegmentGraph, list[str]]:
    """The rewritten graph and what was changed, in words."""
    out = graph.copy()
    table = out.instances.set_index("instance")
    emb = table[table["role"].isin(EMBEDDING_ROLES)]  # PEC's collectives are embedding ones
    dense = table[table["role"] == "dense"]
    shared = _share(out, emb, dense)
    queued = _queued_pairs(out, emb, dense)
    for d, k in queued:
        _reorder(out, d, k)
    notes = []
    if shared:
        notes.append(
            f"{shared} embedding transfer(s) shared the channel with a dense one: shortened by "
            "half the overlap"
        )
    if queued:
        notes.append(
            f"{len(queued)} embedding collective(s) queued behind a dense one: moved ahead, the "
            "dense transfer overlapped with the compute that follows"
        )
    if not notes:
        notes.append(
            "no embedding collective shares the channel with, or queues behind, a dense one "
            "in the same process group: nothing to reschedule"
        )
    return out, notes


def _share(graph: SegmentGraph, emb: pd.DataFrame, dense: pd.DataFrame) -> int:
    changed = 0
    for k, row in cast("Iterable[tuple[int, pd.Series]]", emb.iterrows()):  # labels: instances
        mates = dense[dense["group"] == row["group"]]
        lo = np.maximum(mates["last_arrival_ns"].to_numpy(), row["last_arrival_ns"])
        hi = np.minimum(mates["end_ns"].to_numpy(), row["end_ns"])
        overlap = int(np.clip(hi - lo, 0, None).sum())
        if overlap > 0:
            graph.transfer_ns[int(k)] = max(0, graph.transfer_ns[int(k)] - overlap // 2)
            changed += 1
    return changed


def _queued_pairs(
    graph: SegmentGraph, emb: pd.DataFrame, dense: pd.DataFrame
) -> list[tuple[int, int]]:
    """(dense, embedding) pairs where the embedding one started right after the dense one
    ended, on every rank."""
    spans = graph.spans.set_index(["instance", "rank"])
    pairs = []
    for d, drow in cast("Iterable[tuple[int, pd.Series]]", dense.iterrows()):  # instances
        mates = emb[(emb["group"] == drow["group"]) & (emb["step"] == drow["step"])]
        for k in mates.index:
            if int(k) in graph.after.values():
                continue
            start = cast(pd.Series, spans.loc[int(k), "start_ns"])  # the ranks of instance k
            end = cast(pd.Series, spans.loc[int(d), "end_ns"]).reindex(start.index)
            gap = (start - end).to_numpy()
            ok = len(gap) and not np.isnan(gap).any()
            if ok and ((gap >= 0) & (gap <= QUEUE_SLACK_NS)).all():
                pairs.append((int(d), int(k)))
                graph.after[int(d)] = int(k)
                break
    return pairs


def _reorder(graph: SegmentGraph, d: int, k: int) -> None:
    """Move k's arrivals to d's, and d's exposed pieces behind the first busy part after k."""
    for rank in graph.ranks:
        chain = graph.pieces[rank]
        where = _arrival_of(chain, d)
        held = _arrival_of(chain, k)
        if where is None or held is None:
            continue
        piece, position = where
        chain[held[0]].arrivals = [a for a in chain[held[0]].arrivals if a[0] != k]
        chain[piece].arrivals.append((k, position))
        moved = [p for p in chain if p.kind == EXPOSED and p.owner == d]
        if not moved:
            continue
        last_k = max((i for i, p in enumerate(chain) if p.owner == k), default=-1)
        spot = _after_first_busy(chain, last_k)
        if spot is None:
            continue
        ids = {id(p) for p in moved}
        _rehome(chain, ids)
        rest = [p for p in chain if id(p) not in ids]
        spot -= sum(1 for p in chain[:spot] if id(p) in ids)
        graph.pieces[rank] = rest[:spot] + moved + rest[spot:]


def _rehome(chain: list[Piece], ids: set[int]) -> None:
    """The arrivals held by the pieces about to move stay where they were: at the start of
    the next piece that does not move."""
    for i, piece in enumerate(chain):
        if id(piece) not in ids or not piece.arrivals:
            continue
        host = next((p for p in chain[i + 1 :] if id(p) not in ids), None)
        if host is None:
            continue
        zero = np.zeros_like(host.lengths) if host.kind == LOCAL else 0
        host.arrivals = [(inst, zero) for inst, _ in piece.arrivals] + host.arrivals
        piece.arrivals = []


def _arrival_of(chain: list[Piece], inst: int) -> tuple[int, np.ndarray | int] | None:
    for i, piece in enumerate(chain):
        for who, position in piece.arrivals:
            if who == inst:
                return i, position
    return None


def _after_first_busy(chain: list[Piece], after: int) -> int | None:
    """Split the first local piece after index ``after`` (same step) just after its first busy
    part; the index where the second half starts, or None."""
    if after < 0 or after + 1 >= len(chain):
        return None
    i = after + 1
    piece = chain[i]
    if piece.kind != LOCAL or piece.step != chain[after].step:
        return None
    cut, done = 0, 0
    for kind, ns in piece.parts:
        cut += 1
        done += ns
        if kind == BUSY:
            break
    if cut >= len(piece.parts):
        return i + 1
    first, second = _split(piece, cut, done)
    chain[i : i + 1] = [first, second]
    return i + 1


def _split(piece: Piece, cut: int, at_ns: int) -> tuple[Piece, Piece]:
    head, tail = piece.parts[:cut], piece.parts[cut:]
    first = Piece(piece.step, LOCAL, parts=head, first_of_step=piece.first_of_step)
    second = Piece(piece.step, LOCAL, parts=tail)
    for part in (first, second):
        part.lengths = np.zeros_like(piece.lengths)
        for kind, ns in part.parts:
            part.lengths[kind] += ns
    for inst, position in piece.arrivals:
        offset = int(np.sum(position)) if isinstance(position, np.ndarray) else int(position)
        if offset <= at_ns or not isinstance(position, np.ndarray):
            first.arrivals.append((inst, position))
        else:
            second.arrivals.append((inst, position - first.lengths))
    return first, second
