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
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TypeAlias

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import fsobs
from fsobs.analysis import Analysis, Comparison, analyze_path, compare, compare_json, fit_cost
from fsobs.analysis.bubbles import BUBBLE_CLASSES
from fsobs.errors import FsobsError
from fsobs.export import export_run
from fsobs.report import render, to_json, toggles_line
from fsobs.trace import LoadConfig
from fsobs.trace.cluster import SCHEDULER_ENV
from fsobs.trace.loader import COST_MODEL, Source
from fsobs.trace.storage import as_location
from optim.balance import METHODS, CostModel
from optim.config import DENSE_ORDERS

EXIT_BAD_INPUT = 2
DEFAULT_PORT = 8501
BALANCE_MODES = ("plan", "shuffle")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fsobs",
        description="Find and explain computational bubbles in PyTorch traces.",
        epilog="example: fsobs analyze traces/reference/synthetic_gloo_a2a_straggler_4rank",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_analyze(commands)
    _add_export(commands)
    _add_compare(commands)
    _add_fit_cost(commands)
    _add_dashboard(commands)
    _add_run(commands)
    _add_whatif(commands)
    _add_simulate(commands)
    return parser


_Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def package_version() -> str:
    """The installed version of the ``freescale`` distribution (``unknown`` if not installed)."""
    try:
        return version("freescale")
    except PackageNotFoundError:
        return "unknown"


def _example(line: str) -> str:
    return f"example: {line}"


def _add_analyze(commands: _Commands) -> None:
    cmd = commands.add_parser(
        "analyze",
        help="analyze a run directory or Kineto trace files",
        epilog=_example("fsobs analyze out/demo/baseline --json > report.json"),
    )
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
        epilog=_example("fsobs export out/demo/baseline out/demo-export"),
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
        "compare",
        help="A/B: the bubble reduction of run TEST against run CONTROL",
        epilog=_example("fsobs compare out/demo/baseline out/demo/balanced"),
    )
    cmd.add_argument("control", metavar="CONTROL", help="the baseline run directory")
    cmd.add_argument(
        "tests", nargs="+", metavar="TEST", help="the run(s) to judge against it, one by one"
    )
    cmd.add_argument("--json", action="store_true", help="print one JSON object")
    _add_load_options(cmd)
    cmd.set_defaults(handler=_compare)


def _add_fit_cost(commands: _Commands) -> None:
    cmd = commands.add_parser(
        "fit-cost",
        help="fit the balancer's per-sample cost model c(L) = c0 + a*L + b*L^2 on a run",
        epilog=_example("fsobs fit-cost out/demo/baseline --out cost.json"),
    )
    cmd.add_argument("run", metavar="RUN", help="a run directory with step sidecars")
    cmd.add_argument("--out", help="JSON file to write (default: RUN/cost_model.json)")
    _add_load_options(cmd)
    cmd.set_defaults(handler=_fit_cost)


def _add_dashboard(commands: _Commands) -> None:
    cmd = commands.add_parser(
        "dashboard",
        help="open the Streamlit dashboard on a run store",
        epilog=_example("fsobs dashboard --store out/demo --port 8501"),
    )
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
        "(e.g. -- --nnodes 2 --node-rank 0 --rdzv-endpoint host:29500). Each rank's output "
        "goes to OUT/logs/rank<R>.log; the console shows one progress bar.",
        epilog=_example("fsobs run --world-size 2 --steps 20 --out out/demo/balanced --balance"),
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
    cmd.add_argument(
        "--priority-overlap",
        action="store_true",
        help="embedding collectives on a process group of their own (high-priority stream on "
        "NCCL), the dense all-reduce on another",
    )
    cmd.add_argument(
        "--dense-order",
        choices=DENSE_ORDERS,
        help="with --priority-overlap: after_embedding (default: each step's dense buckets "
        "wait for its backward embedding all-to-all), or concurrent",
    )
    cmd.add_argument(
        "--sm-free",
        action="store_true",
        help="embedding all-to-all on the GPU copy engines (NCCL >= 2.28, one node); elsewhere "
        "recorded as not applied, with the reason",
    )
    cmd.add_argument(
        "--sync-gc",
        action="store_true",
        help="automatic garbage collection off; every rank collects the young generation at "
        "the same steps (every 10)",
    )
    cmd.add_argument(
        "--dense-mb",
        type=float,
        default=None,
        help="add a dense block of about this many MiB to the model (a large dense all-reduce)",
    )
    cmd.add_argument(
        "--ddp-bucket-mb",
        type=int,
        default=None,
        help="DDP bucket size of the dense all-reduce (default: torchrec's 25)",
    )
    cmd.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,  # keeps `fsobs -v run ...` working
        help="stream every rank's output to the console instead of the progress bar",
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
    parser.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="parse the ranks on this Dask scheduler's workers (tcp://host:8786); "
        f"default: ${SCHEDULER_ENV} if set, else this machine's processes",
    )


