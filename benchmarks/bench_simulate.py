"""Benchmark: the N-rank simulator's speed, the analyzer on its biggest output, the scale study.

1. ``fsobs simulate`` speed: 256 and 1024 ranks x 20 steps (schedule + every rank's trace,
   sidecar, run.json, truth.json written by parallel processes). Goals: <= 60 s and <= 5 min.
2. The analyzer on the 1024-rank output, in fresh processes (``bench_analyze.measure``):
   ``parse`` (every rank parsed and dropped) and ``analyze`` (``fsobs.analyze_path``); goal:
   analyze <= 2x parse. The round trip (analyzed classes against ``truth.json``) is checked on
   the same run.
3. The scale study (``fsobs.simulate.study``): bubble ratio against the world size (8...1024)
   under the random split, and each toggle's bubble reduction at 256 ranks, for a job calibrated
   from a measured run (``--calibrate``), the same with GPU-like noise, and the GPU-like default.

    .venv/bin/python benchmarks/bench_simulate.py --calibrate RUN [--skip-speed]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd

from fsobs.analysis import analyze_path
from fsobs.simulate.simulator import SimConfig, calibrate, simulate, truth_error, write_run
from fsobs.simulate.study import WORLD_SIZES, scale_curve, toggle_study

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_analyze import measure  # noqa: E402


def speed(root: Path) -> list[str]:
    lines = [
        "| ranks x steps | schedule s | write s | total s | MB of JSON | MB on disk | goal |",
        "|---|--:|--:|--:|--:|--:|---|",
    ]
    for n, goal in ((256, 60), (1024, 300)):
        out = root / f"sim{n}"
        shutil.rmtree(out, ignore_errors=True)
        started = time.perf_counter()
        sched = simulate(SimConfig(world_size=n, steps=20))
        planned = time.perf_counter()
        size = write_run(sched, out)
        done = time.perf_counter()
        disk = sum(p.stat().st_size for p in out.iterdir()) / 1e6
        total = done - started
        lines.append(
            f"| {n} x 20 | {planned - started:.2f} | {done - planned:.2f} | "
            f"{total:.1f} | {size / 1e6:.0f} | {disk:.0f} | <= {goal} s: "
            f"{'met' if total <= goal else 'missed'} |"
        )
    big = root / "sim1024"
    parse = [measure("parse", big)["work_s"] for _ in range(2)]
    analyze = [measure("analyze", big)["work_s"] for _ in range(2)]
    p, a = min(parse), min(analyze)
    err = truth_error(
        pd.DataFrame(json.loads((big / "truth.json").read_text())["steps"]), analyze_path(big).steps
    )
    worst = err.drop(columns=["rank", "step"]).to_numpy().max()
    lines += [
        "",
        f"analyzer on 1024 x 20: parse {p:.1f} s (runs {', '.join(f'{v:.1f}' for v in parse)}), "
        f"analyze {a:.1f} s (runs {', '.join(f'{v:.1f}' for v in analyze)}): "
        f"{a / p:.2f}x parse (goal <= 2x: {'met' if a <= 2 * p else 'missed'}); "
        f"round trip: largest class error {worst:.2e} of a step (goal <= 1%)",
    ]
    return lines


def study(configs: dict[str, SimConfig], seeds: tuple[int, ...]) -> list[str]:
    curves = {
        name: scale_curve(cfg, WORLD_SIZES, seeds).groupby("world_size").mean()
        for name, cfg in configs.items()
    }
    lines = ["| world size | " + " | ".join(configs) + " |", "|--:|" + "--:|" * len(configs)]
    for n in WORLD_SIZES:
        cells = [f"{curves[name].loc[n, 'bubble_ratio']:.1%}" for name in configs]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Bubble reduction at 256 ranks, mean over the seeds (their range); after the semicolon:",
        "the reduction when contention counts as a bubble (the paper's taxonomy).",
        "",
        "| toggles at 256 ranks | " + " | ".join(configs) + " |",
        "|---|" + "--:|" * len(configs),
    ]
    tables = {
        name: toggle_study(cfg, 256, seeds).set_index("toggles") for name, cfg in configs.items()
    }
    for combo in tables[next(iter(configs))].index:
        cells = []
        for name in configs:
            row = tables[name].loc[combo]
            if combo == "baseline":
                cells.append(
                    f"bubble {row['bubble_ratio']:.1%} ({row['bubble_ms_per_step']:.1f} ms/step)"
                )
            else:
                cells.append(
                    f"{row['bubble_reduction']:.1%} ({row['reduction_min']:.1%} – "
                    f"{row['reduction_max']:.1%}); {row['reduction_with_contention']:.1%}"
                )
        lines.append(f"| {combo} | " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibrate", help="a measured baseline run")
    parser.add_argument("--out", default="bench_data/simulate")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-study", action="store_true")
    args = parser.parse_args()
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    if not args.skip_speed:
        print("\n".join(speed(root)) + "\n")
    if not args.skip_study:
        seeds = tuple(int(s) for s in args.seeds.split(","))
        configs = {"GPU-like default": replace(SimConfig(), steps=20)}
        if args.calibrate:
            measured = replace(calibrate(analyze_path(args.calibrate)), steps=20)
            quiet = replace(measured, noise_sigma=0.02, speed_sigma=0.01, step_sigma=0.0)
            configs = {"calibrated": measured, "calibrated, GPU-like noise": quiet, **configs}
            print(f"calibration: {measured.source}")
            print(
                json.dumps(
                    {k: v for k, v in measured.describe().items() if k != "lengths"}, default=str
                )
            )
        print("\n".join(study(configs, seeds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
