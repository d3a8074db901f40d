"""The sm_free toggle's padded equal-split all-to-all over real gloo ranks.

Symmetric memory and the copy engines are GPU-only; here the buffers are plain CPU tensors
(``SMFreePath._symmetric`` replaced), so what is tested is everything else: per-peer padding to
an agreed capacity, the equal-split exchange, the unpadding, the wait semantics, the byte
accounting. Every rank's output must equal what torch's uneven ``all_to_all_single`` gives.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from optim.sm_free import SMFreePath  # noqa: E402
from tests.support.dist import run_ranks  # noqa: E402

pytestmark = pytest.mark.multiprocess


def _splits(world: int, rank: int, call: int) -> list[int]:
    """Rows rank ``rank`` sends each peer in call ``call``: uneven, some zero."""
    return [(rank * 3 + peer * 5 + call * 7) % 6 for peer in range(world)]


def _plain_buffers(self, rows, like):
    return like.new_empty((rows, *like.shape[1:])), like.new_empty((rows, *like.shape[1:]))


def _main(rank: int, world: int, out: Path) -> None:
    SMFreePath._symmetric = _plain_buffers  # type: ignore[method-assign]
    path = SMFreePath(dist.group.WORLD)
    equal = []
    for call in range(3):
        send = _splits(world, rank, call)
        recv = [_splits(world, peer, call)[rank] for peer in range(world)]
        data = torch.arange(sum(send) * 4, dtype=torch.float32).reshape(-1, 4) + 1000 * rank
        want = torch.empty(sum(recv), 4)
        dist.all_to_all_single(want, data, recv, send)
        got = torch.full((sum(recv), 4), -1.0)
        work = path.all_to_all_single(got, data, recv, send, async_op=True)
        work.wait()
        equal.append(bool(torch.equal(got, want)))
    record = {"equal": equal, "capacity": path.capacity, "stats": vars(path.stats)}
    (out / f"rank{rank}.json").write_text(json.dumps(record))


@pytest.mark.parametrize("world", [2, 3])
def test_padded_all_to_all_equals_the_uneven_one(tmp_path, world):
    run_ranks(_main, world, tmp_path)
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    largest = max(
        max(_splits(world, r, c)) for r in range(world) for c in range(3)
    )  # every chunk of every rank and call, the capacity the ranks agree on
    for rank, rec in enumerate(records):
        assert rec["equal"] == [True, True, True]
        assert rec["capacity"] == largest
        useful = sum(sum(_splits(world, rank, c)) for c in range(3)) * 4 * 4  # rows x 4 floats
        assert rec["stats"]["useful_bytes"] == useful
        assert rec["stats"]["calls"] == 3
        capacity, sent = 0, 0
        for c in range(3):  # the agreed capacity never shrinks
            capacity = max(capacity, max(max(_splits(world, r, c)) for r in range(world)))
            sent += world * capacity * 4 * 4
        assert rec["stats"]["sent_bytes"] == sent
