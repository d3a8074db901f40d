"""priority_overlap's queued pattern on a hand-built graph: an embedding all-to-all queued behind
a dense all-reduce moves ahead of it, the dense transfer overlaps the embedding update, and the
graph it was rewritten from is left as it was (the rewrite shares its pieces: copy on write).

Two ranks, one step (ms). Dense all-reduce d (group 0), embedding all-to-all k (group 0, started
where d ended on both ranks: queued), and an all-reduce z of another group whose arrival sits at
the start of d's exposed piece (it has to stay where it was when that piece moves)::

    rank 0  |busy 10|a d|xx d 3|a k|xx k 2|busy 1|idle .5|busy 5|          window 21.5
    rank 1  |busy 4 |a d|=wait d 6=|xx d 3|a k|xx k 2|busy 1|idle .5|busy 5|

Rewritten: k arrives with d (10 on rank 0, 4 on rank 1), k's transfer goes first (10 -> 12), d's
follows it (12 -> 15) while the embedding update (busy 1) runs (12 -> 13), so each rank is
exposed to d for 15 - 13 = 2 ms instead of 3::

    rank 0  |busy 10|a d,k|xx k 2|busy 1|xx d 2|idle .5|busy 5|           window 20.5
    rank 1  |busy 4 |a d,k|=wait d 6=|xx k 2|busy 1|xx d 2|idle .5|busy 5|
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fsobs.analysis.whatif.priority import prioritize
from fsobs.analysis.whatif.replay import (
    BUSY,
    EXPOSED,
    IDLE,
    KINDS,
    LOCAL,
    WAIT,
    Piece,
    SegmentGraph,
    replay,
    replay_totals,
)

MS = 1_000_000
D, K, Z = 0, 1, 2
BUSY_BEFORE = {0: 10, 1: 4}  # ms of compute before d, per rank


def _local(parts: list[tuple[int, float]], arrivals: list[int], first: bool = False) -> Piece:
    lengths = np.zeros(len(KINDS), np.int64)
    for kind, ms in parts:
        lengths[kind] += int(ms * MS)
    return Piece(
        0,
        LOCAL,
        lengths=lengths,
        parts=[(kind, int(ms * MS)) for kind, ms in parts],
        arrivals=[(inst, lengths.copy()) for inst in arrivals],  # at the piece's end
        first_of_step=first,
    )


def _chain(rank: int) -> list[Piece]:
    before = BUSY_BEFORE[rank]
    chain = [_local([(BUSY, before)], [D], first=True)]
    if before < 10:
        chain.append(Piece(0, WAIT, length=(10 - before) * MS, owner=D))
    chain.append(Piece(0, EXPOSED, length=3 * MS, owner=D, arrivals=[(Z, 0)]))
    chain.append(Piece(0, EXPOSED, length=2 * MS, owner=K, arrivals=[(K, 0)]))
    chain.append(_local([(BUSY, 1), (IDLE, 0.5), (BUSY, 5)], []))
    return chain


def _graph() -> SegmentGraph:
    ranks = [0, 1]
    # measured (ns): d's last arrival 10 ms and end 13, k's 13 and 15; z ends where it arrives
    spans = {D: (BUSY_BEFORE, 13), K: ({0: 13, 1: 13}, 15), Z: ({0: 10, 1: 10}, 10)}
    return SegmentGraph(
        ranks=ranks,
        steps=[0],
        start_ns={0: 0, 1: 0},
        pieces={r: _chain(r) for r in ranks},
        transfer_ns={D: 3 * MS, K: 2 * MS, Z: 0},
        end_delta_ns={(k, r): 0 for k in (D, K, Z) for r in ranks},
        members={D: 2, K: 2, Z: 2},
        instances=pd.DataFrame(
            {
                "instance": [D, K, Z],
                "role": ["dense", "embedding", "dense"],
                "group": ["0", "0", "1"],
                "coll": ["all_reduce", "all_to_all", "all_reduce"],
                "step": [0, 0, 0],
                "last_arrival_ns": [10 * MS, 13 * MS, 10 * MS],
                "end_ns": [13 * MS, 15 * MS, 10 * MS],
                "msg_bytes": [0, 0, 0],
            }
        ),
        spans=pd.DataFrame(
            [
                {"instance": k, "rank": r, "start_ns": start[r] * MS, "end_ns": end * MS}
                for k, (start, end) in spans.items()
                for r in ranks
            ]
        ),
    )


def _ms(table: pd.DataFrame, column: str) -> list[float]:
    return (table.sort_values("rank")[column]).tolist()


def test_the_measured_graph_replays_the_measured_run() -> None:
    table = replay(_graph())
    assert _ms(table, "window_ms") == pytest.approx([21.5, 21.5])
    assert _ms(table, "busy_ms") == pytest.approx([16.0, 10.0])
    assert _ms(table, "straggler_wait_ms") == pytest.approx([0.0, 6.0])
    assert _ms(table, "exposed_comm_ms") == pytest.approx([5.0, 5.0])  # d 3 + k 2


def test_a_queued_embedding_collective_moves_ahead_of_the_dense_one() -> None:
    graph = _graph()
    rewritten, notes = prioritize(graph)
    assert rewritten.after == {D: K}  # d's transfer follows k's
    assert any("1 embedding collective(s) queued behind a dense one" in n for n in notes)
    table = replay(rewritten)
    assert _ms(table, "window_ms") == pytest.approx([20.5, 20.5])
    assert _ms(table, "busy_ms") == pytest.approx([16.0, 10.0])
    assert _ms(table, "straggler_wait_ms") == pytest.approx([0.0, 6.0])  # rank 1 still waits
    assert _ms(table, "exposed_comm_ms") == pytest.approx([4.0, 4.0])  # k 2 + what is left of d, 2
    assert _ms(table, "host_idle_ms") == pytest.approx([0.5, 0.5])
    # blocked ns per instance over both ranks: k 2 + 2; d 2 + (6 + 2) (before: 3 + (6 + 3))
    owners: dict[int, float] = {}
    replay_totals(rewritten, None, owners)
    assert owners[K] / MS == pytest.approx(4.0)
    assert owners[D] / MS == pytest.approx(10.0)
    for rank in graph.ranks:
        chain = rewritten.pieces[rank]
        kinds = [(p.kind, p.owner) for p in chain]
        blocked_k = kinds.index((EXPOSED, K))
        # k's transfer, the embedding update (split off its piece), then d's rest
        assert kinds[blocked_k + 1 :] == [(LOCAL, -1), (EXPOSED, D), (LOCAL, -1)]
        assert chain[blocked_k + 1].parts == [(BUSY, MS)]
        assert [a[0] for a in chain[0].arrivals] == [D, K]  # k arrives with d
        assert chain[blocked_k].arrivals == [(Z, 0)]  # z stays at where d's piece started


def test_the_graph_it_was_rewritten_from_is_unchanged() -> None:
    graph = _graph()
    before = replay(graph)
    arrivals = {r: [list(p.arrivals) for p in graph.pieces[r]] for r in graph.ranks}
    replayed = replay(prioritize(graph)[0])
    assert replayed["window_ms"].tolist() != before["window_ms"].tolist()
    pd.testing.assert_frame_equal(replay(graph), before)
    assert graph.after == {}
    for rank in graph.ranks:
        assert [p.arrivals for p in graph.pieces[rank]] == arrivals[rank]
        assert [(p.kind, p.owner) for p in graph.pieces[rank]] == [
            (p.kind, p.owner) for p in _chain(rank)
        ]
