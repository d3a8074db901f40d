"""The ``fsobs`` command.

Bad input (unreadable or malformed traces, inconsistent runs) prints one line naming the file,
rank and field to stderr and exits with code 2; argparse usage errors exit with 2 as well.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TypeAlias

from rich.console import Console
from rich.table import Table

import fsobs
from fsobs.analysis import Comparison, analyze_path, compare, compare_json, fit_cost
from fsobs.analysis.bubbles import BUBBLE_CLASSES
from fsobs.errors import FsobsError
from fsobs.export import export_run
from fsobs.report import render, to_json
from fsobs.trace import LoadConfig
from fsobs.trace.loader import COST_MODEL
from optim.balance import METHODS, CostModel

EXIT_BAD_INPUT = 2
DEFAULT_PORT = 8501
BALANCE_MODES = ("plan", "shuffle")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fsobs", description="Find and explain computational bubbles in PyTorch traces."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_analyze(commands)
    _add_export(commands)
    _add_compare(commands)
    _add_fit_cost(commands)
    _add_dashboard(commands)
    _add_run(commands)
    return parser


_Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _add_analyze(commands: _Commands) -> None:
    cmd = commands.add_parser("analyze", help="analyze a run directory or Kineto trace files")
    cmd.add_argument(
        "paths", nargs="+", metavar="PATH", help="a run directory, or one or more trace files"
    )
    cmd.add_argument("--json", action="store_true", help="print one JSON object")
    _add_load_options(cmd)
    cmd.set_defaults(handler=_analyze)


def _add_export(commands: _Commands) -> None:
    cmd = commands.add_parser(
        "export",
        help="write the run's traces with bubble tracks added (for Perfetto / chrome://tracing)",
    )
    cmd.add_argument("run", metavar="RUN", help="a run directory, or a trace file")
    cmd.add_argument("out", metavar="OUT", help="output directory (created if needed)")
    cmd.add_argument(
        "--overwrite", action="store_true", help="replace files a previous export left in OUT"
    )
    _add_load_options(cmd)
    cmd.set_defaults(handler=_export)


def _add_compare(commands: _Commands) -> None:
    cmd = commands.add_parser(
        "compare", help="A/B: the bubble reduction of run TEST against run CONTROL"
    )
    cmd.add_argument("control", metavar="CONTROL", help="the baseline run directory")
    cmd.add_argument("test", metavar="TEST", help="the run to judge against it")
    cmd.add_argument("--json", action="store_true", help="print one JSON object")
    _add_load_options(cmd)
    cmd.set_defaults(handler=_compare)


def _add_fit_cost(commands: _Commands) -> None:
    cmd = commands.add_parser(
        "fit-cost",
        help="fit the balancer's per-sample cost model c(L) = c0 + a*L + b*L^2 on a run",
    )
    cmd.add_argument("run", metavar="RUN", help="a run directory with step sidecars")
    cmd.add_argument("--out", help="JSON file to write (default: RUN/cost_model.json)")
    _add_load_options(cmd)
    cmd.set_defaults(handler=_fit_cost)


def _add_dashboard(commands: _Commands) -> None:
    cmd = commands.add_parser("dashboard", help="open the Streamlit dashboard on a run store")
    cmd.add_argument(
        "--store", default="traces", help="directory of runs to show (default: %(default)s)"
    )
    cmd.add_argument("--port", type=int, default=DEFAULT_PORT, help="(default: %(default)s)")
    cmd.set_defaults(handler=_dashboard)


def _add_run(commands: _Commands) -> None:
    cmd = commands.add_parser(
        "run",
        help="train the reference job on N ranks with torchrun, writing a run directory",
        description="Extra torchrun flags for multi-node runs go after '--' "
        "(e.g. -- --nnodes 2 --node-rank 0 --rdzv-endpoint host:29500).",
    )
    cmd.add_argument("--world-size", type=int, required=True, help="ranks on this node")
    cmd.add_argument("--steps", type=int, default=20)
    cmd.add_argument("--out", required=True, help="run directory to write")
    cmd.add_argument("--preset", default="lognormal", help="sequence-length distribution")
    cmd.add_argument("--model-size", default="small", choices=["tiny", "small", "medium"])
    cmd.add_argument("--batch-size", type=int, default=32, help="samples per rank and step")
    cmd.add_argument("--num-samples", type=int, default=None, help="samples in the data set")
    cmd.add_argument("--seed", type=int, default=0)
    cmd.add_argument("--threads-per-rank", type=int, default=None)
    cmd.add_argument("--no-profile", action="store_true", help="train without the profiler")
    cmd.add_argument(
        "--balance", action="store_true", help="balance each global batch's cost across ranks"
    )
    cmd.add_argument(
        "--balance-method",
        choices=METHODS,
        help="partitioner for --balance (default: kk, Karmarkar-Karp)",
    )
    cmd.add_argument(
        "--balance-mode",
        choices=BALANCE_MODES,
        help="plan: every rank plans from the lengths; shuffle: all-gather the costs and "
        "exchange samples (default: plan)",
    )
    cmd.add_argument(
        "--cost-model", metavar="FILE", help="cost model JSON for --balance (fsobs fit-cost)"
    )
    cmd.add_argument("rdzv", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    cmd.set_defaults(handler=_run)


def _add_load_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-trace-gb",
        type=_positive_gb,
        default=LoadConfig().max_trace_bytes / 2**30,
        help="refuse trace files that decompress to more than this (default: %(default)g)",
    )
    parser.add_argument(
        "--step-marker",
        metavar="NAME",
        help="iterations are the CPU ranges whose name starts with NAME, not ProfilerStep#N "
        "(traces without either are analyzed as one window per rank)",
    )


def _load_config(args: argparse.Namespace) -> LoadConfig:
    return LoadConfig(
        max_trace_bytes=int(args.max_trace_gb * 2**30), step_marker=args.step_marker or None
    )


def _positive_gb(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value * 2**30 >= 1:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"must be a positive size in GiB, got {text!r}")
    return value


def _analyze(args: argparse.Namespace) -> int:
    config = _load_config(args)
    source = args.paths[0] if len(args.paths) == 1 else args.paths
    result = analyze_path(source, config)
    if args.json:
        print(json.dumps(to_json(result), indent=2, allow_nan=False))
    else:
        render(result, _console())
    return 0


def _export(args: argparse.Namespace) -> int:
    config = _load_config(args)
    analysis = analyze_path(args.run, config)
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
    config = _load_config(args)
    result = compare(analyze_path(args.control, config), analyze_path(args.test, config))
    if args.json:
        print(json.dumps(compare_json(result), indent=2, allow_nan=False))
    else:
        render_comparison(result, _console())
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
        f"bubble reduction: {_percent(c.bubble_reduction)} "
        f"({c.confidence:.0%} CI {_percent(lo)} – {_percent(hi)})"
    )
    for name in BUBBLE_CLASSES:
        lo, hi = c.by_class_ci[name]
        ci = "" if math.isnan(lo) else f" (CI {_percent(lo)} – {_percent(hi)})"
        console.print(f"  {name.replace('_', ' ')}: {_percent(c.by_class[name])}{ci}")
    ratio = "-" if math.isnan(c.step_time_ratio) else f"{c.step_time_ratio:.3f}"
    console.print(f"step time ratio (median, test / control): {ratio}")
    same = {True: "yes", False: "no", None: "cannot tell"}[c.same_batches]
    console.print(f"same global batches: {same}")
    for warning in c.warnings:
        console.print(f"[yellow]warning:[/] {warning}")


def _number(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.3f}"


def _percent(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.1%}"


def _console() -> Console:
    return Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)


def _fit_cost(args: argparse.Namespace) -> int:
    config = _load_config(args)
    fit = fit_cost(analyze_path(args.run, config))
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


def dashboard_app() -> Path:
    """Where the Streamlit entry file of a source checkout is (next to the fsobs package)."""
    return Path(fsobs.__file__).resolve().parents[1] / "dashboard" / "streamlit_app.py"


def dashboard_command(app: Path, port: int) -> list[str]:
    """The ``streamlit run`` command line of ``fsobs dashboard``."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app),
        "--server.headless",
        "true",
        "--server.port",
        str(port),
        "--browser.gatherUsageStats",
        "false",
    ]


