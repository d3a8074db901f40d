"""``fsobs analyze``, ``export``, ``compare`` and ``fit-cost``."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

from fsobs.analysis.fit_shapes import FIT_SHAPES
from fsobs.cli.commands import COMMANDS
from fsobs.cli.common import (
    Commands,
    add_load_options,
    analyze_with_progress,
    console,
    example,
    load_config,
)
from fsobs.errors import FsobsError

if TYPE_CHECKING:
    from fsobs.analysis import CostFit


def add_analyze(commands: Commands) -> None:
    cmd = commands.add_parser(
        "analyze",
        help=COMMANDS["analyze"].help,
        epilog=example("fsobs analyze out/demo/baseline-0 --json > report.json"),
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
        help=COMMANDS["export"].help,
        epilog=example("fsobs export out/demo/baseline-0 out/demo-export"),
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
        help=COMMANDS["compare"].help,
        description=(
            "CONTROL TEST [TEST ...] compares each TEST with CONTROL; --control A1 A2 A3 --test "
            "B1 B2 B3 compares A_i with B_i and adds the reduction over the pairs, with a "
            "Student t interval (one pair's interval covers its steps, not run-to-run variation)"
        ),
        epilog=example(
            "fsobs compare out/demo/baseline-0 out/demo/balanced-0; "
            "fsobs compare --control s0/base s1/base s2/base --test s0/bal s1/bal s2/bal"
        ),
    )
    cmd.add_argument(
        "runs",
        nargs="*",
        metavar="RUN",
        help="CONTROL, then the TEST run(s) to judge against it one by one",
    )
    cmd.add_argument("--control", nargs="+", metavar="RUN", help="the control runs of the pairs")
    cmd.add_argument(
        "--test", nargs="+", metavar="RUN", help="the test runs, matched with --control by position"
    )
    cmd.add_argument("--json", action="store_true", help="print one JSON object")
    add_load_options(cmd)
    cmd.set_defaults(handler=_compare)


def add_fit_cost(commands: Commands) -> None:
    cmd = commands.add_parser(
        "fit-cost",
        help=COMMANDS["fit-cost"].help,
        epilog=example("fsobs fit-cost out/demo/baseline-0 --out cost.json"),
    )
    cmd.add_argument("run", metavar="RUN", help="a run directory with step sidecars")
    cmd.add_argument("--out", help="JSON file to write (default: RUN/cost_model.json)")
    cmd.add_argument(
        "--shape",
        choices=FIT_SHAPES,
        default="additive",
        help="additive: per sample c0 + a*L + b*L^2 (default); padded: per rank and step "
        "batch + c0*n + a*sum(L) + p*n*max(L)^2 (attention padded to the longest sample); "
        "auto: fit both, keep the one of higher R^2",
    )
    cmd.add_argument(
        "--min-r2",
        type=_r2,
        metavar="X",
        help="fail (exit 2, nothing written) when the fit's R^2 is below X or undefined",
    )
    add_load_options(cmd)
    cmd.set_defaults(handler=_fit_cost)


def _r2(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number <= 1, got {text!r}")
    return value


def _formula(fit: CostFit) -> str:
    """The fitted model as a line of ``fit-cost``'s output."""
    m = fit.model
    if fit.shape == "additive":
        return (
            f"c(L) = {m.c0:.6g} ns + {m.a:.6g} ns * L + {m.b:.6g} ns * L^2  (busy time per sample)"
        )
    return (
        f"cost = {m.batch:.6g} ns + {m.c0:.6g} ns * n + {m.a:.6g} ns * sum(L) + {m.padded:.6g} ns "
        "* n * max(L)^2  (busy time per rank and step, padded)"
    )


def _analyze(args: argparse.Namespace) -> int:
    config = load_config(args)
    source = args.paths[0] if len(args.paths) == 1 else args.paths
    result = analyze_with_progress(source, config)
    from fsobs.report import render, to_json  # after the read: it starts as soon as it can

    if args.json:
        print(json.dumps(to_json(result), indent=2, allow_nan=False))
    else:
        render(result, console())
    return 0


