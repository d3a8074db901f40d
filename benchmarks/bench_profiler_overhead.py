"""Benchmark: what the profiler costs the reference job (goal: <= 5% of step time).

Runs the same job (same seed, same global batches) with and without the profiler, alternating,
and compares the median step time taken from the step sidecars (which both runs write), over the
steps the profiler records (after its wait and warm-up steps). The step monitor
(:class:`fsobs.collect.pauses.StepMonitor`: GC pauses, CPU time, context switches) runs in both
(its fields are written only with the profiler), so it is also timed on its own, in this process:
a ``begin``/``end`` pair per step, and a young-generation collection with and without its
callback, against the measured step time.

    .venv/bin/python benchmarks/bench_profiler_overhead.py [--pairs 3] [--world-size 2]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fsobs.collect.pauses import StepMonitor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import fsobs_run  # noqa: E402


def step_ms(run_dir: Path, first_step: int) -> float:
    """Median over steps >= ``first_step`` of the slowest rank's step time (ms), from the
    wall-clock bounds in the step sidecars."""
    per_step: dict[int, float] = {}
    for path in sorted(run_dir.glob("steps.rank*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["step"] >= first_step:
                ms = (record["wall_end_ns"] - record["wall_start_ns"]) / 1e6
                per_step[record["step"]] = max(per_step.get(record["step"], 0.0), ms)
    return statistics.median(per_step.values())


def monitor_us(repeats: int = 20_000) -> tuple[float, float]:
    """The step monitor's cost in µs: one ``begin``/``end`` pair, and what its GC callback adds
    to one young-generation collection (the median of 5 rounds each)."""

    def per_call(fn: Callable[[], object], n: int) -> float:
        rounds = []
        for _ in range(5):
            start = time.perf_counter_ns()
            for _ in range(n):
                fn()
            rounds.append((time.perf_counter_ns() - start) / n / 1e3)
        return statistics.median(rounds)

    with StepMonitor() as monitor:
        step = per_call(lambda: (monitor.begin(), monitor.end()), repeats)
        with_callback = per_call(lambda: gc.collect(0), repeats // 10)
    without = per_call(lambda: gc.collect(0), repeats // 10)
    return step, with_callback - without


def run(out: Path, world_size: int, steps: int, profile: bool) -> None:
    flags = [f"--world-size={world_size}", f"--steps={steps}", "--model-size=small"]
    fsobs_run(out, flags + ([] if profile else ["--no-profile"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    times: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            for profile in (False, True):
                out = Path(tmp) / f"{'on' if profile else 'off'}{i}"
                run(out, args.world_size, args.steps, profile)
                times[profile].append(step_ms(out, first_step=2))
                print(f"  pair {i} profiler {'on ' if profile else 'off'}: "
                      f"{times[profile][-1]:.1f} ms/step", file=sys.stderr)  # fmt: skip
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"world size {args.world_size}, model small, {args.steps} steps, {args.pairs} pairs")
    print(f"median step time: profiler off {off:.1f} ms, on {on:.1f} ms")
    print(f"overhead: {on / off - 1:+.1%} (goal <= 5%)")
    step_us, gc_us = monitor_us()
    print(
        f"step monitor: {step_us:.1f} µs per step ({step_us / 1e3 / on:.4%} of the step), "
        f"+{gc_us:.1f} µs per collection"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
