"""The ``fsobs`` command.

Bad input (unreadable or malformed traces, inconsistent runs) prints one line naming the file,
rank and field to stderr and exits with code 2; argparse usage errors exit with 2 as well.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from fsobs.analysis import analyze_path
from fsobs.errors import FsobsError
from fsobs.export import export_run
from fsobs.report import render, to_json
from fsobs.trace import LoadConfig

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fsobs", description="Find and explain computational bubbles in PyTorch traces."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    analyze_cmd = commands.add_parser(
        "analyze", help="analyze a run directory or Kineto trace files"
    )
    analyze_cmd.add_argument(
        "paths", nargs="+", metavar="PATH", help="a run directory, or one or more trace files"
    )
    analyze_cmd.add_argument("--json", action="store_true", help="print one JSON object")
    _add_load_options(analyze_cmd)
    analyze_cmd.set_defaults(handler=_analyze)

    export_cmd = commands.add_parser(
        "export",
        help="write the run's traces with bubble tracks added (for Perfetto / chrome://tracing)",
    )
    export_cmd.add_argument("run", metavar="RUN", help="a run directory, or a trace file")
    export_cmd.add_argument("out", metavar="OUT", help="output directory (created if needed)")
    export_cmd.add_argument(
        "--overwrite", action="store_true", help="replace files a previous export left in OUT"
    )
    _add_load_options(export_cmd)
    export_cmd.set_defaults(handler=_export)

    run_cmd = commands.add_parser(
        "run",
        help="train the reference job on N ranks with torchrun, writing a run directory",
        description="Extra torchrun flags for multi-node runs go after '--' "
        "(e.g. -- --nnodes 2 --node-rank 0 --rdzv-endpoint host:29500).",
    )
    run_cmd.add_argument("--world-size", type=int, required=True, help="ranks on this node")
    run_cmd.add_argument("--steps", type=int, default=20)
    run_cmd.add_argument("--out", required=True, help="run directory to write")
    run_cmd.add_argument("--preset", default="lognormal", help="sequence-length distribution")
    run_cmd.add_argument("--model-size", default="small", choices=["tiny", "small", "medium"])
    run_cmd.add_argument("--batch-size", type=int, default=32, help="samples per rank and step")
    run_cmd.add_argument("--seed", type=int, default=0)
    run_cmd.add_argument("--threads-per-rank", type=int, default=None)
    run_cmd.add_argument("--no-profile", action="store_true", help="train without the profiler")
    run_cmd.add_argument("rdzv", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    run_cmd.set_defaults(handler=_run)
    return parser


def _add_load_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-trace-gb",
        type=_positive_gb,
        default=LoadConfig().max_trace_bytes / 2**30,
        help="refuse trace files that decompress to more than this (default: %(default)g)",
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
    config = LoadConfig(max_trace_bytes=int(args.max_trace_gb * 2**30))
    source = args.paths[0] if len(args.paths) == 1 else args.paths
    result = analyze_path(source, config)
    if args.json:
        print(json.dumps(to_json(result), indent=2, allow_nan=False))
    else:
        render(result, Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160))
    return 0


def _export(args: argparse.Namespace) -> int:
    config = LoadConfig(max_trace_bytes=int(args.max_trace_gb * 2**30))
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


def _run(args: argparse.Namespace) -> int:
    from fsobs.workload.launch import LaunchConfig, launch  # torch only for this command

    job_args = [
        f"--steps={args.steps}",
        f"--preset={args.preset}",
        f"--model-size={args.model_size}",
        f"--batch-size={args.batch_size}",
        f"--seed={args.seed}",
    ] + (["--no-profile"] if args.no_profile else [])
    rdzv = tuple(a for a in args.rdzv if a != "--")
    config = LaunchConfig(
        world_size=args.world_size,
        out=Path(args.out),
        threads_per_rank=args.threads_per_rank,
        rdzv=rdzv,
        job_args=tuple(job_args),
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
