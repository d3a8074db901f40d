"""``make demo``: the reference job's arms as interleaved pairs, measured like the benchmarks.

::

    python -m fsobs.workload.demo [--out out/demo] [--pairs 3] [--steps 12] [--world-size 2]

1. Every arm (:data:`ARMS`: baseline, balanced, pec, freescale) runs once per pair with
   ``fsobs run`` on the same global batches (same seed), the pairs interleaved
   (:func:`fsobs.workload.pairs.pair_order`: the control first on even pairs, last on odd
   ones), into ``<out>/<arm>-<pair>``, so that ``fsobs dashboard --store <out>`` shows them.
   The run order is printed (and returned).
2. The first baseline is analyzed, the cost model refit from it and its traces exported with
   bubble tracks (``fsobs analyze``, ``fit-cost``, ``export``), as one run of each arm did before.
3. Each test arm against the baseline over the pairs: what ``fsobs compare --control
   baseline-0 baseline-1 ... --test arm-0 arm-1 ...`` prints (each pair, then the mean
   reduction with a Student t interval over the pairs, :mod:`fsobs.analysis.comparison.pairs`).
4. Per arm, what-if's predicted bubble reduction for the toggles the arm's runs applied
   (``run.json``; ``sync_gc`` is not modelled) from each baseline run, the mean over them
   (:func:`fsobs.workload.pairs.predicted_reductions`, as ``benchmarks/bench_ab.py --whatif``).
5. The final table (:func:`render_table`): arm | bubble reduction | straggler wait reduction |
   step time ratio | what-if predicted.

One pair of runs says little on a shared machine (one pair printed "bubble reduction -31%"
where three interleaved pairs gave +27%): the interval over pairs is the answer, and its width
says how much to trust it. With fewer than 3 pairs there is no interval (NaN).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from fsobs.analysis import Analysis, analyze_path, compare
from fsobs.analysis.comparison.pairs import PairSummary, mean_interval, summarize_pairs
from fsobs.report.comparison import render_pairs
from fsobs.workload.pairs import interleaved, predicted_reductions, whatif_toggles

__all__ = ["ARMS", "ArmRow", "DemoConfig", "DemoResult", "main", "render_table", "run_demo"]

ARMS: dict[str, tuple[str, ...]] = {
    "baseline": (),
    "balanced": ("--balance",),
    "pec": ("--priority-overlap",),
    "freescale": ("--balance", "--priority-overlap", "--sm-free", "--sync-gc"),
}
"""Each arm's ``fsobs run`` flags; the first is the control. ``freescale`` requests every
toggle (``sm_free`` is recorded as not applied without a GPU)."""
COMMON = ("--item-popularity", "1.1")
"""Every arm's flags: Zipf-popular item IDs, so that consecutive batches share IDs (PEC)."""


