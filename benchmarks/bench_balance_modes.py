"""Benchmark: every balance mode on the simulator (no torch): equal counts (``kk``), unequal
counts (``lpt``) and windows of 2, 4 and 8 steps (``optim.window``), each alone and with every
toggle, as bubble reduction against the random split of the same seed (mean and range over the
seeds), with the straggler wait, step time (mean and p50) and the planned imbalance beside it.

    .venv/bin/python benchmarks/bench_balance_modes.py [--world-sizes 256 1024] [--seeds 0 1 2]
        [--steps 20] [--calibrate RUN]
"""

from __future__ import annotations

import argparse

from fsobs.analysis import analyze_path
from fsobs.simulate.simulator import SimConfig, calibrate
from fsobs.simulate.study import BALANCE_MODES, balance_study


def table(cfg: SimConfig, world_size: int, seeds: list[int]) -> list[str]:
    """The markdown table of :func:`balance_study` at ``world_size``."""
    frame = balance_study(cfg, world_size, seeds)
    lines = [
        f"{world_size} ranks, {cfg.steps} steps, seeds {seeds} ({cfg.source})",
        "",
        "| mode | toggles | bubble reduction (min-max) | straggler ms/step | step mean ms "
        "| step p50 ms | imbalance after |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    for (mode, toggles), group in frame.groupby(["mode", "toggles"], sort=False):
        red = group["bubble_reduction"]
        lines.append(
            f"| {mode} | {toggles} | {red.mean():.1%} ({red.min():.1%}-{red.max():.1%}) | "
            f"{group['straggler_wait_ms_per_step'].mean():.2f} | "
            f"{group['step_time_ms_mean'].mean():.1f} | {group['step_time_ms_p50'].mean():.1f} | "
            f"{group['imbalance_after'].mean():.4f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--calibrate", help="a measured run to calibrate the job from")
    args = parser.parse_args()
    if args.calibrate:
        cfg = calibrate(analyze_path(args.calibrate), steps=args.steps)
    else:
        cfg = SimConfig(steps=args.steps)
    modes = [f"{k} = {v.method}, window {v.window}" for k, v in BALANCE_MODES.items()]
    print(f"modes: {'; '.join(modes)}")
    for n in args.world_sizes:
        print("\n".join(["", *table(cfg, n, args.seeds)]))


if __name__ == "__main__":
    main()
