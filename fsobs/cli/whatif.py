"""``fsobs whatif`` (each toggle predicted from one run) and ``fsobs simulate`` (N ranks)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fsobs.analysis.whatif import TOGGLES, whatif, whatif_json
from fsobs.cli.common import (
    Commands,
    add_load_options,
    analyze_with_progress,
    console,
    cost_model_path,
    example,
    load_config,
    percent,
)
from fsobs.errors import FsobsError
from fsobs.trace import LoadConfig
from optim.balance import CostModel


def _toggle_list(text: str) -> tuple[str, ...]:
    names = tuple(t.strip().replace("-", "_") for t in text.split(",") if t.strip())
    unknown = [t for t in names if t not in TOGGLES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown toggle(s) {unknown}, expected some of {','.join(TOGGLES)}"
        )
    return names


def add_whatif(commands: Commands) -> None:
    cmd = commands.add_parser(
        "whatif",
        help="predict each optimizer toggle, alone and combined, from one baseline run",
        description="Replays the run's segment graph (per rank and step, compute between the "
        "matched collectives) with each toggle applied; every number is a prediction with an "
        "interval over resampled steps and residual noise.",
        epilog=example("fsobs whatif out/demo/baseline --toggles balance,sm_free --json"),
    )
    cmd.add_argument("run", metavar="RUN", help="the baseline run directory")
    cmd.add_argument(
        "--toggles",
        type=_toggle_list,
        default=TOGGLES,
        help="comma-separated toggles; every combination of them is predicted "
        "(default: %(default)s)",
    )
    cmd.add_argument("--json", action="store_true", help="print one JSON object")
    cmd.add_argument("--draws", type=int, default=200, help="noise draws (default: %(default)s)")
    cmd.add_argument("--seed", type=int, default=0, help="of the draws (default: %(default)s)")
    cmd.add_argument(
        "--cost-model", metavar="FILE", help="the balancer's cost model (default: the run's own)"
    )
    add_load_options(cmd)
    cmd.set_defaults(handler=_whatif)


def _whatif(args: argparse.Namespace) -> int:
    if args.draws < 1:
        raise FsobsError(f"--draws must be >= 1, got {args.draws}")
    model = CostModel.from_json(cost_model_path(args.cost_model)) if args.cost_model else None
    analysis = analyze_with_progress(args.run, load_config(args))
    result = whatif(analysis, args.toggles, draws=args.draws, seed=args.seed, cost_model=model)
    if args.json:
        print(json.dumps(whatif_json(result), indent=2, allow_nan=False))
    else:
        render_whatif(whatif_json(result), console())
    return 0


def render_whatif(w: dict[str, Any], console: Console) -> None:
    """The human report of ``fsobs whatif``."""
    run, base, rep = w["run"], w["baseline"], w["replay"]
    kind = "simulated" if run["simulated"] else "measured"
    console.print(
        f"{run['path']}: {kind} {run['device'].upper()} run, {run['ranks']} ranks, "
        f"{run['steps']} steps; bubble {base['bubble_ms_per_step']:.2f} ms per rank and step "
        f"({base['bubble_ratio']:.1%} of step time), "
        f"step time p50 {base['step_time_ms_p50']:.1f} ms"
    )
    verdict = "ok" if rep["passed"] else "FAILED: predictions unreliable"
    console.print(
        f"replay check ({verdict}): step time error median {rep['step_time_median']:.2%}, "
        f"p90 {rep['step_time_p90']:.2%}; classes median {rep['classes_median']:.2%}, "
        f"p90 {rep['classes_p90']:.2%} of the step"
    )
    pct = int(round(100 * w["confidence"]))
    table = Table(
        title=f"Predicted from this run alone ({w['draws']} noise draws, {pct}% intervals)",
        title_justify="left",
    )
    for header in (
        "toggles",
        "bubble ms/step",
        "reduction",
        f"{pct}% interval",
        "straggler wait",
        "exposed comm",
        "host idle",
        "step p50 ms",
    ):
        table.add_column(header, justify="left" if header == "toggles" else "right")
    for p in w["predictions"]:
        lo, hi = p["bubble_reduction_interval"]
        cls = p["by_class"]
        table.add_row(
            " + ".join(p["toggles"]),
            _fmt(p["bubble_ms_per_step"], ".2f"),
            percent(p["bubble_reduction"]),
            f"{percent(lo)} – {percent(hi)}",
            _fmt(cls["straggler_wait"]["ms_per_step"], ".2f"),
            _fmt(cls["exposed_comm"]["ms_per_step"], ".2f"),
            _fmt(cls["host_idle"]["ms_per_step"], ".2f"),
            _fmt(p["step_time_ms_p50"], ".1f"),
        )
    o = w["oracle"]
    lo, hi = o["bubble_reduction_interval"]
    cls = o["by_class"]
    table.add_row(
        "oracle: equal compute",
        _fmt(o["bubble_ms_per_step"], ".2f"),
        percent(o["bubble_reduction"]),
        f"{percent(lo)} – {percent(hi)}",
        _fmt(cls["straggler_wait"], ".2f"),
        _fmt(cls["exposed_comm"], ".2f"),
        _fmt(cls["host_idle"], ".2f"),
        _fmt(o["step_time_ms_p50"], ".1f"),
    )
    console.print(table)
    resampled = rep.get("baseline_resampled_bubble_ms_per_step")
    if resampled is not None:
        console.print(
            f"reductions compare each draw with the baseline replayed under the same draw "
            f"(bubble {resampled:.2f} ms per rank and step on the median draw)"
        )
    if o.get("wait_from_data_ms_per_step") is not None:
        console.print(
            f"straggler wait {o['straggler_wait_ms_per_step']:.2f} ms per step: the data alone "
            f"would cause {o['wait_from_data_ms_per_step']:.2f}, the noise alone "
            f"{o['wait_from_noise_ms_per_step']:.2f} (data share {percent(o['data_share'])})"
        )
    for note in w["notes"]:
        console.print(f"note: {note}")


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def add_simulate(commands: Commands) -> None:
    cmd = commands.add_parser(
        "simulate",
        help="simulate the job on N ranks and write it in the run format (with truth.json)",
        description="Writes per-rank GPU traces, step sidecars, run.json (simulated: true) and "
        "truth.json (the true bubble classes of every rank and step) into OUT.",
        epilog=example(
            "fsobs simulate --world-size 256 --steps 20 --calibrate out/demo/baseline "
            "--toggles balance --out out/sim256"
        ),
    )
    cmd.add_argument("--world-size", type=int, required=True)
    cmd.add_argument("--steps", type=int, default=20)
    cmd.add_argument("--out", required=True, help="run directory to write")
    cmd.add_argument(
        "--calibrate",
        metavar="RUN",
        help="take cost model, noise, lengths and transfers from "
        "this measured run (default: a GPU-like job)",
    )
    cmd.add_argument("--toggles", type=_toggle_list, default=(), help="policies to simulate")
    cmd.add_argument("--seed", type=int, default=0)
    cmd.add_argument("--workers", type=int, default=None, help="writer processes (default: CPUs)")
    cmd.set_defaults(handler=_simulate)


def _simulate(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from fsobs.simulate.simulator import SimConfig, calibrate, simulate, write_run
    from fsobs.simulate.study import kpis

    if args.world_size < 2 or args.steps < 1:
        raise FsobsError("--world-size must be >= 2 and --steps >= 1")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise FsobsError("the output directory is not empty", path=out)
    if args.calibrate:
        base = calibrate(analyze_with_progress(args.calibrate, LoadConfig()))
    else:
        base = SimConfig()
    cfg = replace(base, world_size=args.world_size, steps=args.steps, seed=args.seed)
    sched = simulate(cfg, args.toggles)
    write_run(sched, out, workers=args.workers)
    k = kpis(sched)
    print(
        f"wrote {out}: simulated, {args.world_size} ranks x {args.steps} steps, toggles: "
        f"{', '.join(args.toggles) or 'none'} ({cfg.source})\n"
        f"truth: bubble {k['bubble_ratio']:.1%} of step time, {k['bubble_ms_per_step']:.2f} ms "
        f"per rank and step (straggler wait {k['straggler_wait_ms_per_step']:.2f}, exposed comm "
        f"{k['exposed_comm_ms_per_step']:.2f}, host idle {k['host_idle_ms_per_step']:.2f}); "
        f"analyze it with: fsobs analyze {out}"
    )
    return 0
