"""``fsobs analyze``, ``export``, ``compare`` and ``fit-cost``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fsobs.analysis import compare, fit_cost
from fsobs.cli.common import (
    Commands,
    add_load_options,
    analyze_with_progress,
    console,
    example,
    load_config,
)
from fsobs.errors import FsobsError
from fsobs.export import export_run
from fsobs.report import compare_json, render, render_comparison, to_json
from fsobs.runformat.names import COST_MODEL, TRACE_RE


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
    traces = [p for p in written if TRACE_RE.match(p.name)]
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
