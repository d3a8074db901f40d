"""The tree stays clean: ruff's lint and format checks and mypy's strict type check pass (same
as `make lint`)."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _tool(name: str) -> str | None:
    return shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)


@pytest.mark.parametrize(
    "args", [["check", "."], ["format", "--check", "."]], ids=["lint", "format"]
)
def test_ruff(args):
    ruff = _tool("ruff")
    if ruff is None:
        pytest.skip("ruff not installed")
    proc = subprocess.run([ruff, *args], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_mypy():
    """``mypy`` with pyproject's ``[tool.mypy]``: strict, on fsobs and optim."""
    mypy = _tool("mypy")
    if mypy is None:
        pytest.skip("mypy not installed")
    try:
        importlib.metadata.version("pandas-stubs")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("pandas-stubs not installed (make install)")
    proc = subprocess.run([mypy], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