@dataclass(frozen=True)
class DemoConfig:
    """What the demo runs; ``arms`` are names of :data:`ARMS`, the first is the control."""

    out: Path = Path("out/demo")
    pairs: int = 3
    steps: int = 12
    world_size: int = 2
    arms: tuple[str, ...] = tuple(ARMS)
    common: tuple[str, ...] = COMMON
    draws: int = 50
    """What-if's draws per baseline run."""

    def __post_init__(self) -> None:
        for name, least in (("pairs", 2), ("steps", 4), ("world_size", 2), ("draws", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name}: must be an int >= {least}, got {value!r}")
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or len(set(self.arms)) < 2 or len(set(self.arms)) != len(self.arms):
            raise ValueError(
                f"arms: two or more distinct names of {list(ARMS)}, got {list(self.arms)}"
            )


@dataclass(frozen=True)
class ArmRow:
    """One test arm against the control, over the pairs."""

    arm: str
    summary: PairSummary
    step_time_ratio: tuple[float, tuple[float, float]]
    """Mean over the pairs of each pair's median step-time ratio (test / control), t interval."""
    toggles: tuple[str, ...]
    """The toggles what-if predicts for the arm (those its runs applied that it models)."""
    predicted: list[float | None] = field(default_factory=list)
    """What-if's predicted bubble reduction from each pair's control run."""


@dataclass(frozen=True)
class DemoResult:
    order: list[str]
    """The runs' names (``<arm>-<pair>``) in the order they ran."""
    rows: list[ArmRow]
    table: str


def run_demo(config: DemoConfig, console: Console | None = None) -> DemoResult:
    """Steps 1-5 of the module docstring; the runs' and commands' output goes to this
    process's stdout / stderr."""
    console = console or Console()
    control = config.arms[0]
    order = []
    runs = list(interleaved(config.arms, config.pairs))
    for done, (index, arm) in enumerate(runs):
        name = f"{arm}-{index}"
        console.print(f"[bold]run {done + 1}/{len(runs)}: pair {index}, {arm}[/] -> {name}")
        flags = [f"--world-size={config.world_size}", f"--steps={config.steps}"]
        _fsobs("run", f"--out={config.out / name}", *flags, *config.common, *ARMS[arm])
        order.append(name)
    print(f"run order: {', '.join(order)}", flush=True)  # one line, never wrapped
    first = str(config.out / f"{control}-0")
    _fsobs("analyze", first)
    _fsobs("fit-cost", first)
    _fsobs("export", first, str(config.out.with_name(config.out.name + "-export")))
    analyses = {name: analyze_path(config.out / name) for name in order}
    controls = [analyses[f"{control}-{i}"] for i in range(config.pairs)]
    rows = []
    for arm in config.arms[1:]:
        tests = [analyses[f"{arm}-{i}"] for i in range(config.pairs)]
        rows.append(_arm_row(arm, controls, tests))
        console.print(f"\n[bold]{control} (control) vs {arm} (test), {config.pairs} pairs[/]")
        render_pairs(rows[-1].summary, console)
    _predict(rows, controls, config.draws)
    table = render_table(rows, config.pairs)
    console.print()
    print(table)
    return DemoResult(order=order, rows=rows, table=table)


def _fsobs(*args: str) -> None:
    """``fsobs ARGS`` (this Python), its output to ours; stops the demo if it fails."""
    done = subprocess.run([sys.executable, "-m", "fsobs.cli", *args])
    if done.returncode != 0:
        raise RuntimeError(f"demo: exit code {done.returncode} from fsobs {' '.join(args)}")


def _arm_row(arm: str, controls: list[Analysis], tests: list[Analysis]) -> ArmRow:
    pairs = [compare(c, t) for c, t in zip(controls, tests, strict=True)]
    summary = summarize_pairs(pairs)
    ratio = mean_interval([p.step_time_ratio for p in pairs], summary.confidence)
    toggles = tests[0].run.meta.toggles if tests[0].run.meta is not None else {}
    applied = [name for name, status in toggles.items() if status.applied]
    return ArmRow(arm, summary, ratio, whatif_toggles(applied))


def _predict(rows: list[ArmRow], controls: list[Analysis], draws: int) -> None:
    """Fill each row's ``predicted``: one what-if per control run for every arm's toggles."""
    combos = [row.toggles for row in rows]
    for control in controls:
        predicted = predicted_reductions(control, combos, draws=draws)
        for row in rows:
            row.predicted.append(predicted[row.toggles])


def render_table(rows: Sequence[ArmRow], num_pairs: int) -> str:
    """The final table, markdown: one row per test arm."""
    lines = [
        f"| arm | bubble reduction (mean of {num_pairs} pairs, 95% CI) | straggler wait "
        "reduction (95% CI) | step time ratio test/control (95% CI) | what-if predicted "
        "bubble reduction (mean; per baseline) |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        s = row.summary
        wait = s.by_class["straggler_wait"], s.by_class_ci["straggler_wait"]
        cells = [
            row.arm,
            _with_ci(s.bubble_reduction, s.bubble_reduction_ci, "{:.1%}"),
            _with_ci(*wait, "{:.1%}"),
            _with_ci(*row.step_time_ratio, "{:.3f}"),
            _predicted(row),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _with_ci(mean: float, ci: tuple[float, float], fmt: str) -> str:
    if math.isnan(mean):
        return "n/a"
    if math.isnan(ci[0]):
        return f"{fmt.format(mean)} (no CI: < 3 pairs)"
    return f"{fmt.format(mean)} ({fmt.format(ci[0])} – {fmt.format(ci[1])})"


def _predicted(row: ArmRow) -> str:
    if not row.toggles:
        return "n/a (no toggle what-if models)"
    values = [v for v in row.predicted if v is not None and not math.isnan(v)]
    if not values:
        return f"none ({'+'.join(row.toggles)})"
    each = ", ".join(f"{v:.0%}" for v in values)
    return f"{sum(values) / len(values):.1%} ({each}; {'+'.join(row.toggles)})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    default = DemoConfig()
    parser.add_argument("--out", type=Path, default=default.out)
    parser.add_argument("--pairs", type=int, default=default.pairs)
    parser.add_argument("--steps", type=int, default=default.steps)
    parser.add_argument("--world-size", type=int, default=default.world_size)
    args = parser.parse_args(argv)
    try:
        config = DemoConfig(args.out, args.pairs, args.steps, args.world_size)
    except ValueError as error:
        print(f"demo: {error}", file=sys.stderr)
        return 2
    start = time.monotonic()
    try:
        run_demo(config)
    except RuntimeError as error:
        print(error, file=sys.stderr)
        return 1
    print(f"\n{time.monotonic() - start:.0f} s in all. Explore the runs in the dashboard: "
          f"fsobs dashboard --store {config.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
