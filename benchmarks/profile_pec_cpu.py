"""Profile: where a CPU run's training-thread time goes, per ``## ... ##`` range and step.

Reads the Kineto traces of a run (``fsobs run ...``, any world size) and prints, as mean ms per
rank and step over the recorded steps:

1. every range directly under the ProfilerStep (step numbers dropped from the names:
   ``## copy_batch_to_gpu 7 ##`` -> ``## copy_batch_to_gpu ##``), inclusive;
2. under each of those, and under each PEC range wherever it is nested, the self time of what
   runs inside it, by name (a range's self time is Python between ops, or a blocking wait
   when the range is a ``wait()``), the largest first.

The training thread is the thread of the ProfilerStep annotations. Used for issue 22's PEC
profile (one short run per arm, on a shared machine: noisy)::

    fsobs run --world-size 2 --steps 12 --item-popularity 1.1 --out /tmp/base
    fsobs run --world-size 2 --steps 12 --item-popularity 1.1 --priority-overlap --out /tmp/pec
    .venv/bin/python benchmarks/profile_pec_cpu.py /tmp/base /tmp/pec
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

import pandas as pd

from fsobs import load_run
from optim.markers import PEC_RANGES

DETAIL = (*PEC_RANGES, "## forward ##", "## optimizer ##", "## backward ##")
"""Ranges whose self-time breakdown is printed wherever they are nested."""
_STEP_NUMBER = re.compile(r" \d+ ##$")


def _label(name: str) -> str:
    return _STEP_NUMBER.sub(" ##", name)


def _main_thread(events: pd.DataFrame) -> pd.DataFrame:
    steps = events[events["kind"] == "step"]
    (tid,) = steps["tid"].unique()
    main = events[(events["tid"] == tid) & events["step"].notna()]
    return main.sort_values(["ts_ns", "dur_ns"], ascending=[True, False])


def _walk(main: pd.DataFrame) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Inclusive ns of each top-level range and self ns by name under each detail range."""
    top: dict[str, float] = defaultdict(float)
    detail: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    stack: list[list] = []  # [end_ns, label, children_ns, owner, dur_ns]
    names = main["name"].astype(str).to_numpy()
    kinds = main["kind"].astype(str).to_numpy()

    def close(frame: list) -> None:
        _, label, child, owner, dur = frame
        if owner is not None:
            detail[owner][label] += dur - child

    for ts, dur, name, kind in zip(
        main["ts_ns"].to_numpy(), main["dur_ns"].to_numpy(), names, kinds, strict=True
    ):
        while stack and ts >= stack[-1][0]:
            close(stack.pop())
        label = _label(name)
        if stack:
            stack[-1][2] += dur
        if kind == "step":
            stack.append([ts + dur, label, 0, None, dur])
            continue
        depth_one = len(stack) == 1
        if depth_one:
            top[label] += dur
        owner = label if depth_one or label in DETAIL else stack[-1][3]
        stack.append([ts + dur, label, 0, owner, dur])
    while stack:
        close(stack.pop())
    return top, detail


def profile(run: Path, top_n: int) -> list[str]:
    """The report of one run (module docstring)."""
    loaded = load_run(run)
    tops, details, n = defaultdict(float), defaultdict(lambda: defaultdict(float)), 0
    for trace in loaded.ranks.values():
        main = _main_thread(trace.events)
        n += int((main["kind"] == "step").sum())
        top, detail = _walk(main)
        for k, v in top.items():
            tops[k] += v
        for owner, by_name in detail.items():
            for k, v in by_name.items():
                details[owner][k] += v
    ms = 1e6 * n
    lines = [f"{run}: {len(loaded.ranks)} ranks, {n} rank-steps; mean ms per rank and step"]
    for label, total in sorted(tops.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {total / ms:8.2f}  {label}")
    for owner, by_name in sorted(details.items(), key=lambda kv: -sum(kv[1].values())):
        lines.append(f"  self time under {owner}: {sum(by_name.values()) / ms:.2f}")
        for label, total in sorted(by_name.items(), key=lambda kv: -kv[1])[:top_n]:
            lines.append(f"      {total / ms:8.3f}  {label}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=12, help="names shown per range")
    args = parser.parse_args(argv)
    for run in args.runs:
        print("\n".join(profile(run, args.top)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
