"""A loss over a subset of each sample's tokens (masked positions, candidates): ``loss_counts``
weights it, the share rides in any batch, and a loop can ask for its share by step.

The expected gradient is the global batch's own loss, computed in one process: the mean of the
squared errors over every loss term of the global batch, whatever the split. The ranks'
gradients are averaged as DDP averages them; with plain SGD (no per-step normalization, unlike
Adam or Adagrad) a wrong factor shows in the parameters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from optim.balance import CostModel
from optim.plan import BalanceConfig
from optim.sampler import BalancedBatchSampler, BatchShare, ShareCollate, ShareDataset

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

from optim.loader import ShareLoader  # noqa: E402
from tests.support.dist import run_ranks  # noqa: E402

N, DIM, WORLD, BATCH = 40, 3, 2, 5  # 4 global batches of 10 samples
COST = CostModel(c0=1.0, a=0.5, b=0.05)


class _Masked:
    """Sample ``i``: ``lengths[i]`` positions, of which ``counts[i]`` are in the loss (the
    masked ones: at least one), each with a feature vector and a target."""

    def __init__(self) -> None:
        rng = np.random.default_rng(11)
        self.lengths = 2 + np.minimum(rng.pareto(1.1, N) * 6, 60).astype(np.int64)
        self.counts = np.maximum(1, (0.15 * self.lengths).astype(np.int64))
        self.x = [rng.normal(size=(int(c), DIM)) for c in self.counts]
        self.y = [rng.normal(size=int(c)) for c in self.counts]

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return i


def _term_sum(w: Any, data: _Masked, ids: list[int]) -> Any:
    """The sum of the squared errors over the loss terms of samples ``ids``."""
    if not ids:
        return w.sum() * 0.0
    x = torch.from_numpy(np.concatenate([data.x[i] for i in ids]))
    y = torch.from_numpy(np.concatenate([data.y[i] for i in ids]))
    return ((x @ w - y) ** 2).sum()


def _train(weight_of: str, config: BalanceConfig, lr: float = 0.05) -> tuple[Any, Any]:
    """SGD over one epoch on ``WORLD`` simulated ranks (each rank's weighted sum, gradients
    averaged as DDP does) and, beside it, on the global batches' own mean over their loss
    terms. ``weight_of``: ``share`` (the share's token-mean weight) or ``tokens`` (W / the
    global batch's tokens, the weight without loss_counts)."""
    data = _Masked()
    samplers = [
        BalancedBatchSampler(
            data,
            data.lengths,
            batch_size=BATCH,
            world_size=WORLD,
            rank=r,
            config=config,
            costs=COST,
            seed=3,
            loss_counts=data.counts,
        )
        for r in range(WORLD)
    ]
    w = torch.zeros(DIM, dtype=torch.float64)
    ref = torch.zeros(DIM, dtype=torch.float64)
    for shares in zip(*samplers, strict=True):
        grads = []
        for share in shares:
            p = w.clone().requires_grad_()
            weight = (
                share.share.loss_weight("token_mean")
                if weight_of == "share"
                else WORLD / share.share.num_tokens
            )
            (weight * _term_sum(p, data, list(share))).backward()
            grads.append(p.grad)
        w = w - lr * sum(grads) / WORLD
        everyone = [i for share in shares for i in share]
        q = ref.clone().requires_grad_()
        terms = int(data.counts[everyone].sum())
        (_term_sum(q, data, everyone) / terms).backward()
        ref = ref - lr * q.grad
    return w, ref


@pytest.mark.parametrize(
    "config",
    [BalanceConfig(), BalanceConfig(enabled=True), BalanceConfig(enabled=True, method="lpt")],
    ids=["off", "kk", "lpt"],
)
def test_sgd_with_the_share_weight_trains_the_global_mean_over_loss_terms(config):
    w, ref = _train("share", config)
    assert float(ref.abs().max()) > 0.05  # it moved
    torch.testing.assert_close(w, ref, rtol=1e-12, atol=1e-12)


def test_the_weight_of_the_tokens_trains_another_model():
    """Without loss_counts the token mean's weight is W over the global batch's lengths: about
    0.15 of the right one here, and SGD shows it."""
    w, ref = _train("tokens", BalanceConfig(enabled=True))
    assert float((w - ref).abs().max()) > 0.1 * float(ref.abs().max())


def test_the_share_counts_the_loss_terms_and_the_tokens_apart():
    data = _Masked()
    sampler = BalancedBatchSampler(
        data, data.lengths, batch_size=BATCH, world_size=WORLD, rank=0,
        config=BalanceConfig(enabled=True), costs=COST, seed=3,
        loss_counts=lambda i: int(data.counts[i]),
    )  # fmt: skip
    partner = BalancedBatchSampler(
        data, data.lengths, batch_size=BATCH, world_size=WORLD, rank=1,
        config=BalanceConfig(enabled=True), costs=COST, seed=3,
    )  # fmt: skip
    for mine, theirs in zip(sampler, partner, strict=True):
        everyone = list(mine) + list(theirs)
        assert mine.share.num_tokens == theirs.share.num_tokens == data.lengths[everyone].sum()
        assert mine.share.num_loss_terms == data.counts[everyone].sum()
        assert theirs.share.num_loss_terms == theirs.share.num_tokens  # no loss_counts
        assert mine.share.loss_weight("token_mean") == WORLD / data.counts[everyone].sum()
        assert mine.share.loss_weight("mean") == WORLD / len(everyone)


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        (np.ones(N - 1, np.int64), "loss_counts: 39 values for a dataset of 40"),
        (-np.ones(N, np.int64), "loss_counts: must be >= 0"),
        (np.ones(N) / 2, "loss_counts: must be integers"),
    ],
)
def test_bad_loss_counts_name_the_field(counts, message):
    data = _Masked()
    with pytest.raises(ValueError, match=message):
        sampler = BalancedBatchSampler(
            data, data.lengths, batch_size=BATCH, world_size=WORLD, rank=0,
            config=BalanceConfig(), costs=COST, loss_counts=counts,
        )  # fmt: skip
        list(sampler)


