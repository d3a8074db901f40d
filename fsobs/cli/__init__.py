"""The ``fsobs`` command: one module per group of subcommands.

Bad input (unreadable or malformed traces, inconsistent runs) prints one line naming the file,
rank and field to stderr and exits with code 2; argparse usage errors exit with 2 as well.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from fsobs.cli import analysis, dashboard, live, run, whatif
from fsobs.cli.access import (
    ALLOW_ENV,
    AUTH_ENV,
    READ_ONLY_ENV,
    TOKEN_ENV,
    is_allowed,
    parse_allow,
)
from fsobs.errors import FsobsError

__all__ = [
    "ALLOW_ENV",  # the access settings `fsobs dashboard` hands the app (dashboard/auth.py)
    "AUTH_ENV",
    "EXIT_BAD_INPUT",
    "READ_ONLY_ENV",
    "TOKEN_ENV",
    "build_parser",
    "is_allowed",
    "main",
    "package_version",
    "parse_allow",
]

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fsobs",
        description="Find and explain computational bubbles in PyTorch traces.",
        epilog="example: fsobs analyze traces/reference/synthetic_gloo_a2a_straggler_4rank",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    analysis.add_analyze(commands)
    analysis.add_export(commands)
    analysis.add_compare(commands)
    analysis.add_fit_cost(commands)
    dashboard.add_dashboard(commands)
    run.add_run(commands)
    whatif.add_whatif(commands)
    whatif.add_simulate(commands)
    live.add_watch(commands)
    live.add_capture(commands)
    return parser


def package_version() -> str:
    """The installed version of the ``freescale`` distribution (``unknown`` if not installed)."""
    try:
        return version("freescale")
    except PackageNotFoundError:
        return "unknown"


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