def _export(args: argparse.Namespace) -> int:
    from fsobs.export import export_run
    from fsobs.runformat.names import TRACE_RE

    config = load_config(args)
    analysis = analyze_with_progress(args.run, config)
    out = Path(args.out)
    written = export_run(
        analysis.run,
        analysis.bubbles,
        out,
        overwrite=args.overwrite,
        max_trace_bytes=config.max_trace_bytes,
        critical_path=analysis.critical_path,
        offsets_ns=analysis.collectives.offsets_ns,
    )
    traces = [p for p in written if TRACE_RE.match(p.name)]
    print(f"wrote {len(traces)} trace(s) with bubble tracks to {out}/:")
    for path in written:
        print(f"  {path.name}")
    print(
        "open one in https://ui.perfetto.dev (Open trace file) or chrome://tracing (Load); "
        'the "fsobs bubbles" process on top has one track per bubble class, '
        '"fsobs critical path" under it each step\'s path, with arrows from rank to rank'
    )
    return 0


def _compare(args: argparse.Namespace) -> int:
    from fsobs.analysis import compare
    from fsobs.analysis.comparison.pairs import summarize_pairs
    from fsobs.report import compare_json, render_comparison
    from fsobs.report.comparison import pairs_json, render_pairs

    config = load_config(args)
    pairs = _pairs(args)
    if pairs is not None:
        results = [
            compare(analyze_with_progress(c, config), analyze_with_progress(t, config))
            for c, t in pairs
        ]
        summary = summarize_pairs(results)
        if args.json:
            print(json.dumps(pairs_json(summary), indent=2, allow_nan=False))
        else:
            render_pairs(summary, console())
        return 0
    control = analyze_with_progress(args.runs[0], config)
    results = [compare(control, analyze_with_progress(p, config)) for p in args.runs[1:]]
    if args.json:
        out = [compare_json(r) for r in results]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=2, allow_nan=False))
    else:
        for result in results:
            render_comparison(result, console())
    return 0


def _pairs(args: argparse.Namespace) -> list[tuple[str, str]] | None:
    """The (control, test) pairs of ``--control`` / ``--test``; None for the positional form
    (FsobsError for a mix of both, or counts that do not pair up)."""
    if args.control is None and args.test is None:
        if len(args.runs) < 2:
            raise FsobsError("compare: give CONTROL TEST, or --control RUN ... --test RUN ...")
        return None
    if args.runs:
        raise FsobsError("compare: give CONTROL TEST or --control / --test, not both")
    if args.control is None or args.test is None:
        raise FsobsError("compare: --control and --test go together")
    if len(args.control) != len(args.test):
        raise FsobsError(
            f"compare: {len(args.control)} --control run(s) but {len(args.test)} --test run(s); "
            "pairs are matched by position"
        )
    return list(zip(args.control, args.test, strict=True))


def _fit_cost(args: argparse.Namespace) -> int:
    from fsobs.analysis import fit_cost
    from fsobs.runformat.names import COST_MODEL

    config = load_config(args)
    fit = fit_cost(analyze_with_progress(args.run, config), shape=args.shape)
    if args.min_r2 is not None and not fit.r2 >= args.min_r2:
        r2 = "n/a" if math.isnan(fit.r2) else f"{fit.r2:.4f}"
        raise FsobsError(
            f"R^2 {r2} of the cost model is below --min-r2 {args.min_r2}: it explains "
            "too little of the busy time to balance by; nothing written",
            path=args.run,
        )
    out = Path(args.out) if args.out else Path(args.run) / COST_MODEL
    m = fit.model
    print(_formula(fit))
    print(f"R^2 {fit.r2:.4f}, RMSE {fit.rmse_ms:.3f} ms, {fit.n_points} (rank, step) points")
    if fit.choice is not None:
        print(fit.choice)
    for warning in (fit.coverage, fit.warning):
        if warning is not None:
            print(f"warning: {warning}")
    try:
        m.to_json(out)
    except OSError as exc:
        raise FsobsError(f"cannot write the cost model ({exc.strerror})", path=out) from exc
    print(f"wrote {out}")
    print(f"use it with: fsobs run --balance --cost-model {out}  (the reference job)")
    print(
        f"  or in your own loop: optim.CostModel.from_json({str(out)!r}), passed as cost_model= "
        "to optim.FreeScale and fsobs.collect.RunRecorder"
    )
    return 0