def _load_config(args: argparse.Namespace) -> LoadConfig:
    return LoadConfig(
        max_trace_bytes=int(args.max_trace_gb * 2**30),
        step_marker=args.step_marker or None,
        scheduler=args.scheduler or None,
    )


def _positive_gb(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value * 2**30 >= 1:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"must be a positive size in GiB, got {text!r}")
    return value


def analyze_with_progress(source: Source, config: LoadConfig) -> Analysis:
    """:func:`fsobs.analyze_path`, with a progress bar over the ranks parsed on stderr when it is
    a terminal (the bar is removed when done)."""
    if not sys.stderr.isatty():
        return analyze_path(source, config)
    name = Path(source).name if isinstance(source, str | Path) else f"{len(source)} files"
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(bar_width=30),
        MofNCompleteColumn(),
        TextColumn("ranks"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    with bar:
        task = bar.add_task(f"fsobs: parsing {name}", total=None)

        def parsed(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return analyze_path(source, config, progress=parsed)


def _analyze(args: argparse.Namespace) -> int:
    config = _load_config(args)
    source = args.paths[0] if len(args.paths) == 1 else args.paths
    result = analyze_with_progress(source, config)
    if args.json:
        print(json.dumps(to_json(result), indent=2, allow_nan=False))
    else:
        render(result, _console())
    return 0


def _export(args: argparse.Namespace) -> int:
    config = _load_config(args)
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
    config = _load_config(args)
    control = analyze_with_progress(args.control, config)
    results = [compare(control, analyze_with_progress(p, config)) for p in args.tests]
    if args.json:
        out = [compare_json(r) for r in results]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=2, allow_nan=False))
    else:
        for result in results:
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
    for row in c.by_role.itertuples(index=False):
        if row.control > 0 or row.test > 0:
            ci = (
                ""
                if math.isnan(row.ci_lo)
                else f", CI {_percent(row.ci_lo)} – {_percent(row.ci_hi)}"
            )
            console.print(
                f"  {row.role} {row[1].replace('_', ' ')}: {row.control:.2f} -> {row.test:.2f} ms "
                f"per step (reduction {_percent(row.reduction)}{ci})"
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


def _percent(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.1%}"


def _console() -> Console:
    return Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)