def _dashboard(args: argparse.Namespace) -> int:
    app = dashboard_app()
    if not app.is_file():
        raise FsobsError("no dashboard app here (it ships with the source checkout)", path=app)
    if importlib.util.find_spec("streamlit") is None:
        raise FsobsError("streamlit is not installed: pip install 'freescale[dashboard]'")
    if not 0 < args.port < 65536:
        raise FsobsError(f"--port must be in 1..65535, got {args.port}")
    store = Path(args.store).resolve()
    if store.exists() and not store.is_dir():
        raise FsobsError("the run store is not a directory", path=store)
    print(f"dashboard on http://localhost:{args.port} (run store {store}); Ctrl+C stops it")
    env = os.environ | {"FSOBS_STORE": str(store)}
    try:
        return subprocess.run(dashboard_command(app, args.port), env=env).returncode
    except KeyboardInterrupt:
        return 0


def job_args(args: argparse.Namespace) -> list[str]:
    """The training job's flags for ``fsobs run`` (checks the balance options and the cost
    model file, whose path is made absolute)."""
    out = [
        f"--steps={args.steps}",
        f"--preset={args.preset}",
        f"--model-size={args.model_size}",
        f"--batch-size={args.batch_size}",
        f"--seed={args.seed}",
    ] + (["--no-profile"] if args.no_profile else [])
    if args.num_samples is not None:
        out.append(f"--num-samples={args.num_samples}")
    for flag, value in (
        ("--balance-method", args.balance_method),
        ("--balance-mode", args.balance_mode),
    ):
        if value is not None and not args.balance:
            raise FsobsError(f"{flag} needs --balance")
    if args.balance:
        out.append("--balance")
        out.append(f"--balance-method={args.balance_method or 'kk'}")
        out.append(f"--balance-mode={args.balance_mode or 'plan'}")
    if args.cost_model is not None:
        out.append(f"--cost-model={_cost_model_path(args.cost_model)}")
    return out


