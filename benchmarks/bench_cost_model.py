"""Benchmark: does the per-sample cost model explain the measured time of the reference model?

A step has a per-step overhead that every rank pays once whatever its samples (here: the dense
gradients of the plain embedding tables, Python), about as large as one short sample's compute.
So for each history length L of a sweep this times the forward + backward (``SeqRecModel``,
plain EBC/EC on CPU, no DMP, no optimizer; median of ``--repeats`` after a warm-up) of a batch
of one sample and of ``--copies`` samples of length L; the per-sample cost is the difference
divided by ``copies - 1`` and the per-step overhead ``t_step`` is what the one-sample batch
took beyond it. Then, by least squares on *relative* errors (so that the longest length does
not decide the fit alone):

- ``free``: ``c(L) = c0 + a·L + b·L²``, coefficients free (is the cost quadratic in L?);
- ``analytic``: ``c(L) = k·estimate_cost(L)`` with elementwise weight 1 (does the model shape
  predict the cost up to a scale?);
- ``analytic + c0``: ``c(L) = c0 + k·estimate_cost(L)``: the FLOP count has (almost) no
  per-sample constant, but the per-sample Python loop over the attention costs one.

R² is on the raw per-sample costs. Last, one batch of ``--batch`` samples drawn from a length
preset, timed whole, against ``t_step + Σ c(L_i)`` of the free fit (are costs additive?).

    .venv/bin/python benchmarks/bench_cost_model.py [--model small] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from fsobs.workload.batch import Batch, collate
from fsobs.workload.config import ModelConfig, data_config_for
from fsobs.workload.cost import estimate_cost
from fsobs.workload.data import Sample, SyntheticHistories
from fsobs.workload.model import SeqRecModel

SWEEP = (16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


def time_step(model: SeqRecModel, batch: Batch, repeats: int) -> float:
    """Median seconds of forward + backward on ``batch`` (one warm-up first)."""
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        loss, _ = model(batch)
        loss.backward()
        times.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    return statistics.median(times[1:])


def one_sample(cfg: ModelConfig, length: int, rng: np.random.Generator) -> Sample:
    items = rng.integers(cfg.num_items, size=length)
    sample = Sample(
        index=0,
        user_id=int(rng.integers(cfg.num_users)),
        ctx_ids=rng.integers(cfg.num_contexts, size=2),
        item_seq=items,
        cat_seq=items % cfg.num_categories,
        target_item=int(rng.integers(cfg.num_items)),
        label=1.0,
    )
    return sample


def fit(columns: list[np.ndarray], y: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Coefficients of ``y ≈ Σ coef_i·column_i`` minimizing relative errors; predictions; R²."""
    design = np.stack(columns, axis=1)
    coef, *_ = np.linalg.lstsq(design / y[:, None], np.ones_like(y), rcond=None)
    predicted = design @ coef
    residual = y - predicted
    return coef, predicted, 1.0 - float(residual @ residual) / float(((y - y.mean()) ** 2).sum())


def measure(model: SeqRecModel, args: argparse.Namespace, length: int) -> tuple[float, float]:
    """(per-sample cost, per-step overhead) in seconds at history length ``length``."""
    rng = np.random.default_rng(length)
    one = time_step(model, collate([one_sample(model.cfg, length, rng)]), args.repeats)
    samples = [one_sample(model.cfg, length, rng) for _ in range(args.copies)]
    many = time_step(model, collate(samples), args.repeats)
    per_sample = (many - one) / (args.copies - 1)
    return per_sample, one - per_sample


def report(args: argparse.Namespace, lengths: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Print the three fits; return the free fit's coefficients (c0, a, b)."""
    cfg = ModelConfig.preset(args.model)
    analytic = estimate_cost(lengths, cfg)
    free, free_c, r2_free = fit([np.ones_like(lengths), lengths, lengths**2], cost)
    scaled, scaled_c, r2_scaled = fit([analytic], cost)
    offset, _, r2_offset = fit([np.ones_like(lengths), analytic], cost)
    print(f"{'L':>6} {'measured':>9} {'free fit':>9} {'analytic':>9}   (ms per sample)")
    for row in zip(lengths, cost * 1e3, free_c * 1e3, scaled_c * 1e3, strict=True):
        print(f"{int(row[0]):>6} {row[1]:>9.3f} {row[2]:>9.3f} {row[3]:>9.3f}")
    print(
        f"free fit:  c0 {free[0] * 1e3:.3f} ms + {free[1] * 1e6:.3f} us·L "
        f"+ {free[2] * 1e9:.2f} ns·L²  R2={r2_free:.4f}"
    )
    print(
        f"analytic:  {scaled[0] * 1e12:.2f} ps per FLOP-equivalent (elementwise weight 1)  "
        f"R2={r2_scaled:.4f}"
    )
    print(
        f"analytic + c0: c0 {offset[0] * 1e3:.3f} ms + {offset[1] * 1e12:.2f} ps per "
        f"FLOP-equivalent  R2={r2_offset:.4f}"
    )
    return free


def check_batch(
    model: SeqRecModel, args: argparse.Namespace, free: np.ndarray, t_step: float
) -> None:
    """One real batch against t_step + the per-sample costs of the free fit."""
    cfg = model.cfg
    ds = SyntheticHistories(data_config_for(cfg, preset=args.preset, num_samples=1000))
    batch = collate([ds.sample(i) for i in range(args.batch)])
    whole = time_step(model, batch, args.repeats)
    lens = batch.lengths.numpy().astype(np.float64)
    predicted = t_step + float((free[0] + free[1] * lens + free[2] * lens**2).sum())
    print(
        f"batch of {args.batch} ({args.preset}, sum L {int(lens.sum())}, max L "
        f"{int(lens.max())}): measured {whole * 1e3:.1f} ms, predicted {predicted * 1e3:.1f} ms "
        f"(ratio {whole / predicted:.2f})"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["tiny", "small", "medium"], default="small")
    p.add_argument("--lengths", default=",".join(map(str, SWEEP)))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--copies", type=int, default=9, help="samples in the many-sample batch")
    p.add_argument("--threads", type=int, default=1, help="torchrun uses 1 per rank")
    p.add_argument("--preset", default="lognormal", help="length preset of the batch check")
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModelConfig.preset(args.model)
    model = SeqRecModel(cfg)
    lengths = np.array([int(v) for v in args.lengths.split(",")], dtype=np.float64)
    cost, overhead = np.array([measure(model, args, int(n)) for n in lengths]).T
    t_step = float(np.median(overhead))
    print(
        f"model={args.model} threads={args.threads} repeats={args.repeats} "
        f"copies={args.copies}: per-step overhead {t_step * 1e3:.2f} ms (median over L)"
    )
    free = report(args, lengths, cost)
    check_batch(model, args, free, t_step)


if __name__ == "__main__":
    main()
