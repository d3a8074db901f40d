"""The ``priority_overlap`` toggle as a rewrite of a run's segment graph
(:mod:`fsobs.analysis.whatif.graph`), replayed by :mod:`fsobs.analysis.whatif.replay`.

The toggle is torchrec's Prioritized Embedding Communication (PEC) plus FreeScale's dense
ordering. PEC (:func:`pec`) needs the step sidecars' ``id_overlap``: per step, the share ``o`` of
the batch's ID occurrences (in the tables PEC takes, :data:`PEC_TABLES`) that the previous batch
had. On a baseline run of torchrec's sparse-dist pipeline, per step, the forward lookup
all-to-all ``F`` (transfer ``X_F``), the first dense all-reduce ``D`` and the backward gradient
all-to-all ``B`` (issued after ``D``, transfer ``X_B``) become::

    baseline  ..|a F|=wait F=|xx F|--fwd--..--bwd--|a D|a B|=wait B=|xx B|--update--
    PEC       ..|a F|a M1|=wait M1=|xx M1|a M2|xx M2|+L|xx F'|--fwd--..
                ..--bwd--|a D|a B|=wait D=|xx D|xx B'|--update--

    X_F' = o · X_F        the overlapped lookup stays; (1 - o) · X_F is looked up a step ahead,
                          behind the previous step's compute (hidden)
    X_B' = o · X_B        the overlapped gradient stays; (1 - o) · X_B is deferred a step,
                          behind the next forward (hidden)
    M1, M2                the two mask all-to-alls, blocking on the training thread, each with
                          the step's smallest embedding transfer (a small all-to-all's latency)
    L = 2 (1 - o') · K_F  the extra lookups: a re-lookup and its backward for the previous
                          step's deferred gradient (o': that step's share; none in the first
                          step), with K_F the busy time before F since the embedding
                          collective before it (the lookup; the step's start where F is the
                          step's first)
    wait                  the straggler wait stays: in the forward the first mask waits for the
                          late rank, in the backward the dense all-reduce does (FreeScale's dense
                          order holds the gradient all-to-all behind it)

Then the dense ordering, as before PEC (the two patterns below), on what is left. Without
``id_overlap`` (a run recorded without it, a simulated run) only the dense ordering is modelled.

With the dense ordering, embedding collectives run on a channel of their own, ahead of dense
ones, and the dense all-reduce is issued behind the backward embedding all-to-all. On a
baseline run, two patterns show that embedding communication was held up by dense
communication of the same process group:

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

from fsobs.analysis.whatif.replay import (
    BUSY,
    EXPOSED,
    KINDS,
    LOCAL,
    WAIT,
    Changes,
    Piece,
    SegmentGraph,
    replay_totals,
)
from optim.markers import EMBEDDING_ROLES

QUEUE_SLACK_NS = 50_000


def prioritize(
    graph: SegmentGraph, overlap: dict[int, float] | None = None
) -> tuple[SegmentGraph, list[str]]:
    """The rewritten graph and what was changed, in words; ``overlap``: per step, PEC's
    overlapped share (:func:`pec_overlap`; None: the dense ordering alone)."""
    out = graph.copy()
    notes = []
    held: set[int] = set()
    if overlap is not None:
        held, steps = pec(out, overlap)
        share = float(np.mean([overlap[s] for s in steps])) if steps else 0.0
        notes.append(
            f"PEC: {len(steps)} step(s) rewritten with a mean overlapped share of "
            f"{share:.2f}: the other share of the forward lookup and backward gradient "
            "all-to-alls hidden (a step ahead, deferred), two blocking mask all-to-alls and "
            "the extra lookups added"
        )
    table = out.instances.set_index("instance")
    emb = table[table["role"].isin(EMBEDDING_ROLES)]  # PEC's collectives are embedding ones
    dense = table[table["role"] == "dense"]
    shared = _share(out, emb, dense)
    queued = _queued_pairs(out, emb[~emb.index.isin(held)], dense[~dense.index.isin(held)])
    for d, k in queued:
        _reorder(out, d, k)
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
        source = _own(chain, held[0])
        source.arrivals = [a for a in source.arrivals if a[0] != k]
        source.changed()
        target = _own(chain, piece)
        target.arrivals.append((k, position))
        target.changed()
        at = [i for i, p in enumerate(chain) if p.kind == EXPOSED and p.owner == d]
        if not at:
            continue
        moved = [_own(chain, i) for i in at]  # _rehome empties their arrivals
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
        after = (j for j in range(i + 1, len(chain)) if id(chain[j]) not in ids)
        j = next(after, None)
        if j is None:
            continue
        host = _own(chain, j)
        zero = np.zeros_like(host.lengths) if host.kind == LOCAL else 0
        host.arrivals = [(inst, zero) for inst, _ in piece.arrivals] + host.arrivals
        piece.arrivals = []
        host.changed()
        piece.changed()


def _own(chain: list[Piece], i: int) -> Piece:
    """Piece ``i`` of a rewritten graph's chain, made its own before it is changed (the
    graph shares its pieces with the one it was copied from: :meth:`SegmentGraph.copy`)."""
    chain[i] = chain[i].copy()
    return chain[i]


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


PEC_TABLES = ("t_item", "t_cat")
"""The tables PEC takes in the reference job: its ``EmbeddingCollection`` ones (its
``EmbeddingBagCollection`` stays plain torchrec). A run that records none of them (another
job) is read over every table it records."""


def pec_overlap(
    sidecar: pd.DataFrame | None, tables: tuple[str, ...] = PEC_TABLES
) -> dict[int, float] | None:
    """Per step, the mean over ``tables`` of the sidecar's ``id_overlap`` (over every recorded
    table when none of ``tables`` is recorded; a step without one, the first: 0, PEC looks it
    all up ahead); None when no step has one."""
    if sidecar is None or sidecar.empty or "id_overlap" not in sidecar.columns:
        return None
    recorded = {t for d in sidecar["id_overlap"] if isinstance(d, dict) for t in d}
    wanted = [t for t in tables if t in recorded] or sorted(recorded)
    out: dict[int, float] = {}
    seen = False
    for step, group in sidecar.groupby("step"):
        shares = [d for d in group["id_overlap"] if isinstance(d, dict)]
        values = [float(shares[0][t]) for t in wanted if shares and t in shares[0]]
        seen |= bool(values)
        out[int(cast(int, step))] = float(np.mean(values)) if values else 0.0
    return out if seen else None


def pec(graph: SegmentGraph, overlap: dict[int, float]) -> tuple[set[int], list[int]]:
    """Rewrite every step of ``graph`` with an overlapped share as PEC runs it (the module
    docstring); the instances it touched (each step's F, D, B and masks) and the steps."""
    order = graph.spans.groupby("instance")["start_ns"].median()
    table = graph.instances.assign(t=graph.instances["instance"].map(order))
    next_id = max(graph.transfer_ns, default=-1) + 1
    held: set[int] = set()
    done: list[int] = []
    new_rows = []
    chains = {rank: _Chain(graph.pieces[rank]) for rank in graph.ranks}
    for step, rows in table.groupby("step"):
        o = overlap.get(int(cast(int, step)))
        deferred = 1 - overlap.get(int(cast(int, step)) - 1, 1.0)  # the previous step's rest
        found = _pec_targets(rows.sort_values(["t", "instance"]))
        if o is None or found is None:
            continue
        f, prev, d, b = found
        emb = rows[rows["role"] == "embedding"]["instance"].astype(int)
        x_mask = min(graph.transfer_ns[int(k)] for k in emb)
        graph.transfer_ns[f] = int(round(o * graph.transfer_ns[f]))
        graph.transfer_ns[b] = int(round(o * graph.transfer_ns[b]))
        masks = (next_id, next_id + 1)
        next_id += 2
        inserted = 0
        for rank in graph.ranks:
            chain = chains[rank]
            lookup = _busy_between(chain, int(cast(int, step)), prev, f)
            extra = int(round(2 * deferred * lookup))
            if _insert_masks(chain, int(cast(int, step)), f, masks, extra):
                inserted += 1
                for m in masks:
                    graph.end_delta_ns[(m, rank)] = 0
            _wait_on_dense(chain, int(cast(int, step)), d, b)
        if inserted:
            row = rows[rows["instance"] == f].iloc[0]
            for m in masks:
                graph.transfer_ns[m] = x_mask
                graph.members[m] = inserted
                new_rows.append(
                    {
                        "instance": m,
                        "role": "pec_mask",
                        "group": row["group"],
                        "coll": "all_to_all",
                        "step": row["step"],
                        "last_arrival_ns": row["last_arrival_ns"],
                        "end_ns": row["last_arrival_ns"],
                        "msg_bytes": 0,
                    }
                )
        held |= {f, d, b, *masks}
        done.append(int(cast(int, step)))
        roles = graph.instances["role"].to_numpy(dtype=object)
        roles[graph.instances["instance"].to_numpy() == f] = "pec_overlapped"
        roles[graph.instances["instance"].to_numpy() == b] = "pec_overlapped_grad"
        graph.instances["role"] = roles
    if new_rows:
        graph.instances = pd.concat([graph.instances, pd.DataFrame(new_rows)], ignore_index=True)
    for rank, chain in chains.items():
        graph.pieces[rank] = chain.pieces()
    return held, done


class _Chain:
    """One rank's chain as :func:`pec` rewrites it: the measured pieces, indexed once (the
    first piece holding each instance's arrival, the first blocked piece of each owner), and
    the pieces PEC inserts, put in place once at the end (:meth:`pieces`).

    PEC looks up only measured instances (F, D, B and the one before F), never the masks it
    inserts, and inserted pieces hold only the masks' arrivals and block on the masks or on
    D: so the index of the measured pieces answers every look-up, and the measured pieces'
    order is the rewritten chain's.
    """

    def __init__(self, pieces: list[Piece]) -> None:
        self.measured = pieces
        self.arrival: dict[int, tuple[int, np.ndarray | int]] = {}
        self.blocked: dict[int, int] = {}
        self.step_start: dict[int, int] = {}  # step -> its first piece
        for i, piece in enumerate(pieces):
            for who, position in piece.arrivals:
                self.arrival.setdefault(who, (i, position))
            if piece.kind != LOCAL:
                self.blocked.setdefault(piece.owner, i)
            self.step_start.setdefault(piece.step, i)
        # per gap (before measured piece i; i == len: at the end), the blocks put right after
        # the piece before it (each one ahead of those already there) and right before piece i
        self.front: dict[int, list[list[Piece]]] = {}
        self.back: dict[int, list[list[Piece]]] = {}

    def insert_after(self, i: int, new: list[Piece]) -> None:
        """``new`` right after measured piece ``i`` (``chain[i + 1 : i + 1] = new``)."""
        self.front.setdefault(i + 1, []).append(new)

    def insert_before(self, i: int, new: list[Piece]) -> None:
        """``new`` right before measured piece ``i`` (``chain[i:i] = new``)."""
        self.back.setdefault(i, []).append(new)

    def pieces(self) -> list[Piece]:
        """The rewritten chain."""
        if not self.front and not self.back:
            return self.measured
        out: list[Piece] = []
        for i in range(len(self.measured) + 1):
            for block in reversed(self.front.get(i, [])):
                out.extend(block)
            for block in self.back.get(i, []):
                out.extend(block)
            if i < len(self.measured):
                out.append(self.measured[i])
        return out


def _pec_targets(rows: pd.DataFrame) -> tuple[int, int | None, int, int] | None:
    """(F, the embedding collective before F or None, D, B) of one step's instances in issue
    order: D the first dense one, B the first embedding one after it, F the embedding one
    before D that moves the most bytes (the embeddings, not the IDs), or where sizes do not
    tell, the one followed by the longest stretch without an embedding collective (the dense
    forward after the lookup)."""
    dense = rows[rows["role"] == "dense"]
    emb = rows[rows["role"] == "embedding"]
    if dense.empty:
        return None
    t_d = float(dense["t"].iloc[0])
    before, after = emb[emb["t"] < t_d], emb[emb["t"] > t_d]
    if len(before) < 2 or after.empty:
        return None
    sizes = before["msg_bytes"].to_numpy(np.int64)
    if (sizes > 0).all() and (sizes == sizes.max()).sum() == 1:
        i = int(np.argmax(sizes))
    else:
        i = int(np.argmax(np.diff(before["t"].to_numpy(np.float64))))
    ids = before["instance"].astype(int).tolist()
    prev = ids[i - 1] if i > 0 else None
    return ids[i], prev, int(dense["instance"].iloc[0]), int(after["instance"].iloc[0])


def _busy_between(chain: _Chain, step: int, first: int | None, then: int) -> int:
    """The rank's busy time in ``step`` from its arrival at ``first`` (None: the step's start)
    to its arrival at ``then``: the lookup, when ``first`` is the embedding collective before
    the lookup's output all-to-all ``then``; 0 without those arrivals. (Pieces inserted for
    other steps would count nothing: the measured chain gives it.)"""
    end = chain.arrival.get(then)
    start = (0, None) if first is None else chain.arrival.get(first)
    if end is None or start is None:
        return 0
    busy = 0
    # from the step's first piece on at the earliest: the pieces before it count nothing
    for i in range(max(start[0], chain.step_start.get(step, end[0] + 1)), end[0] + 1):
        piece = chain.measured[i]
        if piece.step != step or piece.kind != LOCAL or piece.lengths is None:
            continue
        hi = _busy_at(end[1]) if i == end[0] else int(piece.lengths[BUSY])
        lo = _busy_at(start[1]) if i == start[0] else 0
        busy += max(0, hi - lo)
    return busy


def _busy_at(position: np.ndarray | int | None) -> int:
    """The busy time of a local piece before an arrival at ``position`` in it."""
    return int(position[BUSY]) if isinstance(position, np.ndarray) else 0


def _zero_local(step: int, arrivals: list[int], busy: int = 0) -> Piece:
    lengths = np.zeros(len(KINDS), np.int64)
    lengths[BUSY] = busy
    return Piece(
        step,
        LOCAL,
        lengths=lengths,
        parts=[(BUSY, busy)] if busy else [],
        arrivals=[(k, np.zeros(len(KINDS), np.int64)) for k in arrivals],
    )


def _insert_masks(
    chain: _Chain, step: int, f: int, masks: tuple[int, int], extra_busy: int
) -> bool:
    """Put the two blocking mask exchanges and the extra lookups before F's first blocked
    piece (or after the piece that holds F's arrival); False when the rank has no F."""
    held = chain.arrival.get(f)
    if held is None:
        return False
    m1, m2 = masks
    new = [
        _zero_local(step, [m1]),
        Piece(step, WAIT, owner=m1),
        Piece(step, EXPOSED, owner=m1),
        _zero_local(step, [m2]),
        Piece(step, WAIT, owner=m2),
        Piece(step, EXPOSED, owner=m2),
        _zero_local(step, [], extra_busy),
    ]
    spot = chain.blocked.get(f)
    if spot is None:
        chain.insert_after(held[0], new)
    else:
        chain.insert_before(spot, new)
    return True


def _wait_on_dense(chain: _Chain, step: int, d: int, b: int) -> None:
    """Block on the dense all-reduce D before B's first blocked piece (D arrived before it)."""
    spot = chain.blocked.get(b)
    where = chain.arrival.get(d)
    if spot is None or where is None or where[0] >= spot:
        return
    chain.insert_before(spot, [Piece(step, WAIT, owner=d), Piece(step, EXPOSED, owner=d)])


def embedding_blocked_ms(graph: SegmentGraph, changes: Changes | None = None) -> float:
    """Straggler wait + exposed communication in embedding collectives (PEC's roles, its
    masks included) in a replay of ``graph``, ms per rank and step."""
    owners: dict[int, float] = {}
    replay_totals(graph, changes, owners)
    return embedding_ms(graph, owners)


def embedding_ms(graph: SegmentGraph, owners: dict[int, float]) -> float:
    """Of a replay's blocked ns per instance (``by_owner`` of
    :func:`fsobs.analysis.whatif.replay.replay_totals`), those of the embedding collectives,
    ms per rank and step."""
    roles = graph.instances.set_index("instance")["role"]
    mine = set(roles[roles.isin(EMBEDDING_ROLES)].index.astype(int))
    total = sum(ns for k, ns in owners.items() if k in mine)
    return total / 1e6 / max(1, len(graph.ranks) * len(graph.steps))