def _fit_cost(args: argparse.Namespace) -> int:
    config = _load_config(args)
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
    store = as_location(args.store)  # a URL store stays a URL (read-only)
    if isinstance(store, Path):
        store = store.resolve()
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
    if args.dense_order is not None and not args.priority_overlap:
        raise FsobsError("--dense-order needs --priority-overlap")
    if args.priority_overlap:
        out += ["--priority-overlap", f"--dense-order={args.dense_order or 'after_embedding'}"]
    if args.sm_free:
        out.append("--sm-free")
    if args.sync_gc:
        out.append("--sync-gc")
    if args.dense_mb is not None:
        out.append(f"--dense-mb={args.dense_mb}")
    if args.ddp_bucket_mb is not None:
        out.append(f"--ddp-bucket-mb={args.ddp_bucket_mb}")
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
    from fsobs.workload.launch import LaunchConfig, failure_report, launch, log_dir

    rdzv = tuple(a for a in args.rdzv if a != "--")
    config = LaunchConfig(
        world_size=args.world_size,
        out=Path(args.out),
        threads_per_rank=args.threads_per_rank,
        rdzv=rdzv,
        job_args=tuple(job),
    )
    verbose = bool(getattr(args, "verbose", False))
    print(
        f"fsobs run: {args.world_size} rank(s) on this node; their output: {log_dir(config.out)}/",
        file=sys.stderr,
    )
    code = launch(config, verbose=verbose)
    if code != 0:
        print(
            f"fsobs: error: {args.out}: the job failed (torchrun exit code {code}); "
            "the run is marked incomplete and what was written can be analyzed\n"
            f"{failure_report(config.out)}",
            file=sys.stderr,
        )
        return 1
    print(f"wrote {args.out}; analyze it with: fsobs analyze {args.out}")
    return 0


TOGGLE_NAMES = ("balance", "priority_overlap", "sm_free")


def _toggle_list(text: str) -> tuple[str, ...]:
    names = tuple(t.strip().replace("-", "_") for t in text.split(",") if t.strip())
    unknown = [t for t in names if t not in TOGGLE_NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown toggle(s) {unknown}, expected some of {','.join(TOGGLE_NAMES)}"
        )
    return names


def _add_whatif(commands: _Commands) -> None:
    cmd = commands.add_parser(
        "whatif",
        help="predict each optimizer toggle, alone and combined, from one baseline run",
        description="Replays the run's segment graph (per rank and step, compute between the "
        "matched collectives) with each toggle applied; every number is a prediction with an "
        "interval over resampled steps and residual noise.",
        epilog=_example("fsobs whatif out/demo/baseline --toggles balance,sm_free --json"),
    )
    cmd.add_argument("run", metavar="RUN", help="the baseline run directory")
    cmd.add_argument(
        "--toggles",
        type=_toggle_list,
        default=TOGGLE_NAMES,
        help="comma-separated toggles; every combination of them is predicted "
        "(default: %(default)s)",
    )
    cmd.add_argument("--json", action="store_true", help="print one JSON object")
    cmd.add_argument("--draws", type=int, default=200, help="noise draws (default: %(default)s)")
    cmd.add_argument("--seed", type=int, default=0, help="of the draws (default: %(default)s)")
    cmd.add_argument(
        "--cost-model", metavar="FILE", help="the balancer's cost model (default: the run's own)"
    )
    _add_load_options(cmd)
    cmd.set_defaults(handler=_whatif)


def _whatif(args: argparse.Namespace) -> int:
    from fsobs.analysis.whatif import whatif, whatif_json

    if args.draws < 1:
        raise FsobsError(f"--draws must be >= 1, got {args.draws}")
    model = CostModel.from_json(_cost_model_path(args.cost_model)) if args.cost_model else None
    analysis = analyze_with_progress(args.run, _load_config(args))
    result = whatif(analysis, args.toggles, draws=args.draws, seed=args.seed, cost_model=model)
    if args.json:
        print(json.dumps(whatif_json(result), indent=2, allow_nan=False))
    else:
        render_whatif(whatif_json(result), _console())
    return 0


def render_whatif(w: dict, console: Console) -> None:
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
            _pct(p["bubble_reduction"]),
            f"{_pct(lo)} – {_pct(hi)}",
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
        _pct(o["bubble_reduction"]),
        f"{_pct(lo)} – {_pct(hi)}",
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
            f"{o['wait_from_noise_ms_per_step']:.2f} (data share {_pct(o['data_share'])})"
        )
    for note in w["notes"]:
        console.print(f"note: {note}")


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _add_simulate(commands: _Commands) -> None:
    cmd = commands.add_parser(
        "simulate",
        help="simulate the job on N ranks and write it in the run format (with truth.json)",
        description="Writes per-rank GPU traces, step sidecars, run.json (simulated: true) and "
        "truth.json (the true bubble classes of every rank and step) into OUT.",
        epilog=_example(
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
