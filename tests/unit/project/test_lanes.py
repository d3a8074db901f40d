"""The two test lanes: every test file sits in ``tests/unit/<package>/`` or
``tests/integration/<package>/``, and the unit lane's conftest refuses what belongs in the other
lane (run here on small test files written for it, in a fresh pytest process)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[2]
PACKAGES = {
    "analysis", "cli", "collect", "dashboard", "live", "optim", "project", "report",
    "runformat", "simulate", "trace", "workload",
}  # fmt: skip


def test_every_test_file_is_in_a_lane_and_a_package() -> None:
    misplaced = [
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("test_*.py")
        if path.relative_to(TESTS).parts[0] in ("unit", "integration")
        and (len(path.relative_to(TESTS).parts) != 3 or path.parent.name not in PACKAGES)
        or path.relative_to(TESTS).parts[0] not in ("unit", "integration")
    ]
    assert misplaced == []
    assert {p.parent.name for p in (TESTS / "unit").rglob("test_*.py")} <= PACKAGES


def _lane(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    """A unit lane holding one test file, run by pytest in a fresh process."""
    unit = tmp_path / "unit"
    unit.mkdir()
    shutil.copy(TESTS / "unit" / "conftest.py", unit / "conftest.py")
    (unit / "test_it.py").write_text(body)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(unit)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_test_marked_browser_is_refused_at_collection(tmp_path: Path) -> None:
    run = _lane(
        tmp_path,
        "import pytest\n\n@pytest.mark.browser\ndef test_page():\n    pass\n",
    )
    assert run.returncode == pytest.ExitCode.USAGE_ERROR
    assert "belongs in tests/integration: unit/test_it.py::test_page (marked browser)" in run.stderr


def test_a_test_that_launches_torchrun_fails(tmp_path: Path) -> None:
    body = (
        "import subprocess\n\n"
        "def test_job():\n"
        "    try:\n"
        "        subprocess.run(['torchrun-not-installed', '--nproc-per-node', '2'])\n"
        "    except FileNotFoundError:\n"
        "        pass\n\n"
        "def test_plain():\n"
        "    subprocess.run([" + repr(sys.executable) + ", '-c', 'pass'], check=True)\n"
    )
    run = _lane(tmp_path, body)
    assert run.returncode == pytest.ExitCode.TESTS_FAILED
    assert "2 passed, 1 error" in run.stdout  # the fixture's check fails at teardown
    assert "a unit test launched 'torchrun-not-installed --nproc-per-node 2'" in run.stdout
