"""What the ``fsobs`` subcommands share: load options, the progress bar, the console."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from fsobs.errors import FsobsError
from fsobs.trace._decode import DEFAULT_MAX_TRACE_BYTES
from fsobs.trace.cluster import SCHEDULER_ENV

if TYPE_CHECKING:
    from rich.console import Console

    from fsobs.analysis import Analysis
    from fsobs.trace import LoadConfig

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def example(line: str) -> str:
    return f"example: {line}"


def add_load_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-trace-gb",
        type=positive_gb,
        default=DEFAULT_MAX_TRACE_BYTES / 2**30,
        help="refuse trace files that decompress to more than this (default: %(default)g)",
    )
    parser.add_argument(
        "--step-marker",
        metavar="NAME",
        help="iterations are the CPU ranges whose name starts with NAME, not ProfilerStep#N "
        "(traces without either are analyzed as one window per rank)",
    )
    parser.add_argument(
        "--comm-kernel",
        metavar="REGEX",
        action="append",
        default=[],
        type=regex,
        help="GPU kernels whose name matches REGEX (case-insensitive) are communication, "
        "beside NCCL/RCCL/DeepEP/NVSHMEM/... (fsobs.trace.classify.COMM_KERNEL_PATTERNS); "
        "repeat for several",
    )
    parser.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="parse the ranks on this Dask scheduler's workers (tcp://host:8786); "
        f"default: ${SCHEDULER_ENV} if set, else this machine's processes",
    )


def load_config(args: argparse.Namespace) -> LoadConfig:
    from fsobs.trace import LoadConfig

    return LoadConfig(
        max_trace_bytes=int(args.max_trace_gb * 2**30),
        step_marker=args.step_marker or None,
        comm_kernels=tuple(args.comm_kernel),
        scheduler=args.scheduler or None,
    )


def regex(text: str) -> str:
    """``text``, checked to be a regular expression."""
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"not a regular expression: {text!r} ({exc})") from None
    return text


def positive_gb(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value * 2**30 >= 1:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"must be a positive size in GiB, got {text!r}")
    return value


def analyze_with_progress(source: str | list[str], config: LoadConfig) -> Analysis:
    """:func:`fsobs.analyze_path`, with a progress bar over the ranks parsed on stderr when it is
    a terminal (the bar is removed when done)."""
    from fsobs.analysis import analyze_path

    if not sys.stderr.isatty():
        return analyze_path(source, config)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

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


def console() -> Console:
    from rich.console import Console

    return Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)


def cost_model_path(text: str) -> Path:
    """The absolute path of a readable cost model file (FsobsError naming the file if not)."""
    from optim.balance import CostModel

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
