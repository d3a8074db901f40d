"""A padded cost model through the facade: ``FreeScale.split``, ``fs.shares`` and the batch
sampler plan with the padded objective (2 real gloo ranks for FreeScale)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from optim.balance import CostModel  # noqa: E402
from optim.config import FreeScaleConfig  # noqa: E402
from optim.freescale import FreeScale  # noqa: E402
from optim.plan import BalanceConfig  # noqa: E402
from optim.sampler import BalancedBatchSampler  # noqa: E402
from tests.support.dist import run_ranks  # noqa: E402

PAD = CostModel(c0=0.0, a=0.0, b=0.0, padded=1.0)
LENGTHS = [6, 6, 5, 5, 5, 5]
"""On 2 ranks with unequal counts the padded split is [6 6] [5 5 5 5]
(tests/unit/optim/test_padded.py:
costs 72 and 100; KK on L² gives [6 5 5] twice, 108 each)."""
UNEQUAL = BalanceConfig(enabled=True, counts="unequal", check_every=1)


def _rank(rank: int, world_size: int, out: Path) -> None:
    with FreeScale(FreeScaleConfig(balance=UNEQUAL), cost_model=PAD) as fs:
        fs.setup()
        share = fs.split(0, np.array(LENGTHS))  # the digest is checked across the ranks
        (ahead,) = list(fs.shares([np.array(LENGTHS)], first_step=1))
        with pytest.raises(ValueError, match="^padded: "):
            fs.costs(np.array(LENGTHS))  # no per-sample cost
    row = {
        "positions": share.positions.tolist(),
        "scale": share.loss_scale,
        "ahead": ahead.positions.tolist(),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(row))


def test_split_plans_a_padded_model_on_two_ranks(tmp_path: Path) -> None:
    run_ranks(_rank, 2, tmp_path)
    rows = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [row["positions"] for row in rows] == [[0, 1], [2, 3, 4, 5]]
    assert [row["ahead"] for row in rows] == [[0, 1], [2, 3, 4, 5]]
    assert [row["scale"] for row in rows] == [2 * 2 / 6, 2 * 4 / 6]  # W · n_r / N


def test_the_sampler_plans_a_padded_model() -> None:
    """Without shuffling, the one global batch is the dataset in order: the padded split."""
    shares = [
        list(
            BalancedBatchSampler(
                range(6),
                LENGTHS,
                batch_size=3,
                world_size=2,
                rank=r,
                config=UNEQUAL,
                costs=PAD,
                shuffle=False,
            )
        )
        for r in (0, 1)
    ]
    assert [[list(b) for b in s] for s in shares] == [[[0, 1]], [[2, 3, 4, 5]]]
    assert shares[0][0].share.digest == shares[1][0].share.digest
    assert shares[0][0].share.num_samples == 6 and shares[0][0].share.num_tokens == 32


def test_the_sampler_with_a_window_refuses_a_padded_model() -> None:
    config = BalanceConfig(enabled=True, method="lpt", window=2)
    sampler = BalancedBatchSampler(
        range(12), [1] * 12, batch_size=3, world_size=2, rank=0, config=config, costs=PAD
    )
    with pytest.raises(ValueError, match="^window: "):
        list(sampler)
