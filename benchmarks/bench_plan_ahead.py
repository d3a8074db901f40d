"""Benchmark: the balance plan on the training thread vs one step ahead on the planner thread
(issue 27, point 4), on the reference job with ``--balance``, N pairs.

Each pair runs the job twice with the same seed (the same global batches and plans): the plans
made in place (``FSOBS_PLAN_AHEAD=0``, ``FreeScale.split``'s way) and made ahead
(``FreeScale.shares``, the default); in place first on even pairs, last on odd ones. From each
run's traces, per step (the mean over ranks; step time: the slowest rank's ProfilerStep):

- the time in ``## fsobs:balance ##`` on the training thread and on the other threads;
- the training thread's ``## fsobs:balance_wait ##`` (waiting for a plan made ahead) and
  ``## fsobs:balance_check ##`` (the cross-rank digest check, every ``check_every`` steps);

reported as the median over pairs, with the step-time change (``1 - ahead / in place``) and its
95% bootstrap CI over the pooled steps (paired by pair and step)::

    .venv/bin/python benchmarks/bench_plan_ahead.py --world-size 2 --pairs 3 --steps 12
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from fsobs.analysis.comparison.ab import bootstrap_reduction
from fsobs.trace import load_run
from fsobs.workload.train import PLAN_AHEAD_ENV
from optim.markers import BALANCE_CHECK_MARKER, BALANCE_MARKER, BALANCE_WAIT_MARKER

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import fsobs_run  # noqa: E402

ARMS = {"in place": "0", "ahead": "1"}
COLUMNS = ("balance on training thread", "balance on other threads", "balance_wait",
           "balance_check", "step time")  # fmt: skip


def per_step(run: Path) -> pd.DataFrame:
    """Per step: the :data:`COLUMNS` in ms (ranges: the mean over ranks; step time: the max)."""
    frames = []
    for rank, trace in load_run(run).ranks.items():
        ev = trace.events
        marks = ev[ev["kind"] == "step"].sort_values("ts_ns")
        (main,) = set(marks["tid"])
        starts = marks["ts_ns"].to_numpy()
        ends = starts + marks["dur_ns"].to_numpy()
        row = pd.DataFrame({"step": marks["step"].to_numpy(), "rank": rank})
        for column, name, on_main in (
            (COLUMNS[0], BALANCE_MARKER, True),
            (COLUMNS[1], BALANCE_MARKER, False),
            (COLUMNS[2], BALANCE_WAIT_MARKER, True),
            (COLUMNS[3], BALANCE_CHECK_MARKER, True),
        ):
            ranges = ev[(ev["name"] == name) & ((ev["tid"] == main) == on_main)]
            at = np.searchsorted(starts, ranges["ts_ns"].to_numpy(), "right") - 1
            inside = (at >= 0) & (ranges["ts_ns"].to_numpy() < ends[np.maximum(at, 0)])
            ms = np.bincount(at[inside], ranges["dur_ns"].to_numpy()[inside], len(starts)) / 1e6
            row[column] = ms
        row[COLUMNS[4]] = (ends - starts) / 1e6
        frames.append(row)
    frame = pd.concat(frames)
    means = frame.groupby("step")[list(COLUMNS[:4])].mean()
    return means.join(frame.groupby("step")[COLUMNS[4]].max())


def run_arm(out: Path, args: argparse.Namespace, env: str) -> pd.DataFrame:
    os.environ[PLAN_AHEAD_ENV] = env
    flags = [f"--world-size={args.world_size}", f"--model-size={args.model_size}",
             f"--steps={args.steps}", f"--seed={args.seed}", f"--batch-size={args.batch_size}",
             "--balance"]  # fmt: skip
    fsobs_run(out, flags)
    return per_step(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--model-size", default="small")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    pairs: list[dict[str, pd.DataFrame]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(args.pairs):
            order = list(ARMS) if index % 2 == 0 else list(ARMS)[::-1]
            pairs.append({arm: run_arm(Path(tmp) / f"{arm}-{index}".replace(" ", "_"), args,
                                       ARMS[arm]) for arm in order})  # fmt: skip
            line = ", ".join(f"{a} {f[COLUMNS[4]].mean():.1f} ms" for a, f in pairs[-1].items())
            print(f"  pair {index}: {line}", file=sys.stderr)
    print(f"reference job, model {args.model_size}, {args.world_size} ranks, --balance (kk), "
          f"{args.batch_size} samples/rank/step, {args.steps} steps (traced: all but 2), "
          f"seed {args.seed}, {args.pairs} pairs")  # fmt: skip
    print("| ms per step (median over pairs) | " + " | ".join(ARMS) + " |")
    print("|---|" + "---|" * len(ARMS))
    for column in COLUMNS:
        cells = [statistics.median(p[a][column].mean() for p in pairs) for a in ARMS]
        print(f"| {column} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    control = np.concatenate([p["in place"][COLUMNS[4]].to_numpy() for p in pairs])
    test = np.concatenate([p["ahead"][COLUMNS[4]].to_numpy() for p in pairs])
    lo, hi = bootstrap_reduction(control, test, paired=True, n_boot=4000)
    points = [1 - p["ahead"][COLUMNS[4]].mean() / p["in place"][COLUMNS[4]].mean() for p in pairs]
    print(
        f"\nstep-time change (1 - ahead / in place): median {statistics.median(points):.1%}, "
        f"95% CI {lo:.1%} – {hi:.1%}, per pair " + ", ".join(f"{v:.1%}" for v in points)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
