"""Benchmark: a long live run's index: the first open, a reopen, one new window.

A simulated job in live windows (``fsobs.simulate``, :class:`~fsobs.simulate.SimWindows`):
``--windows`` windows of 2 steps, one every 10 steps, on ``--world-size`` ranks. Measured in
this process, each with ``time.perf_counter``:

- *first open*: ``LiveRun(run).poll()`` on the finished run, which analyzes every window once
  and keeps its ``summary.json`` (the cost a window pays once);
- *reopen*: a new ``LiveRun`` on the same run: every summary read back, nothing analyzed (what
  opening a day-long run costs once it has been watched);
- *one more window*: the reopened reader polled again after one more window was published
  (its files copied in from a second run one window longer): the cost of a new window.

    .venv/bin/python benchmarks/bench_live_index.py [--windows 200] [--world-size 8]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from fsobs.live.state import LiveRun
from fsobs.runformat.windows import WindowSchedule, list_windows
from fsobs.simulate import SimConfig, SimWindows, simulate, write_run

EVERY, ACTIVE = 10, 2
T = TypeVar("T")


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """``fn()`` and the seconds it took."""
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=200)
    parser.add_argument("--world-size", type=int, default=8)
    args = parser.parse_args(argv)
    live = SimWindows(schedule=WindowSchedule(every=EVERY, wait=0, warmup=1, active=ACTIVE))
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for extra in (0, 1):
            steps = (args.windows + extra) * EVERY
            cfg = SimConfig(world_size=args.world_size, steps=steps, seed=0, batch_per_rank=8)
            runs[extra] = Path(tmp) / f"run{extra}"
            start = time.perf_counter()
            write_run(simulate(cfg), runs[extra], windows=live)
            written = time.perf_counter() - start
            print(f"  simulated {steps} steps in {written:.1f} s", file=sys.stderr)
        run, longer = runs[0], runs[1]
        first, t_first = timed(lambda: LiveRun(run).poll())
        assert all(w.state == "closed" for w in first.windows), "a window not closed"
        reader = LiveRun(run)
        again, t_reopen = timed(reader.poll)
        assert [w.summary for w in again.windows] == [w.summary for w in first.windows]
        newest = list_windows(longer)[-1]
        for rank in range(args.world_size):
            sidecar = f"steps.rank{rank}.jsonl"
            shutil.copy(longer / sidecar, run / sidecar)
        shutil.copytree(newest.path, run / "windows" / newest.wid)
        more, t_more = timed(reader.poll)
        assert len(more.windows) == args.windows + 1 and more.windows[-1].state == "closed"
    n = args.windows
    print(
        f"{n} windows of {ACTIVE} steps, {args.world_size} ranks "
        f"(load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} before)"
    )
    share = t_first / n
    print(
        f"first open (every window analyzed once): {t_first:.1f} s, {share * 1e3:.0f} ms a window"
    )
    print(f"reopen (summaries read back): {t_reopen:.2f} s ({t_first / t_reopen:.0f}x faster)")
    print(f"one more window: {t_more:.2f} s ({t_more / share:.1f}x a window's share of the first)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
