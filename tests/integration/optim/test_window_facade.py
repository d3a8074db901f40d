"""FreeScale.split_window on 2 real gloo ranks: every sample of the window once, each share's
loss scale for its own step's count, the plan digest checked across the ranks."""

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
from tests.support.dist import run_ranks  # noqa: E402

COST = CostModel(c0=1.0, a=0.5, b=0.25)
LENGTHS = [[900, 3, 5, 7, 2, 4], [8, 8, 6, 6, 5, 5], [1, 2, 3, 4, 40, 50]]
CONFIG = FreeScaleConfig(balance=BalanceConfig(enabled=True, method="lpt", window=3))


def _rank(rank: int, world_size: int, out: Path) -> None:
    with FreeScale(CONFIG, cost_model=COST) as fs:
        fs.setup()
        with pytest.raises(ValueError, match="balance.window"):
            fs.split(0, np.array(LENGTHS[0]))
        shares = fs.split_window(0, [np.array(b) for b in LENGTHS])
    rows = [
        {"step": s.step, "positions": s.positions.tolist(), "scale": s.loss_scale} for s in shares
    ]
    (out / f"rank{rank}.json").write_text(json.dumps(rows))


def test_split_window_on_two_ranks(tmp_path: Path) -> None:
    run_ranks(_rank, 2, tmp_path)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [[row["step"] for row in rows] for rows in ranks] == [[0, 1, 2]] * 2
    seen = sorted(p for rows in ranks for row in rows for p in row["positions"])
    assert seen == list(range(18))  # the window's 3 x 6 samples, each once
    for step in range(3):
        counts = [len(rows[step]["positions"]) for rows in ranks]
        for rows, n in zip(ranks, counts, strict=True):
            assert rows[step]["scale"] == pytest.approx(2 * n / sum(counts))
    # the 900 (cost ~ 2e5, more than everything else together) trains alone in its step
    whale = next(row for rows in ranks for row in rows if 0 in row["positions"])
    assert whale["positions"] == [0]


SHUFFLE = FreeScaleConfig(
    balance=BalanceConfig(enabled=True, method="lpt", mode="shuffle", window=3, check_every=1)
)


def _shuffle_rank(rank: int, world_size: int, out: Path) -> None:
    """Each rank holds its random-split half of each batch as rows ``[window position, length]``
    and exchanges them once for the window."""
    with FreeScale(SHUFFLE, cost_model=COST) as fs:
        fs.setup()
        rows, lengths = [], []
        for k, batch in enumerate(LENGTHS):
            half = len(batch) // 2
            mine = range(rank * half, (rank + 1) * half)
            rows.append([np.array([6 * k + i, batch[i]], np.int64) for i in mine])
            lengths.append(np.array([batch[i] for i in mine]))
        with pytest.raises(ValueError, match="exchange_window"):
            fs.exchange(0, rows[0], lengths[0])
        got = fs.exchange_window(0, rows, lengths)
    result = [
        {"rows": [r.tolist() for r in step_rows], "positions": share.positions.tolist()}
        for step_rows, share in got
    ]
    (out / f"shuffle{rank}.json").write_text(json.dumps(result))


def test_shuffle_mode_window_trains_what_plan_mode_deals(tmp_path: Path) -> None:
    """Shuffle mode deals a window as plan mode does (the same positions per rank and step:
    the plan of ``split_window`` above), and each rank receives exactly the rows of its
    positions, in position order; every row of the window once."""
    run_ranks(_rank, 2, tmp_path)
    run_ranks(_shuffle_rank, 2, tmp_path)
    pooled = [n for batch in LENGTHS for n in batch]
    seen = []
    for r in (0, 1):
        plan = json.loads((tmp_path / f"rank{r}.json").read_text())
        shuffle = json.loads((tmp_path / f"shuffle{r}.json").read_text())
        assert [s["positions"] for s in shuffle] == [p["positions"] for p in plan]
        for step in shuffle:
            assert step["rows"] == [[p, pooled[p]] for p in step["positions"]]
            seen += step["positions"]
    assert sorted(seen) == list(range(18))
