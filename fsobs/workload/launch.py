"""``fsobs run``: start the reference job on N ranks with torchrun and watch it.

This module does not import torch: it writes the job's config into the run directory, builds the
``torch.distributed.run`` command line, starts it as a child process, shows one progress bar from
the rank-0 step sidecar as it grows, and when the job fails marks the run incomplete (with the
reason) so that whatever was written stays analyzable.

The run directory must be new or empty: a folder holding anything (another run's ``run.json``,
``job.json``, sidecars, traces, logs, partial or temporary files) is refused before anything is
written, and the ``logs`` folder is created exclusively, so two launchers racing for one folder
cannot both start. SIGINT (Ctrl+C) and SIGTERM to the launcher stop the job: torchrun runs in a
session of its own (a terminal's Ctrl+C reaches only the launcher), gets SIGTERM and stops every
rank (SIGKILL after its own grace period; the launcher kills torchrun and its ranks if it still
runs :data:`STOP_GRACE_S` later), and the run is marked incomplete with the signal as the reason.

Files besides the run format, so that the console shows only our lines::

    <out>/job.json             the JobConfig every rank trains (fsobs.workload.config)
    <out>/logs/rank<R>.log     everything rank R printed (Python and C++, stdout and stderr)
    <out>/logs/torchrun.log    torchrun's own output (its failure summary names the failed rank)

Each rank runs this module as its entry point (``python -m fsobs.workload.launch --log-dir DIR
-- MODULE ARGS``): it points its file descriptors 1 and 2 at its log, then runs ``MODULE``
(``fsobs.workload.train <out>``, which reads ``<out>/job.json``).
``verbose`` streams every log to the console as it grows, each line prefixed with its source.

Rendezvous on one node (torch 2.13 ``--standalone``): torchrun hosts its c10d store on a port
the OS picks (``localhost:0``) and hands the workers that port, so nothing binds a fixed port and
two runs started back to back cannot collide. The workers reach the store at ``127.0.0.1``
(:data:`STANDALONE`), not at this host's fully qualified name, which needs name resolution.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import runpy
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from fsobs.errors import LaunchError
from fsobs.runformat.names import PARTIAL_SUFFIX, sidecar_file_name
from fsobs.workload.config import JobConfig, write_job_json

LOG_DIR = "logs"
AGENT_LOG = "torchrun.log"
TAIL_LINES = 20
"""Lines of the failed rank's log that a failure report shows."""
POLL_S = 0.25
STANDALONE = ("--standalone", "--local-addr=127.0.0.1")
"""torchrun flags of a run on this node alone (no ``rdzv`` flags given)."""
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""Signals to the launcher that stop the job."""
STOP_GRACE_S = 60.0
"""How long a stopped torchrun gets to stop its ranks (its own grace period is 30 s) before the
launcher kills it and them."""


@dataclass(kw_only=True, frozen=True)
class LaunchConfig:
    """How the ranks are started, and what they train."""

    world_size: int
    """Processes on this node (``--nproc-per-node``)."""
    out: Path
    """The run directory the job writes (created; must not hold another run)."""
    threads_per_rank: int | None = None
    """Intra-op threads of each rank; default: the node's cores divided among its ranks."""
    rdzv: tuple[str, ...] = ()
    """Multi-node rendezvous flags passed to torchrun as they are (``--nnodes 2 ...``)."""
    job: JobConfig = field(default_factory=JobConfig)
    """What every rank trains: written to ``<out>/job.json``, which the ranks read."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables set for torchrun and the ranks, besides the threads."""

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError("world_size must be >= 1")
        if self.threads_per_rank is not None and self.threads_per_rank < 1:
            raise ValueError("threads_per_rank must be >= 1")


def log_dir(out: Path) -> Path:
    """Where the ranks' and torchrun's logs of the run in ``out`` are."""
    return Path(out) / LOG_DIR


def rank_log(out: Path, rank: int) -> Path:
    """The log of ``rank``: ``<out>/logs/rank<R>.log``."""
    return log_dir(out) / f"rank{rank}.log"


def torchrun_command(config: LaunchConfig) -> list[str]:
    """The command line that starts every rank of this node (each rank's output to its log)."""
    node = list(config.rdzv or STANDALONE)
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *node,
        f"--nproc-per-node={config.world_size}",
        "-m",
        "fsobs.workload.launch",
        "--log-dir",
        str(log_dir(config.out)),
        "--",
        "fsobs.workload.train",
        str(config.out),
    ]