def _cost_model_path(text: str) -> Path:
    """The absolute path of a readable cost model file (FsobsError naming the file if not)."""
    path = Path(text).resolve()
    if not path.is_file():
        raise FsobsError(
            "cost model file not found (write one with: fsobs fit-cost RUN)", path=path
        )
    try:
        CostModel.from_json(path)
    except OSError as exc:
        raise FsobsError(f"cannot read the cost model ({exc.strerror})", path=path) from exc
    except ValueError as exc:  # its message starts with the path
        raise FsobsError(f"bad cost model: {exc}") from exc
    return path


def _run(args: argparse.Namespace) -> int:
    job = job_args(args)  # before torch is imported: bad flags fail fast
    from fsobs.workload.launch import LaunchConfig, launch  # torch only for this command

    rdzv = tuple(a for a in args.rdzv if a != "--")
    config = LaunchConfig(
        world_size=args.world_size,
        out=Path(args.out),
        threads_per_rank=args.threads_per_rank,
        rdzv=rdzv,
        job_args=tuple(job),
    )
    code = launch(config, progress=sys.stderr.isatty())
    if code != 0:
        print(
            f"fsobs: error: {args.out}: the job failed (torchrun exit code {code}); "
            "the run is marked incomplete and what was written can be analyzed",
            file=sys.stderr,
        )
        return 1
    print(f"wrote {args.out}; analyze it with: fsobs analyze {args.out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.handler(args))
    except FsobsError as exc:
        print(f"fsobs: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
