"""Benchmark: what always-on collection costs the reference job (goal: <= 2% with no window
active), and what an active live window costs.

Two arms of ``fsobs run`` on the same global batches (same seed), interleaved over N pairs
(control first on even pairs, last on odd ones, :mod:`fsobs.workload.pairs`):

- ``off``: ``--no-profile``: the step sidecar only (the least a run writes);
- ``armed``: ``--profile-every 0``: the profiler entered but never recording (captures only),
  the pause fields, a ``capture.json`` look per step;
- ``live``: ``--profile-window K --profile-every N``: the same with a live window of K steps
  every N, each published as it closes.

Per step, the step time is the slowest rank's wall time from the sidecars. A step of the live
arm is *idle* when no window touches it: not a warm-up step, not a recorded one, not the step
after a window (the one that exports it); the first 2 steps of both arms are left out (start-up).
Reported for each comparison of :data:`COMPARISONS`: the median over pairs of the median of
the per-step ratios ``test / control - 1`` (same step, same batch), a 95% bootstrap CI over
the pooled paired steps, and each pair's, with the load of the machine. ``live`` against
``off`` on idle steps is the always-on overhead; ``armed`` against ``off`` is what the idle
profiler alone changes; ``live`` against ``armed`` what the live windows add to it.

    .venv/bin/python benchmarks/bench_live.py [--pairs 3] [--steps 100] [--window 2 --every 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from fsobs.runformat.windows import WindowSchedule
from fsobs.workload.pairs import pair_order

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import fsobs_run  # noqa: E402

SKIP = 2
"""Start-up steps left out of both arms."""
COMPARISONS = (
    ("live", "off", "idle"),
    ("live", "armed", "idle"),
    ("armed", "off", "idle"),
    ("live", "off", "window"),
    ("live", "armed", "window"),
)
"""(test arm, control arm, which steps) reported."""


def step_times(run_dir: Path) -> dict[int, float]:
    """Step -> the slowest rank's wall time (ms), from the published sidecars."""
    per_step: dict[int, float] = {}
    for path in sorted(run_dir.glob("steps.rank*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            ms = (record["wall_end_ns"] - record["wall_start_ns"]) / 1e6
            per_step[record["step"]] = max(per_step.get(record["step"], 0.0), ms)
    return per_step


def touched(schedule: WindowSchedule, steps: int) -> set[int]:
    """The steps a live window touches: its warm-up steps, its recorded steps, the one after."""
    out: set[int] = set()
    for first, last in schedule.scheduled(0, steps - 1):
        out.update(range(first - schedule.warmup, last + 2))
    return out


def ratios(live: dict[int, float], off: dict[int, float], steps: set[int]) -> np.ndarray:
    return np.array([live[s] / off[s] for s in sorted(steps) if s in live and s in off])


def bootstrap(values: np.ndarray, draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% CI of the median of ``values - 1`` (steps resampled)."""
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(values, (draws, len(values))), axis=1) - 1
    return float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--window", type=int, default=2)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--model-size", default="small")
    args = parser.parse_args(argv)
    schedule = WindowSchedule(every=args.every, wait=1, warmup=1, active=args.window)
    near = touched(schedule, args.steps)
    idle = set(range(SKIP, args.steps)) - near
    window = near & set(range(SKIP, args.steps))
    common = [f"--world-size={args.world_size}", f"--steps={args.steps}"]
    common += [f"--model-size={args.model_size}"]
    arms = {
        "off": ["--no-profile"],
        "armed": ["--profile-every=0"],
        "live": [f"--profile-window={args.window}", f"--profile-every={args.every}"],
    }
    load = os.getloadavg()
    pooled: dict[tuple[str, str, str], list[np.ndarray]] = {}
    per_pair: dict[tuple[str, str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            times = {}
            for arm in pair_order(list(arms), pair):
                out = Path(tmp) / f"{arm}{pair}"
                fsobs_run(out, common + arms[arm])
                times[arm] = step_times(out)
            for key in COMPARISONS:
                test, control, which = key
                values = ratios(times[test], times[control], idle if which == "idle" else window)
                pooled.setdefault(key, []).append(values)
                per_pair.setdefault(key, []).append(float(np.median(values)) - 1)
            medians = ", ".join(
                f"{a} {statistics.median(t.values()):.1f}" for a, t in times.items()
            )
            print(f"  pair {pair}: median ms/step {medians}", file=sys.stderr)
    print(
        f"world size {args.world_size}, model {args.model_size}, {args.steps} steps, "
        f"windows of {args.window} every {args.every}, {args.pairs} pairs, "
        f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} before; idle steps {len(idle)}, "
        f"window steps {len(window)} (warm-up, recorded, export) per run"
    )
    for key in COMPARISONS:
        test, control, which = key
        low, high = bootstrap(np.concatenate(pooled[key]))
        pairs = ", ".join(f"{v:+.2%}" for v in per_pair[key])
        print(
            f"{test} vs {control}, {which} steps: {statistics.median(per_pair[key]):+.2%} step "
            f"time (median over pairs; 95% CI {low:+.2%} .. {high:+.2%}; pairs {pairs})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