def _threads(config: LaunchConfig) -> int:
    if config.threads_per_rank is not None:
        return config.threads_per_rank
    return max(1, (os.cpu_count() or 1) // config.world_size)


def launch(
    config: LaunchConfig,
    *,
    progress: bool = True,
    verbose: bool = False,
    console: Console | None = None,
) -> int:
    """Write ``<out>/job.json`` and run the job to its end; return torchrun's exit code (0 when
    every rank finished; ``128 + N`` when signal N killed it), or ``-N`` when signal N to the
    launcher stopped the job.

    ``progress``: one progress bar on ``console`` (default: stderr; on a file or pipe only its
    final state is printed); ``verbose``: stream the logs to the console instead. On failure the
    run directory is marked incomplete, with the reason (:func:`failure_report` says which rank
    failed and how). A folder that is not new or empty is refused (:class:`LaunchError`) before
    anything is written; so is a failure to mark the run incomplete (a full disk).
    """
    out = config.out
    threads = str(_threads(config))
    env = os.environ | {
        "OMP_NUM_THREADS": threads,
        "FSOBS_THREADS_PER_RANK": threads,
        "PYTHONUNBUFFERED": "1",  # a rank's last lines reach its log even if it is killed
    }
    env |= config.env
    console = console or Console(stderr=True)
    with _stop_signals() as stop:
        logs = _claim(out)
        write_job_json(out, config.job)
        watch = _Follow(logs, console) if verbose else None
        bar = _Progress(out, config.job.steps, console) if progress and not verbose else None
        parts = [p for p in (bar, watch) if p is not None]
        with open(logs / AGENT_LOG, "wb") as agent_log:
            child = subprocess.Popen(
                torchrun_command(config),
                env=env,
                stdout=agent_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a terminal's Ctrl+C reaches the launcher only
            )
        try:
            while child.poll() is None and not stop:
                for part in parts:
                    part.update()
                time.sleep(POLL_S)
        finally:  # stopped by a signal, or an error here: the job must not outlive the launcher
            stopped = child.poll() is None
            if stopped:
                _stop_job(child)
            code = -stop[0] if stop and stopped else _exit_code(child.returncode)
            for part in parts:
                part.close(code)
            if code != 0:
                _mark_failed(out, code)
    return code


def _exit_code(returncode: int) -> int:
    """torchrun's exit code; ``128 + N`` when signal N killed it (a shell's convention)."""
    return 128 - returncode if returncode < 0 else returncode


def check_out(out: Path) -> None:
    """Refuse (:class:`LaunchError`) an ``out`` that is not a new or empty folder."""
    if out.exists() and not out.is_dir():
        raise LaunchError("is not a folder; choose another --out", path=out)
    held = sorted(p.name for p in out.iterdir()) if out.exists() else []
    if held:
        shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
        raise LaunchError(
            f"already holds {shown}; a run is written into a new or empty folder only", path=out
        )


def _claim(out: Path) -> Path:
    """Make ``out`` the run directory of this launch, before anything is written: refuse a
    folder that holds anything, create its ``logs`` folder exclusively; returns that."""
    check_out(out)
    out.mkdir(parents=True, exist_ok=True)
    logs = log_dir(out)
    try:
        logs.mkdir()
    except FileExistsError:
        raise LaunchError(
            "another launch took this folder; choose another --out", path=out
        ) from None
    return logs


@contextlib.contextmanager
def _stop_signals() -> Iterator[list[int]]:
    """While open, SIGINT and SIGTERM (main thread only) append their number to the list given
    instead of interrupting the launcher; the previous handlers are restored on leaving."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def note(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig, handler in previous.items():
        if handler is not signal.SIG_IGN:  # nohup and background jobs keep ignoring it
            signal.signal(sig, note)
    try:
        yield caught
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: not set from Python, left as it is
                signal.signal(sig, handler)


def _stop_job(child: subprocess.Popen[bytes]) -> None:
    """Stop torchrun and its ranks: SIGTERM to torchrun (which stops its ranks), then, if it
    still runs after :data:`STOP_GRACE_S`, SIGKILL to its ranks and to it."""
    child.terminate()
    try:
        child.wait(STOP_GRACE_S)
        return
    except subprocess.TimeoutExpired:
        pass
    for pid in [*_children(child.pid), child.pid]:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)  # each rank leads a session of its own
    child.wait()


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux ``/proc``; none found elsewhere)."""
    found: list[int] = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError, ValueError):
            found += [int(c) for c in children.read_text().split()]
    return found


