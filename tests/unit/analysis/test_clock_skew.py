"""Clock skew between ranks that report one host name (containers, VMs; issue 25 point 6).

Every run here is the all_reduce timeline of :func:`tests.support.kineto.write_allreduce_run`, on N
ranks: in step n (n = 1..4, starting at T = (n - 1)(M + 50) µs) rank r computes c_r µs, then all
ranks meet in an all_reduce (``Seq`` n) that ends 20 µs after the last arrival, M = max c_r::

    t (µs)   T+10        T+10+c_r     T+10+M     T+30+M           T+60+M = next T+10
    rank r   |=====c_r=====|~~~wait~~~~|xxxxxxxxxx|    (host idle)   |

so per step: busy c_r, straggler_wait M - c_r, exposed 20, host idle 30 (none in the last
step, whose window ends with its all_reduce). A rank's clock is then shifted by adding a
constant (or growing) amount to every timestamp of its trace; the host name stays the same.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

import fsobs
from fsobs.analysis import analyze
from fsobs.cli import main
from fsobs.report import findings, to_json
from tests.support.bubble_rows import expect_row
from tests.support.kineto import allreduce, gemm, launch, step, trace, write

NUM_STEPS = 4


def _write_run(
    run_dir: Path,
    costs: tuple[int, ...],
    shift_us: Callable[[int, int], float],
    host: str = "host-a",
) -> Path:
    """The timeline of the module docstring; every event of rank r in step n is moved by
    ``shift_us(r, n)`` µs."""
    last = max(costs)
    for rank, cost in enumerate(costs):
        events = []
        for n in range(1, NUM_STEPS + 1):
            start = (n - 1) * (last + 50)
            shift = shift_us(rank, n)
            mine = [
                step(n, start, last + 50),
                launch(start + 1, 2 * n, dur=0.5),
                launch(start + 2, 2 * n + 1, dur=0.5),
                gemm(start + 10, cost, corr=2 * n),
                allreduce(start + 10 + cost, last - cost + 20, n, corr=2 * n + 1),
            ]
            for event in mine:
                event["ts"] += shift
            events += mine
        doc = trace(events, rank=rank, world_size=len(costs), host=host)
        write(run_dir / f"rank{rank}.trace.json", doc)
    return run_dir


def _expect_waits(table, costs: tuple[int, ...]) -> None:
    """The bubble table of the module docstring, row by row."""
    last = max(costs)
    for rank, cost in enumerate(costs):
        for n in range(1, NUM_STEPS + 1):
            idle = 30 if n < NUM_STEPS else 0
            expect_row(
                table,
                rank,
                n,
                window=last + 20 + idle,
                busy=cost,
                straggler_wait=last - cost,
                exposed_comm=20,
                host_idle=idle,
            )


@pytest.mark.parametrize("shift_ms", [10, 1000, -250])
def test_one_rank_on_another_clock_is_aligned(tmp_path, shift_ms):
    """Rank 1's clock runs ``shift_ms`` ahead (or behind) of rank 0's on the same host name:
    both all_reduce ends differ by exactly that, so it is rank 1's offset, and the waits are
    those of the unshifted run (rank 0 waits 300 - 100 = 200 µs per step for rank 1)."""
    costs = (100, 300)
    run_dir = _write_run(tmp_path, costs, lambda r, n: shift_ms * 1000.0 * (r == 1))
    result = analyze(fsobs.load_run(run_dir))
    colls = result.collectives
    assert colls.offsets_ns == {0: 0, 1: shift_ms * 1_000_000}
    assert [(c.name, c.ranks, c.offset_ns, c.issue) for c in colls.clocks] == [
        ("host-a#0", (0,), 0, None),
        ("host-a#1", (1,), shift_ms * 1_000_000, None),
    ]
    assert colls.problems.empty
    _expect_waits(result.steps.set_index(["rank", "step"]), costs)
    assert result.stragglers.per_step["rank"].tolist() == [1] * NUM_STEPS
    lines = findings(result)
    assert (
        "ranks 0, 1 report host 'host-a' but do not share one clock (their collectives end "
        f"more than 2 ms apart): 2 clocks, host-a#0: rank(s) 0; host-a#1: rank(s) 1 (offset "
        f"{shift_ms:.3f} ms)"
    ) in lines
    assert f"estimated clock skew: {abs(shift_ms):.3f} ms" in "\n".join(lines)


def test_two_containers_on_one_host_are_two_clocks(tmp_path):
    """Ranks 0, 1 share one clock, ranks 2, 3 another 50 ms ahead, all reporting one host:
    two clocks, each with its ranks; rank 1 (300 µs) is the straggler and rank r waits
    300 - c_r µs."""
    costs = (100, 300, 150, 200)
    run_dir = _write_run(tmp_path, costs, lambda r, n: 50_000.0 * (r >= 2))
    result = analyze(fsobs.load_run(run_dir))
    colls = result.collectives
    assert colls.offsets_ns == {0: 0, 1: 0, 2: 50_000_000, 3: 50_000_000}
    assert [(c.name, c.ranks) for c in colls.clocks] == [
        ("host-a#0", (0, 1)),
        ("host-a#1", (2, 3)),
    ]
    _expect_waits(result.steps.set_index(["rank", "step"]), costs)
    clocks = to_json(result)["collectives"]["clocks"]
    assert clocks[1] == {
        "name": "host-a#1",
        "host": "host-a",
        "ranks": [2, 3],
        "offset_ms": 50.0,
        "spread_ms": 0.0,
        "aligned": True,
        "issue": None,
    }


def test_one_clock_when_the_ends_agree(tmp_path):
    """No shift: the ranks of the host share its clock, nothing is offset."""
    costs = (100, 300)
    result = analyze(fsobs.load_run(_write_run(tmp_path, costs, lambda r, n: 0.0)))
    assert [(c.name, c.ranks, c.offset_ns) for c in result.collectives.clocks] == [
        ("host-a", (0, 1), 0)
    ]
    _expect_waits(result.steps.set_index(["rank", "step"]), costs)
    assert not any("clock" in line for line in findings(result))


def test_a_drifting_clock_cannot_be_aligned(tmp_path):
    """Rank 1's clock gains 10 ms per step: the all_reduce ends differ by 10, 20, 30, 40 ms,
    whose interquartile range (linear percentiles: 32.5 - 17.5) is 15 ms > 5 ms, so no offset
    aligns it. Its all_reduces with rank 0 are not paired: no straggler wait, and the
    all_reduce time of each rank (300 - c_r + 20 µs) is unattributed communication."""
    costs = (100, 300)
    run_dir = _write_run(tmp_path, costs, lambda r, n: 10_000.0 * n * (r == 1))
    result = analyze(fsobs.load_run(run_dir))
    colls = result.collectives
    assert colls.offsets_ns == {0: 0, 1: 0}
    drifting = colls.clocks[1]
    assert (drifting.name, drifting.offset_ns, drifting.spread_ns) == ("host-a#1", 0, 15_000_000)
    assert colls.instances.empty
    assert (
        colls.problems["issue"].tolist()
        == ["its ranks' clocks cannot be aligned (see the clocks)"] * NUM_STEPS
    )
    steps = result.steps
    assert steps["straggler_wait_ms"].sum() == 0
    unattributed = steps.groupby("rank")["unattributed_comm_ms"].mean()
    assert unattributed.to_dict() == pytest.approx({0: 0.220, 1: 0.020})
    assert (
        "the clock of rank(s) 1 (host-a#1) cannot be aligned: its offset to rank 0's clock "
        "varies by 15.000 ms over the 4 collectives (interquartile range; a drifting clock?): "
        "no single offset aligns it; its collectives with other clocks give no waits (their "
        "time is unattributed communication)"
    ) in findings(result)


def test_cli_json_names_the_clocks(tmp_path, capsys):
    run_dir = _write_run(tmp_path, (100, 300), lambda r, n: 20_000.0 * (r == 1))
    assert main(["analyze", str(run_dir), "--json"]) == 0
    colls = json.loads(capsys.readouterr().out)["collectives"]
    assert colls["clock_offsets_ms"] == {"0": 0.0, "1": 20.0}
    assert [c["name"] for c in colls["clocks"]] == ["host-a#0", "host-a#1"]
