"""``fsobs`` on input meant to hang it, exhaust its memory or end it in a traceback.

Each case runs the real CLI in a subprocess (under a generous timeout: a hang fails the test
instead of the suite) and must end with exit code 2 and one line on stderr naming the file.
The memory cases measure the peak RSS of the CLI's process tree with
``resource.getrusage(RUSAGE_CHILDREN)`` in a fresh wrapper process, against a bound far above a
normal run's and far below what the input would cost if it were held (the issue measured
16.5 GiB for ``/dev/zero`` and 5.25 GiB for a gzip bomb).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fsobs.trace import LoadConfig, _decode

ROOT = Path(__file__).resolve().parents[3]
RUN = ROOT / "traces" / "ab_balance_2rank" / "control"
MiB, GiB = 2**20, 2**30
HELD = _decode.DEFAULT_MAX_HELD_BYTES
TIMEOUT_S = 120  # generous: each case takes seconds; a hang is what this catches
NOBODY = 65534

_PEAK = f"""
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, timeout={TIMEOUT_S})
sys.stderr.buffer.write(done.stderr)
print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
"""


def fsobs(*args: str | Path, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "fsobs.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=ROOT,
    )


def peak(*args: str | Path) -> tuple[int, str, int]:
    """(exit code, stderr, peak RSS in bytes) of ``fsobs ARGS``."""
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, sys.executable, "-m", "fsobs.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S + 30,
        cwd=ROOT,
    )
    code, rss = done.stdout.split()
    return int(code), done.stderr, int(rss)


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fsobs: error: "), stderr
    assert "Traceback" not in stderr
    return lines[0].removeprefix("fsobs: error: ")


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A copy of a small real CPU run (2 ranks, run.json, step sidecars)."""
    return Path(shutil.copytree(RUN, tmp_path / "run"))


def test_the_defaults_are_the_documented_ones():
    config = LoadConfig()
    assert (config.max_trace_bytes, config.max_held_bytes) == (4 * GiB, 512 * MiB)


def test_dev_zero_is_refused_at_once():
    done = fsobs("analyze", "/dev/zero")
    assert done.returncode == 2
    assert one_error_line(done.stderr) == (
        "/dev/zero: cannot read file: not a regular file (a character device)"
    )


@pytest.mark.parametrize("name", ["run.json", "steps.rank0.jsonl", "rank0.trace.json.gz"])
def test_a_fifo_in_a_run_does_not_hang_it(run: Path, name: str):
    (run / name).unlink()
    os.mkfifo(run / name)
    done = fsobs("analyze", run)
    assert done.returncode == 2
    line = one_error_line(done.stderr)
    assert line.startswith(str(run / name)) and "not a regular file (a FIFO)" in line


def _gzip_bomb(path: Path, text_bytes: int) -> Path:
    """A valid trace whose one event holds a string of ``text_bytes`` bytes, gzipped as it is
    written (a MiB at a time: never in memory)."""
    chunk = b"a" * MiB
    with gzip.open(path, "wb", compresslevel=9) as out:
        out.write(b'{"traceEvents": [{"ph": "X", "name": "')
        for _ in range(text_bytes // MiB):
            out.write(chunk)
        out.write(b'", "ts": 0, "dur": 1, "pid": 0, "tid": 0}]}')
    return path


def test_a_gzip_bomb_is_refused_in_bounded_memory(tmp_path: Path):
    bomb = _gzip_bomb(tmp_path / "rank0.json.gz", GiB)
    assert bomb.stat().st_size < 2 * MiB  # 1 GiB of text in about 1 MB
    code, stderr, rss = peak("analyze", bomb)
    assert code == 2
    assert one_error_line(stderr) == (
        f"{bomb}: one event is over the 512.0 MiB limit of text held whole: the streaming "
        "reader cannot cut it into events (raise it with LoadConfig.max_held_bytes)"
    )
    assert rss < GiB  # the held limit and the interpreter, not the 1 GiB of text


def test_a_huge_file_without_a_cut_is_refused_in_bounded_memory(tmp_path: Path):
    """2 GiB of one line (a sparse file: no disk), no trace in it: the streaming reader finds no
    traceEvents in its first 64 MiB, and the whole-file reader refuses the file by its size."""
    huge = tmp_path / "rank0.json"
    with huge.open("wb") as out:
        out.write(b'{"junk": "')
        out.truncate(2 * GiB)
    code, stderr, rss = peak("analyze", huge)
    assert code == 2
    assert one_error_line(stderr) == (
        f"{huge}: file is 2.0 GiB, over the 512.0 MiB limit of text held whole: the streaming "
        "reader "
        "cannot cut it into events (raise it with LoadConfig.max_held_bytes)"
    )
    assert rss < GiB
    assert HELD == 512 * MiB


def test_a_deeply_nested_cost_model_is_one_line(run: Path, tmp_path: Path):
    deep = tmp_path / "cost_model.json"
    deep.write_text("[" * 10**5 + "]" * 10**5)
    done = fsobs("whatif", run, "--cost-model", deep)
    assert done.returncode == 2
    assert one_error_line(done.stderr) == (
        f"bad cost model: {deep}: not a cost model (nested too deep to read)"
    )


def test_a_deeply_nested_run_json_is_one_line(run: Path):
    (run / "run.json").write_text('{"a": ' + "[" * 10**5 + "]" * 10**5 + "}")
    done = fsobs("analyze", run)
    assert done.returncode == 2
    assert "nested deeper than Python's recursion limit" in one_error_line(done.stderr)


def _as_nobody() -> tuple[str, ...]:
    """chmod 000 denies nothing to root: as root the CLI runs as ``nobody`` (setpriv)."""
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: chmod 000 denies root nothing")
    return ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")


@pytest.mark.parametrize(
    ("locked", "error"),
    [
        ("run", "{run}: cannot list this folder: Permission denied"),
        ("parent", "{run}: cannot read: Permission denied"),
    ],
)
def test_an_unreadable_run_folder_is_one_line(locked: str, error: str):
    prefix = _as_nobody()
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch)
        base.chmod(0o755)  # nobody may go in (pytest's tmp_path is root's alone)
        run = Path(shutil.copytree(RUN, base / "run"))
        (run if locked == "run" else base).chmod(0)
        try:
            done = fsobs("analyze", run, prefix=prefix)
        finally:
            base.chmod(stat.S_IRWXU)
            run.chmod(stat.S_IRWXU)
    assert done.returncode == 2, done.stderr
    assert one_error_line(done.stderr) == error.format(run=run)


def test_symlinked_files_of_a_run_folder_are_skipped_and_said(run: Path, tmp_path: Path):
    """A trace and a sidecar that are links to files outside the run: left out, named once
    (without run.json, which would call the run of 2 ranks complete with rank 1 missing)."""
    (run / "run.json").unlink()
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("rank1.trace.json.gz", "steps.rank1.jsonl"):
        (run / name).rename(outside / name)
        (run / name).symlink_to(outside / name)
    done = fsobs("analyze", run, "--json")
    assert done.returncode == 0, done.stderr
    warnings = json.loads(done.stdout)["run"]["warnings"]
    assert warnings[:2] == [
        "loaded 1 of 2 ranks (missing: 1)",
        "skipped symbolic links: rank1.trace.json.gz, steps.rank1.jsonl "
        "(a run's files must lie in its folder)",
    ]
