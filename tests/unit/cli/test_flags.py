"""Flags generated from config dataclasses (``fsobs.cli.flags``): type, choices, default and
help from the fields; only the flags given come back; a toggle's other flags need it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from fsobs.cli import build_parser
from fsobs.cli.flags import Section, add_section, help_text, section_values
from fsobs.errors import FsobsError


@dataclass(kw_only=True, frozen=True)
class _Knobs:
    enabled: bool = False
    """Switch it on."""
    count: int = 3
    """How many (see ``count``).

    A second paragraph, left out of the help."""
    share: float | None = None
    """A share of 100% (default: none)."""
    shape: Literal["round", "square"] = "round"
    """Its shape, :class:`~pkg.mod.Shape`."""
    file: Path | None = None
    """A file to read."""


_SECTION = Section(
    _Knobs,
    {
        "enabled": "--knobs",
        "count": "--knob-count",
        "share": "--share",
        "shape": "--shape",
        "file": "--file",
    },
    toggle="enabled",
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_section(parser, _SECTION, "the knobs")
    return parser


def _helps(parser: argparse.ArgumentParser) -> dict[str, str | None]:
    return {a.option_strings[-1]: a.help for a in parser._actions if a.option_strings}


def test_flags_take_type_choices_and_help_from_the_fields() -> None:
    args = _parser().parse_args(
        ["--knobs", "--knob-count", "7", "--share", "0.5", "--shape", "square", "--file", "f"]
    )
    assert section_values(args, _SECTION) == {
        "enabled": True,
        "count": 7,
        "share": 0.5,
        "shape": "square",
        "file": "f",
    }
    assert _helps(_parser()) == {
        "--help": "show this help message and exit",
        "--knobs": "Switch it on.",
        "--knob-count": "How many (see count) (default: 3)",
        "--share": "A share of 100%% (default: none).",
        "--shape": "Its shape, pkg.mod.Shape (default: round)",
        "--file": "A file to read.",
    }
    with pytest.raises(SystemExit):
        _parser().parse_args(["--shape", "oval"])


def test_only_the_flags_given_come_back_and_the_toggle_is_needed() -> None:
    assert section_values(_parser().parse_args([]), _SECTION) == {}
    assert section_values(_parser().parse_args(["--knobs"]), _SECTION) == {"enabled": True}
    with pytest.raises(FsobsError, match="--knob-count needs --knobs"):
        section_values(_parser().parse_args(["--knob-count", "1"]), _SECTION)


def test_help_text_is_the_first_paragraph_on_one_line() -> None:
    doc = "A ``kk`` plan\n(:func:`optim.plan.plan_step`), 5% off.\n\nMore."
    assert help_text(doc) == "A kk plan (optim.plan.plan_step), 5%% off."


def test_fsobs_run_balance_window_help_is_the_fields_doc() -> None:
    """BalanceConfig.window's docstring, first paragraph, and its default 1."""
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    helps = _helps(commands.choices["run"])
    assert helps["--balance-window"] == (
        "Deal the samples of K consecutive global batches into K steps (unequal counts; 1: "
        "each global batch alone) (default: 1)"
    )
    assert helps["--balance"] == "Balance each global batch's cost across ranks."
