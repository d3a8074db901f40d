"""Loss weights that make the ranks' averaged gradient the gradient of the global batch's loss,
for any reduction and any split of the global batch (standard library only).

DDP averages the dense gradients over the ``W`` ranks, and torchrec divides the embedding
gradients by ``W`` the same way. Rank ``r`` trains on its share ``S_r`` of a global batch of
``N`` samples and ``T`` tokens, with per-sample losses ``l_i`` (per-token ``l_it``); it
computes the *sum* of its losses times :func:`loss_weight`::

    reduction    global loss L                 rank r's loss                 weight
    mean         (1/N) Σ_i l_i                 w · Σ_{i∈S_r} l_i             W / N
    token_mean   (1/T) Σ_i Σ_t l_it            w · Σ_{i∈S_r} Σ_t l_it        W / T
    sum          Σ_i l_i                       w · Σ_{i∈S_r} l_i             W

    averaged:    (1/W) Σ_r ∇(w · Σ_{S_r} l)  =  (w/W) Σ_all ∇l  =  ∇L

The weight depends on the global batch only (its size, its tokens, the world size), never on the
share: shares of any count and any number of tokens, an empty share included (its sum is 0),
get the right gradient, and the loss is one multiplication with no branch on the batch, so it
traces under torch.fx (torchrec's pipelines trace the model's forward). With ``sum`` the weight
is ``W``: a plain DDP loop that sums its losses trains on ``L / W``.

This is the same rule as :func:`optim.plan.loss_scale` (a factor on the rank's *mean* loss,
``W·n_r/N``, since ``w · Σ_{S_r} l = (W·n_r/N) · mean_{S_r} l``), written on the sum so that it
holds for every reduction and for empty shares.
"""

from __future__ import annotations

from numbers import Integral

__all__ = ["REDUCTIONS", "loss_weight"]

REDUCTIONS: tuple[str, ...] = ("mean", "token_mean", "sum")


def loss_weight(reduction: str, *, world_size: int, num_samples: int, num_tokens: int) -> float:
    """The factor on a rank's sum of losses (per sample for ``mean`` and ``sum``, per token for
    ``token_mean``) for a global batch of ``num_samples`` samples and ``num_tokens`` tokens over
    ``world_size`` ranks (module docstring)."""
    for name, value, least in (
        ("world_size", world_size, 1),
        ("num_samples", num_samples, 1),
        ("num_tokens", num_tokens, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, Integral) or value < least:
            raise ValueError(f"{name}: must be an int >= {least}, got {value!r}")
    if reduction == "mean":
        return world_size / num_samples
    if reduction == "token_mean":
        if num_tokens == 0:
            raise ValueError("num_tokens: the global batch has no tokens to average over")
        return world_size / num_tokens
    if reduction == "sum":
        return float(world_size)
    raise ValueError(f"reduction: unknown {reduction!r}, expected one of {list(REDUCTIONS)}")
