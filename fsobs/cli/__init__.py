"""The ``fsobs`` command: one module per group of subcommands.

Bad input (unreadable or malformed traces, inconsistent runs) prints one line naming the file,
rank and field to stderr and exits with code 2; argparse usage errors exit with 2 as well.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import Any

# the access settings `fsobs dashboard` hands the app (dashboard/auth.py): a light module
from fsobs.cli.access import (
    ALLOW_ENV,
    AUTH_ENV,
    READ_ONLY_ENV,
    TOKEN_ENV,
    is_allowed,
    parse_allow,
)
from fsobs.cli.commands import COMMANDS
from fsobs.errors import FsobsError

__all__ = [
    "ALLOW_ENV",
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


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``fsobs`` parser; with ``command``, only that subcommand's parser is built in full
    (the others are listed with their help line, their modules not imported)."""
    parser = argparse.ArgumentParser(
        prog="fsobs",
        description="Find and explain computational bubbles in PyTorch traces.",
        epilog="example: fsobs analyze traces/reference/synthetic_gloo_a2a_straggler_4rank",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, spec in COMMANDS.items():
        if command is None or name == command:
            module = importlib.import_module(f"fsobs.cli.{spec.module}")
            getattr(module, spec.add)(commands)
        else:
            commands.add_parser(name, help=spec.help)
    return parser


def _command(argv: Sequence[str]) -> str:
    """The subcommand that ``argv`` names ("" for none: the top-level options take no values,
    so it is the first word that is not an option)."""
    return next((a for a in argv if not a.startswith("-")), "")


def package_version() -> str:
    """The installed version of the ``freescale`` distribution (``unknown`` if not installed)."""
    from importlib.metadata import PackageNotFoundError, version  # 20-60 ms: only when asked

    try:
        return version("freescale")
    except PackageNotFoundError:
        return "unknown"


class _Version(argparse._VersionAction):
    """``--version``, the version looked up only when the option is given."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        self.version = f"%(prog)s {package_version()}"
        super().__call__(parser, namespace, values, option_string)


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    args = build_parser(_command(words)).parse_args(words)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.handler(args))
    except FsobsError as exc:
        print(f"fsobs: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
