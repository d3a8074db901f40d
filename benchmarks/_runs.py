"""The benchmarks' subprocesses: a failed one says why, and what it wrote is kept.

A benchmark captures its children's output (to parse it, or to keep the report readable), so a
failure used to show only "returned non-zero exit status 1". :func:`run_checked` runs a command
and, if it fails, stops the benchmark with the command, its exit code and the last lines of its
output; for an ``fsobs run`` (``run_dir``) it also copies the run out of the benchmark's
temporary folder to ``bench_data/failed/<time>-<name>`` and shows the failed rank's log tail and
path there (:func:`fsobs.workload.launch.failure_report`).

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _runs import fsobs_run, run_checked  # noqa: E402
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from fsobs.workload.launch import failure_report

ROOT = Path(__file__).resolve().parents[1]
FAILED = ROOT / "bench_data" / "failed"
TAIL_LINES = 30


def run_checked(
    cmd: list[str], *, run_dir: Path | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd)`` (in ``env``, else this environment) with its output captured as
    text; on a non-zero exit, ``SystemExit`` with :func:`failure_message` (printed to stderr
    by Python)."""
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(failure_message(cmd, done, run_dir))
    return done


def fsobs_run(
    out: Path, flags: list[str], env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``fsobs run --out OUT FLAGS`` (this Python), checked like :func:`run_checked`."""
    cmd = [sys.executable, "-m", "fsobs.cli", "run", f"--out={out}", *flags]
    return run_checked(cmd, run_dir=out, env=env)


def failure_message(
    cmd: list[str], done: subprocess.CompletedProcess[str], run_dir: Path | None = None
) -> str:
    """The command, its exit code, the tails of its stdout and stderr, and for a run, where it
    is kept now and its failed rank's log tail."""
    lines = [f"benchmark: exit code {done.returncode} from: {shlex.join(map(str, cmd))}"]
    for name, text in (("stdout", done.stdout), ("stderr", done.stderr)):
        if text and text.strip():
            lines += [f"--- last lines of its {name}:", *text.rstrip().splitlines()[-TAIL_LINES:]]
    if run_dir is not None and run_dir.exists():
        kept = keep(run_dir)
        lines += [f"--- the run is kept in {kept}", failure_report(kept, lines=TAIL_LINES)]
    return "\n".join(lines)


def keep(run_dir: Path) -> Path:
    """Copy a failed run to ``bench_data/failed/<time>-<name>`` (a benchmark's temporary
    folder is deleted when it stops); returns the copy."""
    FAILED.mkdir(parents=True, exist_ok=True)
    kept = FAILED / f"{time.strftime('%Y%m%d-%H%M%S')}-{run_dir.name}"
    shutil.copytree(run_dir, kept, dirs_exist_ok=True)
    return kept
