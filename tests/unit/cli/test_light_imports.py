"""What the ``fsobs`` command imports: argument parsing no pandas, torch, streamlit, dask or
plotly (``fsobs --help`` is instant), ``fsobs analyze`` of a trace pandas but none of the others.

Each case runs in a fresh interpreter (this process has imported everything already) and
reports the top-level packages it loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fsobs.cli import build_parser
from fsobs.cli.commands import COMMANDS

ROOT = Path(__file__).resolve().parents[3]
TRACE = ROOT / "traces" / "reference" / "synthetic_gloo_a2a_straggler_4rank" / "rank0.json.gz"
HEAVY = {"pandas", "torch", "streamlit", "dask", "plotly"}
_REPORT = (
    "import json, sys\n"
    "from fsobs.cli import main\n"
    "try:\n"
    "    main(sys.argv[1:])\n"
    "except SystemExit:\n"
    "    pass\n"
    "print(json.dumps(sorted({m.partition('.')[0] for m in sys.modules})), file=sys.stderr)\n"
)


def _loaded(*argv: str) -> set[str]:
    """The top-level packages imported by ``fsobs ARGV`` run in a fresh interpreter."""
    run = subprocess.run(
        [sys.executable, "-c", _REPORT, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return set(json.loads(run.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--version"],
        ["analyze", "--help"],
        ["export", "--help"],
        ["compare", "--help"],
        ["fit-cost", "--help"],
        ["dashboard", "--help"],
        ["analyze"],  # a usage error: parsed, then refused
        ["nope"],
    ],
)
def test_parsing_the_arguments_imports_nothing_heavy(argv: list[str]) -> None:
    loaded = _loaded(*argv)
    assert "fsobs" in loaded
    assert loaded & HEAVY == set()


def test_analyze_of_a_trace_imports_pandas_but_no_torch_streamlit_dask_or_plotly() -> None:
    loaded = _loaded("analyze", "--json", str(TRACE))
    assert "pandas" in loaded  # the analysis ran
    assert loaded & HEAVY == {"pandas"}


def test_the_help_lists_every_command_whichever_is_built() -> None:
    full = build_parser().format_help()
    assert build_parser("analyze").format_help() == full
    assert build_parser("").format_help() == full
    for name, command in COMMANDS.items():
        assert name in full
        assert " ".join(command.help.split()[:4]) in " ".join(full.split())
