"""Benchmark: the what-if's predictions against measured A/B runs of the reference job.

For every world size and seed it trains, with the same seed (so the same global batches):

- ``balance``: a calibration baseline, then a measured baseline and a ``--balance`` run;
- ``priority_overlap``: the same three with ``--dense-mb 16`` (a large dense all-reduce), the
  test run with ``--priority-overlap``.

The prediction comes from the calibration run alone (``fsobs.analysis.whatif``); the measured
reduction is ``fsobs compare`` of the two other runs. The calibration runs also give the
replay check (the replay of the unchanged graph against the measured run). Results:
``OUT/results.json`` and Markdown tables on stdout. Run it on a quiet machine:

    .venv/bin/python benchmarks/bench_whatif.py --world-sizes 2,4 --seeds 0,1,2 --steps 12
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from fsobs.analysis import analyze_path, compare
from fsobs.analysis.whatif.predict import whatif
from fsobs.report import whatif_json

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import fsobs_run  # noqa: E402

EXPERIMENTS = {
    "balance": ([], ["--balance"]),
    "priority_overlap": (["--dense-mb=16"], ["--dense-mb=16", "--priority-overlap"]),
}


def complete(out: Path) -> bool:
    """A run this benchmark wrote before (``--resume`` keeps it)."""
    meta = out / "run.json"
    return meta.exists() and json.loads(meta.read_text()).get("status") == "complete"


def load_average() -> float:
    return os.getloadavg()[0]


def one(args: argparse.Namespace, world: int, seed: int, toggle: str) -> dict[str, Any]:
    common = [
        f"--world-size={world}",
        f"--steps={args.steps}",
        f"--seed={seed}",
        f"--model-size={args.model_size}",
    ]
    base_flags, test_flags = EXPERIMENTS[toggle]
    root = Path(args.out) / f"w{world}" / f"seed{seed}" / toggle
    loads = {}
    for name, flags in (("calibration", base_flags), ("control", base_flags), ("test", test_flags)):
        if args.resume and complete(root / name):
            continue
        loads[name] = load_average()
        started = time.monotonic()
        if (root / name).exists():
            shutil.rmtree(root / name)  # an unfinished run of an earlier call
        fsobs_run(root / name, common + flags)
        print(
            f"  {toggle} w{world} seed{seed} {name}: {time.monotonic() - started:.0f} s "
            f"(load {loads[name]:.2f})",
            file=sys.stderr,
        )
    calibration = analyze_path(root / "calibration")
    w = whatif(calibration, (toggle,), draws=args.draws, seed=seed)
    data = whatif_json(w)
    pred = w.predictions[0]
    measured = compare(analyze_path(root / "control"), analyze_path(root / "test"))
    return {
        "world_size": world,
        "seed": seed,
        "toggle": toggle,
        "predicted": pred.bubble_reduction,
        "interval": list(pred.bubble_reduction_interval),
        "measured": measured.bubble_reduction,
        "measured_ci": list(measured.bubble_reduction_ci),
        "error_pp": 100 * (pred.bubble_reduction - measured.bubble_reduction),
        "inside": pred.bubble_reduction_interval[0]
        <= measured.bubble_reduction
        <= pred.bubble_reduction_interval[1],
        "same_batches": measured.same_batches,
        "replay": data["replay"],
        "calibration_bubble_ms": w.baseline["bubble_ms_per_step"],
        "control_bubble_ms": measured.kpis.loc["bubble_ms_per_step", "control"],
        "test_bubble_ms": measured.kpis.loc["bubble_ms_per_step", "test"],
        "loads": loads,
        "whatif": data,
    }


def tables(results: list[dict[str, Any]]) -> str:
    lines = [
        "| toggle | ranks | seed | predicted (95% interval) | measured (95% CI) | error |",
        "|---|--:|--:|---|---|--:|",
    ]
    for r in results:
        lo, hi = r["interval"]
        mlo, mhi = r["measured_ci"]
        lines.append(
            f"| {r['toggle']} | {r['world_size']} | {r['seed']} | {r['predicted']:.1%} "
            f"({lo:.1%} – {hi:.1%}) | {r['measured']:.1%} ({mlo:.1%} – {mhi:.1%}) | "
            f"{r['error_pp']:+.1f} pp |"
        )
    lines += [
        "",
        "| toggle | ranks | mean predicted | mean measured | error of the means | "
        "mean abs error | measured inside the interval |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["toggle"], r["world_size"]), []).append(r)
    for (toggle, world), rows in groups.items():
        p = statistics.mean(r["predicted"] for r in rows)
        m = statistics.mean(r["measured"] for r in rows)
        mae = statistics.mean(abs(r["error_pp"]) for r in rows)
        inside = sum(r["inside"] for r in rows)
        lines.append(
            f"| {toggle} | {world} | {p:.1%} | {m:.1%} | {100 * (p - m):+.1f} pp | "
            f"{mae:.1f} pp | {inside}/{len(rows)} |"
        )
    lines += [
        "",
        "| run | ranks | steps | step time error median / p90 / max | "
        "class error median / p90 / max |",
        "|---|--:|--:|---|---|",
    ]
    for r in results:
        e = r["replay"]
        lines.append(
            f"| calibration {r['toggle']} seed {r['seed']} | {r['world_size']} | {e['steps']} | "
            f"{e['step_time_median']:.2%} / {e['step_time_p90']:.2%} / {e['step_time_max']:.2%} "
            f"| {e['classes_median']:.2%} / {e['classes_p90']:.2%} / {e['classes_max']:.2%} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--toggles", default="balance,priority_overlap")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--model-size", default="small")
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--out", default="bench_data/whatif")
    parser.add_argument(
        "--resume", action="store_true", help="keep the complete runs a previous call wrote"
    )
    args = parser.parse_args()
    results = []
    started = time.monotonic()
    out = Path(args.out)
    for world in (int(w) for w in args.world_sizes.split(",")):
        for seed in (int(s) for s in args.seeds.split(",")):
            for toggle in args.toggles.split(","):
                results.append(one(args, world, seed, toggle))
                (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print(tables(results))
    print(
        f"\n{len(results)} experiments, {3 * len(results)} runs, "
        f"{(time.monotonic() - started) / 60:.1f} min",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