# ------------------------------------------------------------------- the share in any batch


class _EveryAttribute:
    """A batch whose ``to`` moves every attribute (as HSTU's batch does)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def to(self, device: Any, non_blocking: bool = False) -> _EveryAttribute:
        return _EveryAttribute(
            **{k: v.to(device, non_blocking=non_blocking) for k, v in vars(self).items()}
        )


def test_a_share_rides_in_a_batch_that_moves_every_attribute():
    share = BatchShare(
        epoch=0, step=3, rank=1, world_size=2, num_samples=8, num_tokens=40,
        num_loss_terms=6, digest="d",
    )  # fmt: skip
    batch = _EveryAttribute(ids=torch.arange(4), share=share)
    moved = batch.to(torch.device("cpu"), non_blocking=True)
    assert moved.share is share and torch.equal(moved.ids, batch.ids)
    assert share.pin_memory() is share and share.to("meta") is share
    assert share.record_stream(torch.cpu.current_stream()) is None
    assert share.loss_weight("token_mean") == 2 / 6


# --------------------------------------------------------- the share by step, set_epoch


def _collate(samples: list[int], share: BatchShare) -> tuple[list[int], BatchShare]:
    return list(samples), share


def _sampler(rank: int = 0, **kw: Any) -> BalancedBatchSampler:
    data = _Masked()
    return BalancedBatchSampler(
        data, data.lengths, batch_size=BATCH, world_size=WORLD, rank=rank,
        config=BalanceConfig(enabled=True), costs=COST, seed=3, **kw,
    )  # fmt: skip


def test_the_share_by_step_is_right_while_the_loader_fetches_ahead():
    sampler = _sampler()
    loader = DataLoader(
        ShareDataset(_Masked()),
        batch_sampler=sampler,
        collate_fn=ShareCollate(_collate),
        num_workers=2,
        prefetch_factor=2,
    )
    ahead = []
    for step, (_, share) in enumerate(loader):
        assert sampler.share(step) == share and share.step == step
        ahead.append(sampler.served - (step + 1))
    assert max(ahead) >= 1  # the sampler had served later batches when this one trained
    with pytest.raises(ValueError, match="step: the sampler has not yielded step 9 of epoch 0"):
        sampler.share(9)
    assert sampler.share(1, epoch=0).step == 1


def test_loader_sampler_set_epoch_works_and_a_forgotten_one_names_batch_sampler():
    sampler = _sampler()
    loader = ShareLoader(_Masked(), sampler, _collate)
    assert loader.sampler is sampler is loader.batch_sampler
    loader.sampler.set_epoch(0)
    zero = [ids for ids, _ in loader]
    loader.sampler.set_epoch(1)
    one = [ids for ids, _ in loader]
    assert zero != one and len(set(sum(zero, []))) == len(set(sum(one, []))) == N // WORLD
    plain = DataLoader(
        ShareDataset(_Masked()), batch_sampler=_sampler(), collate_fn=ShareCollate(_collate)
    )
    assert not hasattr(plain.sampler, "set_epoch")  # torch's own SequentialSampler
    list(plain)
    with pytest.warns(UserWarning, match=r"loader\.batch_sampler\.set_epoch\(epoch\)"):
        list(plain)
    with pytest.raises(ValueError, match="batch_size: the balanced batch sampler decides it"):
        ShareLoader(_Masked(), _sampler(), _collate, batch_size=4)


def _facade_rank(rank: int, world_size: int, out: Path) -> None:
    from optim.config import FreeScaleConfig
    from optim.freescale import FreeScale
    from optim.sync_gc import SyncGCConfig

    data = _Masked()
    config = FreeScaleConfig(
        balance=BalanceConfig(enabled=True), sync_gc=SyncGCConfig(enabled=True)
    )  # sync_gc: never started (no fs.attach here)
    fs = FreeScale(config, cost_model=COST)
    fs.setup()
    before = fs.status()["balance"]
    loader = fs.loader(
        data, data.lengths, batch_size=BATCH, collate_fn=_collate, loss_counts=data.counts
    )
    loader.sampler.set_epoch(2)
    steps = [(ids, share, fs.share(step)) for step, (ids, share) in enumerate(loader)]
    after = fs.status()["balance"]
    gc_status = fs.status()["sync_gc"]
    fs.close()
    torch.save(
        {"before": before, "after": after, "gc": gc_status, "steps": steps}, out / f"rank{rank}.pt"
    )


@pytest.mark.multiprocess
def test_the_facade_loader_serves_shares_and_a_toggle_is_applied_once_it_acted(tmp_path):
    run_ranks(_facade_rank, 2, tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for r in ranks:
        assert r["before"]["requested"] and not r["before"]["applied"]
        assert "no balanced share was served" in r["before"]["reason"]
        assert r["after"] == {"requested": True, "applied": True, "reason": None}
        assert r["gc"] == {
            "requested": True,
            "applied": False,
            "reason": "not started: automatic collection is turned off at fs.attach",
        }
        assert all(share == by_step for _, share, by_step in r["steps"])
        assert {share.epoch for _, share, _ in r["steps"]} == {2}
    data = _Masked()
    for (a, share, _), (b, _, _) in zip(ranks[0]["steps"], ranks[1]["steps"], strict=True):
        assert share.num_loss_terms == data.counts[a + b].sum()
    served = sorted(i for r in ranks for ids, _, _ in r["steps"] for i in ids)
    assert served == list(range(N))  # every sample once
