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

``--modes`` validates each balance mode instead (issue 27, point 7): per world size and seed a
baseline and one run per mode the reference job has (``--balance-method kk``, ``lpt``), each
mode predicted from the baseline alone (``--balance-split``) and measured by ``fsobs compare``;
then, on the simulator (where the reference job has no window yet), every mode with the
windows 2, 4, 8, predicted from a simulated baseline against the simulated run in that mode:

    .venv/bin/python benchmarks/bench_whatif.py --modes --world-sizes 2 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from fsobs.analysis import analyze_path, compare
from fsobs.analysis.whatif.predict import whatif
from fsobs.analysis.whatif.splits import BalanceSplit
from fsobs.report import whatif_json
from fsobs.simulate.simulator import SimConfig, simulate, write_run
from fsobs.simulate.study import kpis

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


MODE_FLAGS = {
    "kk": ["--balance", "--balance-method=kk"],
    "lpt": ["--balance", "--balance-method=lpt"],
    "kk-unequal": ["--balance", "--balance-method=kk", "--balance-counts=unequal"],
    "window:4": ["--balance", "--balance-counts=unequal", "--balance-window=4"],
}
"""The balance modes the reference job trains (``fsobs run``)."""
SIM_MODES = ("kk", "lpt", "window:2", "window:4", "window:8")
"""The modes the simulator plays, by ``--balance-split`` name (:class:`BalanceSplit`)."""
SIM_JOBS = {
    "noise-free, fixed kernels 7 µs/step": SimConfig(
        world_size=8,
        steps=16,
        batch_per_rank=16,
        noise_sigma=0.0,
        speed_sigma=0.0,
        host_sigma=0.0,
        chunk_ns=1_000,
        optimizer_ns=1_000,
        memcpy_ns=1_000,
    ),
    "GPU-like default (noise, fixed kernels 3.5 ms/step)": SimConfig(world_size=8, steps=16),
}


def measured_modes(args: argparse.Namespace, world: int, seed: int) -> list[dict[str, Any]]:
    """A baseline and one run per mode of :data:`MODE_FLAGS`; each mode predicted from the
    baseline alone and measured against it."""
    common = [
        f"--world-size={world}",
        f"--steps={args.steps}",
        f"--seed={seed}",
        f"--model-size={args.model_size}",
    ]
    root = Path(args.out) / f"w{world}" / f"seed{seed}" / "modes"
    loads = {}
    for name, flags in (("control", []), *MODE_FLAGS.items()):
        if args.resume and complete(root / name):
            continue
        loads[name] = load_average()
        if (root / name).exists():
            shutil.rmtree(root / name)
        started = time.monotonic()
        fsobs_run(root / name, common + flags)
        print(
            f"  modes w{world} seed{seed} {name}: {time.monotonic() - started:.0f} s "
            f"(load {loads[name]:.2f})",
            file=sys.stderr,
        )
    control = analyze_path(root / "control")
    rows = []
    for mode in MODE_FLAGS:
        split = BalanceSplit.parse(mode)
        w = whatif(control, ("balance",), draws=args.draws, seed=seed, balance_split=split)
        pred = w.predictions[0]
        measured = compare(control, analyze_path(root / mode))
        lo, hi = pred.bubble_reduction_interval
        rows.append(
            {
                "world_size": world,
                "seed": seed,
                "toggle": f"balance {mode}",
                "predicted": pred.bubble_reduction,
                "interval": [lo, hi],
                "measured": measured.bubble_reduction,
                "measured_ci": list(measured.bubble_reduction_ci),
                "error_pp": 100 * (pred.bubble_reduction - measured.bubble_reduction),
                "inside": lo <= measured.bubble_reduction <= hi,
                "same_batches": measured.same_batches,
                "replay": whatif_json(w)["replay"],
                "loads": loads,
            }
        )
    return rows


def simulated_modes(seeds: list[int], draws: int, out: Path) -> list[dict[str, Any]]:
    """Every mode of :data:`SIM_MODES` on each job of :data:`SIM_JOBS`: predicted from the
    simulated baseline (written and analyzed), against the simulator's truth in that mode."""
    rows = []
    for job, cfg in SIM_JOBS.items():
        for seed in seeds:
            base_cfg = replace(cfg, seed=seed)
            base = simulate(base_cfg)
            path = out / "sim" / f"{list(SIM_JOBS).index(job)}" / f"seed{seed}"
            if path.exists():
                shutil.rmtree(path)
            write_run(base, path, workers=1)
            analysis = analyze_path(path)
            bubble = kpis(base)["bubble_ms_per_step"]
            for mode in SIM_MODES:
                split = BalanceSplit.parse(mode)
                run_cfg = replace(base_cfg, balance=split.config)
                truth = 1 - kpis(simulate(run_cfg, {"balance"}))["bubble_ms_per_step"] / bubble
                w = whatif(analysis, ("balance",), draws=draws, seed=seed, balance_split=split)
                pred = w.predictions[0].bubble_reduction
                rows.append(
                    {"job": job, "seed": seed, "mode": mode, "predicted": pred, "truth": truth}
                )
    return rows


def sim_table(rows: list[dict[str, Any]]) -> str:
    """Per job and mode: mean predicted and true reduction over the seeds, the errors."""
    lines = [
        "| simulated job | mode | seeds | mean predicted | mean true | error of the means | "
        "max abs error |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["job"], r["mode"]), []).append(r)
    for (job, mode), group in groups.items():
        p = statistics.mean(r["predicted"] for r in group)
        t = statistics.mean(r["truth"] for r in group)
        worst = max(abs(r["predicted"] - r["truth"]) for r in group)
        lines.append(
            f"| {job} | {mode} | {len(group)} | {p:.1%} | {t:.1%} | {100 * (p - t):+.1f} pp | "
            f"{100 * worst:.1f} pp |"
        )
    return "\n".join(lines)


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
    parser.add_argument(
        "--modes", action="store_true", help="validate each balance mode (module docstring)"
    )
    args = parser.parse_args()
    results = []
    started = time.monotonic()
    out = Path(args.out)
    if args.modes:
        return modes_main(args, out)
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


def modes_main(args: argparse.Namespace, out: Path) -> int:
    """``--modes``: the measured modes, then the simulated ones (module docstring)."""
    seeds = [int(s) for s in args.seeds.split(",")]
    results: list[dict[str, Any]] = []
    for world in (int(w) for w in args.world_sizes.split(",")):
        for seed in seeds:
            results += measured_modes(args, world, seed)
            (out / "modes.json").write_text(json.dumps(results, indent=1, default=str))
    sim = simulated_modes(seeds, args.draws, out)
    (out / "modes_sim.json").write_text(json.dumps(sim, indent=1))
    print(tables(results) + "\n\n" + sim_table(sim))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
