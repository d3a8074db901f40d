"""Benchmark: balancing a *padded* model (a rank's batch padded to its longest sample) with the
additive cost model and KK, and with the padded cost model and its split (torch on CPU).

One process stands for ``--ranks`` ranks: each step, each rank's share of the global batch is
run (forward + backward of a small transformer on the share padded to its longest sample, as
HSTU's PyTorch attention does) one after the other, timed alone; the step time under a
synchronous collective is the largest of the ranks' times. Lengths are heavy-tailed
(log-normal, clipped to ``--max-len``).

1. fit: ``--fit-steps`` steps under the random split, each rank's (n, ΣL, ΣL², max L, time)
   fitted with ``fsobs.analysis.costfit.fit_points`` in both shapes (additive and padded);
2. measure: ``--pairs`` fresh global batches; each one is split by every method (below) and
   every split is timed, in an order that rotates from batch to batch (interleaved, so that
   drift of the machine hits every method alike); the table has the median step time over the
   batches, its ratio to the random split's, and each method's median largest *predicted* rank
   cost under the padded fit.

Methods: ``random`` (contiguous chunks), ``kk`` and ``kk-unequal`` (KK on the additive fit's
per-sample costs, equal / unequal counts), ``padded`` and ``padded-equal`` (the padded fit,
``optim.padded.partition_padded``, unequal / equal counts). A recipe for a quiet machine::

    .venv/bin/python benchmarks/bench_padded.py --threads 4          # ~10 min
    .venv/bin/python benchmarks/bench_padded.py --quick              # a smoke run, seconds
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch
from torch import nn

from fsobs.analysis.costfit import CostFit, fit_points
from optim.balance import CostModel, partition
from optim.padded import partition_padded

Split = Callable[[np.ndarray], list[list[int]]]


class PaddedEncoder(nn.Module):
    """Token embedding, ``layers`` transformer encoder layers over the batch padded to its
    longest sample (padding masked, but computed: the padded path), a mean-pool head."""

    def __init__(self, vocab: int, dim: int, heads: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 1)

    def forward(self, tokens: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(self.embed(tokens), src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(hidden.dtype)
        return self.head((hidden * keep).sum(1) / keep.sum(1).clamp(min=1)).squeeze(-1)


def rank_time(model: PaddedEncoder, lengths: np.ndarray, vocab: int) -> float:
    """Seconds of forward + backward of one rank's share (0 for an empty share)."""
    if lengths.size == 0:
        return 0.0
    longest = int(lengths.max())
    tokens = torch.randint(0, vocab, (lengths.size, longest))
    pad = torch.arange(longest)[None, :] >= torch.from_numpy(lengths)[:, None]
    start = time.perf_counter()
    loss = model(tokens, pad).square().mean()
    loss.backward()
    elapsed = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return elapsed


def draw_lengths(rng: np.random.Generator, n: int, args: argparse.Namespace) -> np.ndarray:
    drawn = rng.lognormal(np.log(args.median_len), args.sigma, n)
    return np.clip(drawn, 1, args.max_len).astype(np.int64)


def fit(model: PaddedEncoder, rng: np.random.Generator, args: argparse.Namespace) -> list[CostFit]:
    """Step 1 (module docstring): the additive and the padded fit."""
    rows = []
    for step in range(args.fit_steps):
        batch = draw_lengths(rng, args.ranks * args.batch, args)
        for rank, part in enumerate(np.array_split(batch, args.ranks)):
            seconds = rank_time(model, part, args.vocab)
            rows.append(
                {
                    "rank": rank,
                    "step": step,
                    "busy_ms": seconds * 1e3,
                    "num_samples": part.size,
                    "len_sum": int(part.sum()),
                    "len_sq_sum": int((part * part).sum()),
                    "len_max": int(part.max()),
                }
            )
    table = pd.DataFrame(rows)
    steps = table[["rank", "step", "busy_ms"]]
    return [fit_points(steps, table, shape=shape) for shape in ("additive", "padded")]


def methods(additive: CostModel, padded: CostModel, ranks: int) -> dict[str, Split]:
    def kk(equal: bool) -> Split:
        return lambda b: partition(additive(b), ranks, method="kk", equal_size=equal)

    def pad(equal: bool) -> Split:
        return lambda b: partition_padded(b, ranks, padded, equal_size=equal)

    return {
        "random": lambda b: partition(np.zeros(b.size), ranks, method="random"),
        "kk": kk(True),
        "kk-unequal": kk(False),
        "padded": pad(False),
        "padded-equal": pad(True),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16, help="samples per rank (mean)")
    parser.add_argument("--median-len", type=float, default=48.0)
    parser.add_argument("--sigma", type=float, default=1.0, help="of log length")
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--fit-steps", type=int, default=12)
    parser.add_argument("--pairs", type=int, default=15, help="global batches measured")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a tiny setting (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.ranks, args.batch, args.max_len, args.dim, args.layers = 2, 4, 64, 16, 1
        args.median_len, args.fit_steps, args.pairs = 8.0, 3, 2
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    model = PaddedEncoder(args.vocab, args.dim, args.heads, args.layers)
    rank_time(model, draw_lengths(rng, args.batch, args), args.vocab)  # warm-up
    additive_fit, padded_fit = fit(model, rng, args)
    for f in (additive_fit, padded_fit):
        print(f"{f.shape:>8} fit: R^2 {f.r2:.4f}, RMSE {f.rmse_ms:.3f} ms, {f.model}")
    splits = methods(additive_fit.model, padded_fit.model, args.ranks)
    names = list(splits)
    times: dict[str, list[float]] = {name: [] for name in names}
    predicted: dict[str, list[float]] = {name: [] for name in names}
    for k in range(args.pairs):
        batch = draw_lengths(rng, args.ranks * args.batch, args)
        for name in names[k % len(names) :] + names[: k % len(names)]:
            shares = [batch[np.asarray(p, dtype=np.int64)] for p in splits[name](batch)]
            times[name].append(max(rank_time(model, s, args.vocab) for s in shares) * 1e3)
            costs = [padded_fit.model.batch_cost(s) for s in shares]
            predicted[name].append(max(costs) / 1e6)
    base = statistics.median(times["random"])
    print(f"\n{args.pairs} global batches of {args.ranks} x {args.batch}, medians")
    print(f"{'method':<14}{'step ms':>10}{'vs random':>11}{'predicted ms':>14}")
    for name in names:
        step = statistics.median(times[name])
        guess = statistics.median(predicted[name])
        print(f"{name:<14}{step:>10.2f}{step / base:>11.3f}{guess:>14.2f}")


if __name__ == "__main__":
    main()