def _mark_failed(out: Path, code: int) -> None:
    """Close off the run of a job that did not finish (:func:`finalize_incomplete`): the reason
    is the signal that stopped it, else torchrun's exit code and how the first rank failed."""
    from fsobs.runformat import finalize_incomplete

    if code < 0:
        reason = f"stopped by {signal.Signals(-code).name} to fsobs run"
    else:
        reason = f"torchrun exited with code {code}"
        who = failed_rank(out)
        if who is not None:
            rank, rank_code = who
            error = _errors(out).get(rank)
            reason += f"; rank {rank} failed first"
            if error is not None:
                reason += f": {error[1]}"
            elif rank_code is not None:
                reason += f" (exit code {rank_code})"
    try:
        finalize_incomplete(out, reason=reason)
    except OSError as exc:
        raise LaunchError(
            f"the job did not finish ({reason}) and the run could not be marked incomplete: "
            f"{exc.strerror or exc}",
            path=out,
        ) from None


# ---- failure report ----
_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
_EXIT_CODE = re.compile(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")


def failed_rank(out: Path) -> tuple[int, int | None] | None:
    """(rank, exit code if known) of the rank that failed first, or None if none did.

    torchrun's failure summary names the first exit it saw (its "root cause"); a rank that
    died without a Python exception (killed, ``os._exit``) is found that way. But a rank whose
    peer raised often fails too, on a broken connection, and may exit first: when the root
    cause noted an exception (``rank<R>.error.json``), the rank whose exception came first is
    the cause. Without a summary: that rank, else the first log with a traceback.
    """
    text = _read(log_dir(out) / AGENT_LOG)
    codes = {int(r): int(c) for r, c in _EXIT_CODE.findall(text)}
    errors = _errors(out)
    root = _ROOT_CAUSE.search(text)
    if root is not None and int(root.group(1)) not in errors:
        return int(root.group(1)), int(root.group(2))
    if errors:
        rank = min(errors, key=lambda r: (errors[r][0], r))
        return rank, codes.get(rank)
    for path in sorted(log_dir(out).glob("rank*.log"), key=_rank_of):
        if "Traceback (most recent call last)" in _read(path):
            return _rank_of(path), None
    return None


def _errors(out: Path) -> dict[int, tuple[int, str]]:
    """rank -> (time in ns, error) of every ``rank<R>.error.json`` that can be read."""
    found: dict[int, tuple[int, str]] = {}
    for path in log_dir(out).glob("rank*.error.json"):
        try:
            record = json.loads(_read(path))
            found[int(record["rank"])] = (int(record["time_ns"]), str(record["error"]))
        except (ValueError, KeyError, TypeError):
            continue
    return found


def failure_report(out: Path, lines: int = TAIL_LINES) -> str:
    """Which rank failed and the last ``lines`` lines of its log, with the log's path (else of
    torchrun's log)."""
    who = failed_rank(out)
    if who is None:
        path, head = log_dir(out) / AGENT_LOG, "no rank reported a failure"
    else:
        rank, code = who
        path = rank_log(out, rank)
        head = f"rank {rank} failed first" + (f" (exit code {code})" if code is not None else "")
        others = sorted(
            {int(r) for r, _ in _EXIT_CODE.findall(_read(log_dir(out) / AGENT_LOG))} - {rank}
        )
        if others:
            head += f", then torchrun stopped rank(s) {', '.join(map(str, others))}"
    tail = _read(path).splitlines()[-lines:]
    body = "\n".join(f"  {line}" for line in tail) or "  (empty)"
    return f"{head}; last lines of {path}:\n{body}"


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _rank_of(path: Path) -> int:
    return int(path.stem.removeprefix("rank"))


# ---- watching the run ----
class _Progress:
    """One progress bar over the job's steps, from the lines of rank 0's sidecar (one per
    finished step): steps done of total, the last step's time, elapsed time and ETA."""

    def __init__(self, out: Path, total: int | None, console: Console) -> None:
        self._out = out
        self._size = -1
        self._bar = Progress(  # under 80 columns
            TextColumn("fsobs run: {task.description}"),
            BarColumn(bar_width=16),
            MofNCompleteColumn(),
            TextColumn("steps · last {task.fields[last]} · ETA"),
            TimeRemainingColumn(compact=True),
            TextColumn("· {task.fields[elapsed]}"),
            console=console,
            refresh_per_second=4,
        )
        self._start = time.monotonic()
        self._task = self._bar.add_task("starting", total=total, last="-", elapsed="0 s")
        self._bar.start()

    def _sidecar(self) -> bytes | None:
        for name in (sidecar_file_name(0) + PARTIAL_SUFFIX, sidecar_file_name(0)):
            try:
                return (self._out / name).read_bytes()
            except OSError:  # not there (yet, or any more: renamed when the rank closed it)
                continue
        return None

    def update(self) -> None:
        elapsed = f"{time.monotonic() - self._start:,.0f} s"
        self._bar.update(self._task, elapsed=elapsed)
        data = self._sidecar()
        if data is None or len(data) == self._size:
            return
        self._size = len(data)
        rows = data.splitlines()[: data.count(b"\n")]  # complete lines only
        if not rows:
            return
        total = self._bar.tasks[0].total
        phase = "saving" if total is not None and len(rows) >= total else "training"
        last = _step_ms(rows[-1])
        shown = "-" if last is None else f"{last:,.0f} ms"
        self._bar.update(self._task, completed=len(rows), description=phase, last=shown)

    def close(self, code: int | None) -> None:
        self.update()
        if code is not None:
            phase = "done" if code == 0 else "stopped" if code < 0 else "failed"
            self._bar.update(self._task, description=phase)
        self._bar.stop()


def _step_ms(line: bytes) -> float | None:
    """The wall time of the step a sidecar line records (ms)."""
    try:
        record: dict[str, int] = json.loads(line)
        return (record["wall_end_ns"] - record["wall_start_ns"]) / 1e6
    except (ValueError, KeyError, TypeError):
        return None


class _Follow:
    """``--verbose``: every log of the run streamed to the console as it grows, each line
    prefixed with its source (``[rank1]``, ``[torchrun]``)."""

    def __init__(self, logs: Path, console: Console) -> None:
        self._logs = logs
        self._console = console
        self._offsets: dict[Path, int] = {}
        self._rest: dict[Path, bytes] = {}

    def update(self, final: bool = False) -> None:
        for path in sorted(self._logs.glob("*.log")):
            try:
                with open(path, "rb") as log:
                    log.seek(self._offsets.get(path, 0))
                    data = self._rest.pop(path, b"") + log.read()
                    self._offsets[path] = log.tell()
            except OSError:
                continue
            lines = data.split(b"\n")
            rest = lines.pop()  # after the last newline: a line still being written
            if final and rest:
                lines, rest = [*lines, rest], b""
            self._rest[path] = rest
            name = "torchrun" if path.name == AGENT_LOG else path.stem
            for line in lines:
                text = line.decode("utf-8", errors="replace")
                self._console.print(
                    f"[{name}] {text}", markup=False, highlight=False, soft_wrap=True
                )

    def close(self, code: int | None) -> None:
        self.update(final=True)


# ---- in each rank ----
def _rank_main(argv: Sequence[str]) -> None:
    """Entry point of one rank: ``--log-dir DIR -- MODULE ARGS``. Points file descriptors 1 and
    2 (Python's and the C++ libraries' output alike) at ``DIR/rank<RANK>.log``, then runs
    ``MODULE`` as ``__main__`` with ``ARGS``."""
    if len(argv) < 4 or argv[0] != "--log-dir" or argv[2] != "--":
        raise SystemExit("usage: python -m fsobs.workload.launch --log-dir DIR -- MODULE ARGS")
    logs, module, args = Path(argv[1]), argv[3], list(argv[4:])
    logs.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(logs / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except BaseException as exc:
        if not (isinstance(exc, SystemExit) and exc.code in (0, None)):
            _write_error(logs, rank, exc)
        raise


def _write_error(logs: Path, rank: int, exc: BaseException) -> None:
    """Note when and how this rank failed (``rank<R>.error.json``): the first rank to fail is
    the cause; the others usually fail after it, on a broken connection."""
    record = {"rank": rank, "time_ns": time.time_ns(), "error": f"{type(exc).__name__}: {exc}"}
    try:
        (logs / f"rank{rank}.error.json").write_text(json.dumps(record), encoding="utf-8")
    except OSError:
        pass


if __name__ == "__main__":
    _rank_main(sys.argv[1:])
