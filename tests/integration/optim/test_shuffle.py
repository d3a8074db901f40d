"""Shuffle mode over real gloo process groups (spawned ranks): every row lands exactly once, on
the rank the plan says, and a diverged plan fails on every rank."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from optim.plan import BalanceConfig, StepPlan  # noqa: E402
from optim.shuffle import PlanDivergedError, ShuffleBalancer, check_plan  # noqa: E402
from tests.support.dist import run_ranks  # noqa: E402

pytestmark = pytest.mark.multiprocess


def _rows(num: int, seed: int) -> list[np.ndarray]:
    """Row i: [i, L, L payload values] with heavy-tailed L."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.lognormal(3.0, 1.0, num).astype(np.int64) + 1, 400)
    return [np.concatenate([[i, n], rng.integers(0, 1000, n)]) for i, n in enumerate(lengths)]


def _costs(rows: list[np.ndarray]) -> np.ndarray:
    lengths = np.array([r[1] for r in rows], dtype=np.float64)
    return 50.0 + 2.0 * lengths + 0.1 * lengths**2


def _shares(num_rows: int, world: int, uneven: bool) -> list[tuple[int, int]]:
    """Contiguous [start, stop) of each rank; ``uneven``: rank r holds r+1 units more."""
    if not uneven:
        per = num_rows // world
        return [(r * per, (r + 1) * per) for r in range(world)]
    bounds = np.cumsum([0] + [num_rows // world + (r - world // 2) for r in range(world)])
    bounds[-1] = num_rows
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True))


def _shuffle_main(rank, world, out, method, uneven, num_rows):
    rows = _rows(num_rows, seed=7)
    start, stop = _shares(num_rows, world, uneven)[rank]
    mine = rows[start:stop]
    balancer = ShuffleBalancer(BalanceConfig(enabled=True, method=method, mode="shuffle"))
    got, plan = balancer(0, mine, _costs(mine))
    record = {
        "ids": [int(r[0]) for r in got],
        "intact": all(np.array_equal(r, rows[int(r[0])]) for r in got),
        "digest": plan.digest,
        "before": plan.imbalance_before,
        "after": plan.imbalance_after,
    }
    (out / f"rank{rank}.json").write_text(json.dumps(record))


@pytest.mark.parametrize(
    ("world", "method", "uneven"),
    [(2, "kk", False), (4, "kk", False), (4, "lpt", False), (3, "kk", True)],
)
def test_shuffle_exchanges_every_row_exactly_once(tmp_path, world, method, uneven):
    num_rows = 48
    run_ranks(_shuffle_main, world, tmp_path, method, uneven, num_rows)
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    rows = _rows(num_rows, seed=7)
    expected = StepPlan.make(
        _costs(rows), world, BalanceConfig(enabled=True, method=method, mode="shuffle")
    )
    assert sorted(i for rec in records for i in rec["ids"]) == list(range(num_rows))
    for rank, rec in enumerate(records):
        assert rec["ids"] == expected.parts[rank].tolist()  # the plan's part, in position order
        assert rec["intact"]  # payloads arrive unchanged
        assert rec["digest"] == expected.digest
    if method == "kk":
        assert {len(rec["ids"]) for rec in records} == {num_rows // world}
    assert records[0]["after"] == pytest.approx(expected.imbalance_after)
    assert expected.imbalance_after < expected.imbalance_before
    assert expected.imbalance_after < 1.1


def _diverge_main(rank, world, out):
    check_plan("same", 3)  # agreeing ranks pass
    try:
        check_plan("aaaa" if rank == 0 else "bbbb", 4)
    except PlanDivergedError as err:
        (out / f"rank{rank}.txt").write_text(str(err))


def test_diverged_plan_fails_on_every_rank(tmp_path):
    run_ranks(_diverge_main, 2, tmp_path)
    for rank in range(2):
        message = (tmp_path / f"rank{rank}.txt").read_text()
        assert message.startswith("balance plan diverged at step 4")
        assert "rank 0: aaaa, rank 1: bbbb" in message
