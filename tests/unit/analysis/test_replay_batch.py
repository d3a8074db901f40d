"""What-if's batched replay: several replays of one graph in one walk, each exactly what it gives
alone, on the hand-built two-rank graph of ``test_whatif.py`` (waits known by hand); and the
stages ``whatif`` reports as it goes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fsobs.analysis import analyze_path
from fsobs.analysis.whatif.graph import BUSY, EXPOSED, IDLE, KINDS, WAIT
from fsobs.analysis.whatif.predict import whatif
from fsobs.analysis.whatif.replay import Changes, replay_batch, replay_totals
from fsobs.simulate.simulator import SimConfig, simulate, write_run
from tests.unit.analysis.test_whatif import MS, _two_ranks


def _batch() -> list[Changes]:
    half = np.ones((2, 1, len(KINDS)))
    half[0, 0, BUSY] = 0.5  # rank 0 computes twice as fast
    late = Changes(extra_idle_ns=np.array([[0.0], [3 * MS]]))  # rank 1 starts 3 ms later
    return [Changes(), Changes(scale=half), late]


def test_each_replay_of_a_batch_is_the_replay_alone() -> None:
    # rank 0 computes 10 ms, rank 1 4 ms, then a 2 ms transfer, then 5 ms each
    graph = _two_ranks({0: (10.0, 5.0), 1: (4.0, 5.0)}, transfer_ms=2.0)
    batch = _batch()
    totals = replay_batch(graph, batch)
    assert totals.shape == (3, 2, 1, len(KINDS))
    blocked = []
    for b, changes in enumerate(batch):
        alone: dict[int, float] = {}
        assert np.array_equal(totals[b], replay_totals(graph, changes, alone))  # bit for bit
        owners: dict[int, float] = {}
        assert np.array_equal(replay_batch(graph, batch, owners, b), totals)
        assert owners[0] == alone[0]  # replay b's blocked time, as it gives alone
        blocked.append(owners[0])
    ms = totals[:, :, 0, :] / MS  # [replay, rank, class]
    # unchanged: rank 1 waits 10 - 4 ms, both ranks see the 2 ms transfer
    assert ms[0, 1, WAIT] == pytest.approx(6.0) and ms[0, 0, WAIT] == 0.0
    assert ms[0, :, EXPOSED] == pytest.approx([2.0, 2.0])
    # rank 0 at half: it arrives at 5 ms, rank 1 at 4 ms, so rank 1 waits 1 ms
    assert ms[1, 1, WAIT] == pytest.approx(1.0) and ms[1, 0, BUSY] == pytest.approx(7.5)
    # rank 1 3 ms late: host idle 3 ms, then it waits 10 - (3 + 4) ms
    assert ms[2, 1, IDLE] == pytest.approx(3.0) and ms[2, 1, WAIT] == pytest.approx(3.0)
    # blocked ns per instance, over both ranks: wait + 2 x the transfer
    assert np.array(blocked) / MS == pytest.approx([6.0 + 4.0, 1.0 + 4.0, 3.0 + 4.0])


def test_a_batch_of_one_is_the_plain_replay() -> None:
    graph = _two_ranks({0: (3.0, 1.0), 1: (7.0, 2.0)}, transfer_ms=1.0)
    totals = replay_batch(graph, [Changes()])
    assert np.array_equal(totals[0], replay_totals(graph))
    assert totals[0, 0, 0, WAIT] / MS == pytest.approx(4.0)  # rank 0 waits for rank 1's 7 ms


def test_whatif_reports_its_stages(tmp_path: Path) -> None:
    cfg = replace(SimConfig(), world_size=4, steps=3, seed=0)
    write_run(simulate(cfg, ()), tmp_path / "run", workers=1)
    calls: list[tuple[int, int, str]] = []
    result = whatif(
        analyze_path(tmp_path / "run"), draws=4, progress=lambda *call: calls.append(call)
    )
    assert result.draws == 4
    # graph, the replays without PEC, with PEC, the oracle; then done. 4 combinations replay
    # each graph ((), balance, sm_free, both; and the same with priority_overlap), each with
    # the 4 draws and the run's own residuals
    assert calls == [
        (0, 4, "the segment graph of the run"),
        (1, 4, "20 replays"),
        (2, 4, "20 replays with priority_overlap"),
        (3, 4, "the oracle and the replay check"),
        (4, 4, ""),
    ]
