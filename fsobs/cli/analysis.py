"""``fsobs analyze``, ``export``, ``compare`` and ``fit-cost``."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

from rich.console import Console
from rich.table import Table

from fsobs.analysis import Comparison, compare, compare_json, fit_cost
from fsobs.analysis.bubbles import BUBBLE_CLASSES
from fsobs.cli.common import (
    Commands,
    add_load_options,
    analyze_with_progress,
    console,
    example,
    load_config,
    percent,
)
from fsobs.errors import FsobsError
from fsobs.export import export_run
from fsobs.report import render, to_json, toggles_line
from fsobs.trace.loader import COST_MODEL


def add_analyze(commands: Commands) -> None:
    cmd = commands.add_parser(
        "analyze",
        help="analyze a run directory or Kineto trace files",
        epilog=example("fsobs analyze out/demo/baseline --json > report.json"),
    )
    cmd.add_argument(
        "paths", nargs="+", metavar="PATH", help="a run directory, or one or more trace files"
    )
    cmd.add_argument("--json", action="store_true", help="print one JSON object")
    add_load_options(cmd)
    cmd.set_defaults(handler=_analyze)


def add_export(commands: Commands) -> None:
    cmd = commands.add_parser(
        "export",
        help="write the run's traces with bubble tracks added (for Perfetto / chrome://tracing)",
        epilog=example("fsobs export out/demo/baseline out/demo-export"),
    )
    cmd.add_argument("run", metavar="RUN", help="a run directory, or a trace file")
    cmd.add_argument("out", metavar="OUT", help="output directory (created if needed)")
    cmd.add_argument(
        "--overwrite", action="store_true", help="replace files a previous export left in OUT"
    )
    add_load_options(cmd)
    cmd.set_defaults(handler=_export)


def add_compare(commands: Commands) -> None:
    cmd = commands.add_parser(
        "compare",
        help="A/B: the bubble reduction of run TEST against run CONTROL",
        epilog=example("fsobs compare out/demo/baseline out/demo/balanced"),
    )
    cmd.add_argument("control", metavar="CONTROL", help="the baseline run directory")
    cmd.add_argument(
        "tests", nargs="+", metavar="TEST", help="the run(s) to judge against it, one by one"
    )
    cmd.add_argument("--json", action="store_true", help="print one JSON object")
    add_load_options(cmd)
    cmd.set_defaults(handler=_compare)


def add_fit_cost(commands: Commands) -> None:
    cmd = commands.add_parser(
        "fit-cost",
        help="fit the balancer's per-sample cost model c(L) = c0 + a*L + b*L^2 on a run",
        epilog=example("fsobs fit-cost out/demo/baseline --out cost.json"),
    )
    cmd.add_argument("run", metavar="RUN", help="a run directory with step sidecars")
    cmd.add_argument("--out", help="JSON file to write (default: RUN/cost_model.json)")
    add_load_options(cmd)
    cmd.set_defaults(handler=_fit_cost)


def _analyze(args: argparse.Namespace) -> int:
    config = load_config(args)
    source = args.paths[0] if len(args.paths) == 1 else args.paths
    result = analyze_with_progress(source, config)
    if args.json:
        print(json.dumps(to_json(result), indent=2, allow_nan=False))
    else:
        render(result, console())
    return 0


def _export(args: argparse.Namespace) -> int:
    config = load_config(args)
    analysis = analyze_with_progress(args.run, config)
    out = Path(args.out)
    written = export_run(
        analysis.run,
        analysis.bubbles,
        out,
        overwrite=args.overwrite,
        max_trace_bytes=config.max_trace_bytes,
    )
    traces = [p for p in written if p.name.endswith(".trace.json.gz")]
    print(f"wrote {len(traces)} trace(s) with bubble tracks to {out}/:")
    for path in written:
        print(f"  {path.name}")
    print(
        "open one in https://ui.perfetto.dev (Open trace file) or chrome://tracing (Load); "
        'the "fsobs bubbles" process on top has one track per bubble class'
    )
    return 0


def _compare(args: argparse.Namespace) -> int:
    config = load_config(args)
    control = analyze_with_progress(args.control, config)
    results = [compare(control, analyze_with_progress(p, config)) for p in args.tests]
    if args.json:
        out = [compare_json(r) for r in results]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=2, allow_nan=False))
    else:
        for result in results:
            render_comparison(result, console())
    return 0


def render_comparison(c: Comparison, console: Console) -> None:
    """The human report of ``fsobs compare``: the KPI table, then the reductions and warnings."""
    table = Table(title=f"{c.control_name} (control) vs {c.test_name} (test)", title_justify="left")
    for header in ("KPI", "control", "test", "delta"):
        table.add_column(header, justify="right")
    for name, row in c.kpis.iterrows():
        table.add_row(str(name), *(_number(row[k]) for k in ("control", "test", "delta")))
    console.print(table)
    lo, hi = c.bubble_reduction_ci
    console.print(
        f"bubble reduction: {percent(c.bubble_reduction)} "
        f"({c.confidence:.0%} CI {percent(lo)} – {percent(hi)})"
    )
    for name in BUBBLE_CLASSES:
        lo, hi = c.by_class_ci[name]
        ci = "" if math.isnan(lo) else f" (CI {percent(lo)} – {percent(hi)})"
        console.print(f"  {name.replace('_', ' ')}: {percent(c.by_class[name])}{ci}")
    # pandas-stubs types a field as any scalar: here role and class names, then floats
    for row in cast("Iterable[Any]", c.by_role.itertuples(index=False)):
        if row.control > 0 or row.test > 0:
            ci = (
                "" if math.isnan(row.ci_lo) else f", CI {percent(row.ci_lo)} – {percent(row.ci_hi)}"
            )
            console.print(
                f"  {row.role} {row[1].replace('_', ' ')}: {row.control:.2f} -> {row.test:.2f} ms "
                f"per step (reduction {percent(row.reduction)}{ci})"
            )
    ratio = "-" if math.isnan(c.step_time_ratio) else f"{c.step_time_ratio:.3f}"
    console.print(f"step time ratio (median, test / control): {ratio}")
    same = {True: "yes", False: "no", None: "cannot tell"}[c.same_batches]
    console.print(f"same global batches: {same}")
    for role, toggles in (("control", c.control_toggles), ("test", c.test_toggles)):
        console.print(f"toggles of the {role}: {toggles_line(toggles)}")
    for warning in c.warnings:
        console.print(f"[yellow]warning:[/] {warning}")


def _number(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.3f}"


def _fit_cost(args: argparse.Namespace) -> int:
    config = load_config(args)
    fit = fit_cost(analyze_with_progress(args.run, config))
    out = Path(args.out) if args.out else Path(args.run) / COST_MODEL
    m = fit.model
    print(f"c(L) = {m.c0:.6g} ns + {m.a:.6g} ns * L + {m.b:.6g} ns * L^2  (busy time per sample)")
    print(f"R^2 {fit.r2:.4f}, RMSE {fit.rmse_ms:.3f} ms, {fit.n_points} (rank, step) points")
    try:
        m.to_json(out)
    except OSError as exc:
        raise FsobsError(f"cannot write the cost model ({exc.strerror})", path=out) from exc
    print(f"wrote {out}")
    print(f"use it with: fsobs run --balance --cost-model {out}")
    return 0
