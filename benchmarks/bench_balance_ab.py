"""Benchmark: baseline vs balanced reference job on the same global batches (issue 5 A/B).

For each world size, runs pairs of jobs (baseline, then ``--balance``), same seed so the same
global batches, alternating so both see the same machine; analyzes each run with fsobs and
compares them with ``fsobs.analysis.compare``. Reports, per world size, the median over pairs of:
straggler-wait reduction (goal >= 90%), total bubble reduction (with the bootstrap CI of the
median pair), and the step-time ratio (balanced / baseline). ``--fit`` first fits the cost
model on an extra baseline run (``fsobs fit-cost``) and balances with it.

    .venv/bin/python benchmarks/bench_balance_ab.py [--world-sizes 2,4] [--pairs 3] [--fit]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fsobs.analysis import analyze_path
from fsobs.analysis.compare import Comparison, compare


@dataclass
class Pair:
    straggler_ms: tuple[float, float]
    bubble_ms: tuple[float, float]
    imbalance: tuple[float, float]
    """Mean over steps of max/mean estimated rank cost: random split, balanced split."""
    explained: tuple[float, float]
    """Share of the straggler wait the data explains (fsobs attribution), baseline, balanced."""
    result: Comparison


def run(out: Path, world: int, args: argparse.Namespace, extra: list[str]) -> None:
    cmd = [
        sys.executable, "-m", "fsobs.cli", "run", f"--world-size={world}", f"--out={out}",
        f"--steps={args.steps}", f"--model-size={args.model_size}", f"--preset={args.preset}",
        f"--batch-size={args.batch_size}", *extra,
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)


def fit(tmp: Path, world: int, args: argparse.Namespace) -> list[str]:
    """Fit the cost model on a baseline run; the flags that use it."""
    out = tmp / f"fit{world}"
    run(out, world, args, [])
    model = tmp / f"cost{world}.json"
    cmd = [sys.executable, "-m", "fsobs.cli", "fit-cost", str(out), "--out", str(model)]
    fitted = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    print(fitted.strip(), file=sys.stderr)
    return [f"--cost-model={model}"]


def pair(tmp: Path, world: int, index: int, args: argparse.Namespace, flags: list[str]) -> Pair:
    base, bal = tmp / f"w{world}-base{index}", tmp / f"w{world}-bal{index}"
    run(base, world, args, [])
    run(bal, world, args, ["--balance", f"--balance-method={args.method}", *flags])
    a, b = analyze_path(base), analyze_path(bal)
    result = compare(a, b)
    strag = (a.summary["straggler_wait_ms_per_step"], b.summary["straggler_wait_ms_per_step"])
    bubble = (a.summary["bubble_ms_per_step"], b.summary["bubble_ms_per_step"])
    side = b.run.sidecar
    imb = (float(side["imbalance_before"].mean()), float(side["imbalance_after"].mean()))
    explained = tuple(
        x.attribution.explained_wait_share if x.attribution else float("nan") for x in (a, b)
    )
    print(
        f"  world {world} pair {index}: straggler {strag[0]:.1f} -> {strag[1]:.1f} ms/step, "
        f"bubble {bubble[0]:.1f} -> {bubble[1]:.1f} ms/step, "
        f"step time x{result.step_time_ratio:.3f}, same batches {result.same_batches}, "
        f"cost imbalance {imb[0]:.3f} -> {imb[1]:.4f}, "
        f"wait explained by data {explained[0]:.0%} -> {explained[1]:.0%}",
        file=sys.stderr,
    )
    return Pair(strag, bubble, imb, (explained[0], explained[1]), result)


def report(world: int, pairs: list[Pair]) -> str:
    strag = statistics.median(1 - p.straggler_ms[1] / p.straggler_ms[0] for p in pairs)
    reductions = [p.result.bubble_reduction for p in pairs]
    mid = pairs[reductions.index(statistics.median_low(reductions))].result
    lo, hi = mid.bubble_reduction_ci
    ratio = statistics.median(p.result.step_time_ratio for p in pairs)
    base = statistics.median(p.straggler_ms[0] for p in pairs)
    bal = statistics.median(p.straggler_ms[1] for p in pairs)
    imb = [statistics.median(p.imbalance[i] for p in pairs) for i in (0, 1)]
    expl = [statistics.median(p.explained[i] for p in pairs) for i in (0, 1)]
    return (
        f"| {world} | {len(pairs)} | {imb[0]:.3f} -> {imb[1]:.4f} | {base:.1f} -> {bal:.1f} | "
        f"{strag:.1%} | {statistics.median(reductions):.1%} ({lo:.1%} – {hi:.1%}) | "
        f"{ratio:.3f} | {expl[0]:.0%} -> {expl[1]:.0%} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--model-size", default="small")
    parser.add_argument("--preset", default="lognormal")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--method", default="kk", choices=["kk", "lpt"])
    parser.add_argument("--fit", action="store_true", help="balance with a fitted cost model")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for world in (int(w) for w in args.world_sizes.split(",")):
            flags = fit(Path(tmp), world, args) if args.fit else []
            pairs = [pair(Path(tmp), world, i, args, flags) for i in range(args.pairs)]
            rows.append(report(world, pairs))
    print(
        f"model {args.model_size}, preset {args.preset}, {args.batch_size} samples/rank/step, "
        f"{args.steps} steps, method {args.method}, cost model "
        f"{'fitted' if args.fit else 'analytic'}; medians over pairs"
    )
    print("| ranks | pairs | est. cost max/mean (base -> bal) | straggler wait ms/step "
          "(base -> bal) | straggler reduction | bubble reduction (95% CI) | step time ratio "
          "| wait explained by data (base -> bal) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
