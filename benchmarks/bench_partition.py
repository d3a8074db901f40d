"""Benchmark: ``optim.balance.partition`` speed and balance (no torch).

Draws 16,384 history lengths from the ``lognormal`` and ``powerlaw`` presets, costs them with
the analytic cost of the "small" model (``fsobs.workload.cost.estimate_cost``), and splits them
into 256 parts with every method (equal sizes; KK and LPT also with unequal sizes). Reports the
median of 5 timings and max/mean part cost. Goals: KK <= 20 ms (equal sizes), <= 50 ms (unequal
sizes), max/mean <= 1.02.

    .venv/bin/python benchmarks/bench_partition.py [--samples 16384] [--parts 256] [--seed 0]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from fsobs.workload.config import ModelConfig
from fsobs.workload.cost import estimate_cost
from fsobs.workload.lengths import PRESETS
from optim.balance import imbalance, partition

CASES = (("kk", True), ("kk", False), ("lpt", True), ("lpt", False), ("random", True))


def lower_bounds(costs: np.ndarray, parts: int) -> tuple[float, float]:
    """Lower bounds of max/mean for any split: (unequal counts, equal counts). A part holding the
    costliest sample costs at least that sample; with equal counts at least that sample plus the
    ``n/parts - 1`` cheapest others."""
    mean = costs.sum() / parts
    cheapest = np.sort(costs)[: costs.size // parts - 1].sum()
    top = costs.max()
    return max(1.0, top / mean), max(1.0, (top + cheapest) / mean)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16_384)
    parser.add_argument("--parts", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cfg = ModelConfig.preset("small")
    print(f"{args.samples} samples -> {args.parts} parts, median of {args.repeats}")
    print(f"{'preset':<10} {'method':<7} {'equal':<6} {'ms':>8} {'max/mean':>9}")
    for name in ("lognormal", "powerlaw"):
        lengths = PRESETS[name].draw(np.random.default_rng(args.seed), args.samples)
        costs = estimate_cost(lengths, cfg)
        free, equal_bound = lower_bounds(costs, args.parts)
        bounds = f"{free:.4f} (any counts), {equal_bound:.4f} (equal)"
        print(f"{name:<10} lower bound of max/mean: {bounds}")
        for method, equal in CASES:
            times, parts = [], []
            for _ in range(args.repeats):
                start = time.perf_counter()
                parts = partition(costs, args.parts, method=method, equal_size=equal)
                times.append(time.perf_counter() - start)
            ms = statistics.median(times) * 1e3
            ratio = imbalance(costs, parts)
            print(f"{name:<10} {method:<7} {equal!s:<6} {ms:8.2f} {ratio:9.4f}")


if __name__ == "__main__":
    main()
