"""optim.weights: with each rank's summed loss times ``loss_weight``, the ranks' averaged
gradient (what DDP computes) is the gradient of the global batch's loss, for every reduction and
for unequal counts and tokens per rank.

The model is a small float64 MLP applied to every token; a token's loss is its squared error,
a sample's loss the sum of its tokens' losses. The reference is the global batch's loss on one
process with torch's own reductions; the shares' gradients are averaged by hand (and by DDP on
two gloo ranks).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from optim.plan import BalanceConfig, StepPlan
from optim.weights import REDUCTIONS, loss_weight

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from tests.support.dist import run_ranks  # noqa: E402

LENGTHS = np.array([1, 5, 2, 6, 1, 3, 4, 2, 7, 1])  # tokens per sample: 32 in all
N, T = LENGTHS.size, int(LENGTHS.sum())
UNEQUAL = [np.arange(0, 7), np.arange(7, 10)]  # 7 samples / 22 tokens vs 3 / 10
TIGHT = {"rtol": 1e-12, "atol": 1e-15}


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, 3, generator=g, dtype=torch.float64)
    y = torch.randn(T, generator=g, dtype=torch.float64)
    return x, y


def _model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)).double()


def _token_losses(model: nn.Module, samples: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token losses, the sample of each token) of ``samples``."""
    x, y = _data()
    starts = np.concatenate([[0], np.cumsum(LENGTHS)])
    tokens = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in samples] or [[]])
    index = torch.from_numpy(tokens.astype(np.int64))
    owner = torch.from_numpy(np.repeat(np.arange(samples.size), LENGTHS[samples]))
    pred = model(x[index]).squeeze(-1)
    return (pred - y[index]) ** 2, owner


def _losses(model: nn.Module, samples: np.ndarray, reduction: str) -> torch.Tensor:
    """Per token for ``token_mean``, else per sample (the sum of its tokens' losses)."""
    per_token, owner = _token_losses(model, samples)
    if reduction == "token_mean":
        return per_token
    return torch.zeros(samples.size, dtype=torch.float64).index_add(0, owner, per_token)


def _reference(reduction: str) -> list[torch.Tensor]:
    """The gradient of the global batch's loss, on one process, with torch's reductions."""
    model = _model()
    losses = _losses(model, np.arange(N), reduction)
    loss = losses.sum() if reduction == "sum" else losses.mean()
    loss.backward()
    return [p.grad for p in model.parameters()]


def _share_grads(share: np.ndarray, reduction: str, weight: float) -> list[torch.Tensor]:
    model = _model()
    (_losses(model, share, reduction).sum() * weight).backward()
    return [p.grad for p in model.parameters()]


def _averaged(parts: list[np.ndarray], reduction: str, weighted: bool = True) -> list[torch.Tensor]:
    """The ranks' gradients averaged over the ranks, as DDP averages them."""
    world = len(parts)
    weight = loss_weight(reduction, world_size=world, num_samples=N, num_tokens=T)
    grads = []
    for part in parts:
        if weighted:
            grads.append(_share_grads(part, reduction, weight))
        else:  # each rank its own reduction, as a plain DDP loop computes it
            count = int(LENGTHS[part].sum()) if reduction == "token_mean" else part.size
            grads.append(_share_grads(part, reduction, 1.0 if reduction == "sum" else 1 / count))
    return [sum(g[i] for g in grads) / world for i in range(len(grads[0]))]


def test_the_weights_by_hand():
    assert loss_weight("mean", world_size=4, num_samples=10, num_tokens=37) == 4 / 10
    assert loss_weight("token_mean", world_size=4, num_samples=10, num_tokens=37) == 4 / 37
    assert loss_weight("sum", world_size=4, num_samples=10, num_tokens=37) == 4.0
    assert loss_weight("sum", world_size=4, num_samples=10, num_tokens=0) == 4.0
    assert REDUCTIONS == ("mean", "token_mean", "sum")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"reduction": "max"}, "reduction"),
        ({"world_size": 0}, "world_size"),
        ({"world_size": True}, "world_size"),
        ({"num_samples": 0}, "num_samples"),
        ({"num_tokens": -1}, "num_tokens"),
        ({"reduction": "token_mean", "num_tokens": 0}, "num_tokens"),
    ],
)
def test_bad_input_names_the_field(kwargs, field):
    args = {"reduction": "mean", "world_size": 2, "num_samples": 4, "num_tokens": 9} | kwargs
    with pytest.raises(ValueError, match=field):
        loss_weight(args.pop("reduction"), **args)


def _lpt_parts() -> list[np.ndarray]:
    """LPT with unequal counts on costs L² (1 25 4 36 1 9 16 4 49 1): greedy to the lighter
    rank, 49+16+4+4 = 73 (4 samples, 17 tokens) vs 36+25+9+1+1+1 = 73 (6 samples, 15)."""
    plan = StepPlan.make(LENGTHS.astype(float) ** 2, 2, BalanceConfig(enabled=True, method="lpt"))
    assert sorted(p.size for p in plan.parts) == [4, 6]
    return plan.parts


SPLITS = {
    "equal": lambda: [np.arange(0, 5), np.arange(5, 10)],
    "unequal": lambda: UNEQUAL,
    "lpt": _lpt_parts,
    "empty_rank": lambda: [np.arange(0, 4), np.arange(4, 10), np.arange(0)],
}


@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_averaged_weighted_gradient_is_the_global_batch_gradient(reduction, split):
    parts = SPLITS[split]()
    assert sorted(np.concatenate(parts).tolist()) == list(range(N))
    for got, want in zip(_averaged(parts, reduction), _reference(reduction), strict=True):
        torch.testing.assert_close(got, want, **TIGHT)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_each_rank_reducing_its_own_share_is_wrong_with_unequal_shares(reduction):
    """The test has teeth: a plain DDP loop's gradient (each rank's own mean, or sum) differs."""
    naive = _averaged(UNEQUAL, reduction, weighted=False)
    reference = _reference(reduction)
    assert not all(torch.allclose(a, b) for a, b in zip(naive, reference, strict=True))


def _ddp_rank(rank: int, world_size: int, out: Path) -> None:
    """Each reduction through DDP on this rank's share of UNEQUAL; the averaged gradients."""
    grads = {}
    for reduction in REDUCTIONS:
        model = DistributedDataParallel(_model())
        weight = loss_weight(reduction, world_size=world_size, num_samples=N, num_tokens=T)
        (_losses(model, UNEQUAL[rank], reduction).sum() * weight).backward()
        grads[reduction] = [p.grad.clone() for p in model.parameters()]
    torch.save(grads, out / f"rank{rank}.pt")


@pytest.mark.multiprocess
def test_ddp_on_two_gloo_ranks_gives_the_global_batch_gradient(tmp_path):
    run_ranks(_ddp_rank, 2, tmp_path)
    for rank in range(2):
        grads = torch.load(tmp_path / f"rank{rank}.pt")
        for reduction in REDUCTIONS:
            for got, want in zip(grads[reduction], _reference(reduction), strict=True):
                torch.testing.assert_close(got, want, **TIGHT)
