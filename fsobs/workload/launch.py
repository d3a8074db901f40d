"""``fsobs run``: start the reference job on N ranks with torchrun and watch it.

This module does not import torch: it builds the ``torch.distributed.run`` command line, starts it
as a child process, shows progress from the rank-0 step sidecar as it grows, and when the job
fails marks the run incomplete (with the reason) so that whatever was written stays analyzable.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fsobs.errors import FsobsError


class LaunchError(FsobsError):
    """The job could not be started or did not finish."""


@dataclass(kw_only=True, frozen=True)
class LaunchConfig:
    """How the ranks are started."""

    world_size: int
    """Processes on this node (``--nproc-per-node``)."""
    out: Path
    """The run directory the job writes (created; must not hold another run)."""
    threads_per_rank: int | None = None
    """Intra-op threads of each rank; default: the node's cores divided among its ranks."""
    rdzv: tuple[str, ...] = ()
    """Multi-node rendezvous flags passed to torchrun as they are (``--nnodes 2 ...``)."""
    job_args: tuple[str, ...] = ()
    """Arguments of ``python -m fsobs.workload.train`` after ``--out``."""
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError("world_size must be >= 1")
        if self.threads_per_rank is not None and self.threads_per_rank < 1:
            raise ValueError("threads_per_rank must be >= 1")


def torchrun_command(config: LaunchConfig) -> list[str]:
    """The command line that starts every rank of this node."""
    node = list(config.rdzv) if config.rdzv else ["--standalone"]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *node,
        f"--nproc-per-node={config.world_size}",
        "-m",
        "fsobs.workload.train",
        "--out",
        str(config.out),
        *config.job_args,
    ]


def _threads(config: LaunchConfig) -> int:
    if config.threads_per_rank is not None:
        return config.threads_per_rank
    return max(1, (os.cpu_count() or 1) // config.world_size)


def launch(config: LaunchConfig, *, progress: bool = True) -> int:
    """Run the job to its end; return torchrun's exit code (0 when every rank finished).

    On failure the run directory is marked incomplete, with the exit code as the reason.
    """
    out = config.out
    if out.exists() and any(out.glob("*.trace.json*")):
        raise LaunchError("already holds a run; choose another --out", path=out)
    out.mkdir(parents=True, exist_ok=True)
    threads = str(_threads(config))
    env = os.environ | {"OMP_NUM_THREADS": threads, "FSOBS_THREADS_PER_RANK": threads}
    env |= config.env
    child = subprocess.Popen(torchrun_command(config), env=env)
    watch = _Progress(out) if progress else None
    while child.poll() is None:
        if watch is not None:
            watch.show()
        time.sleep(0.5)
    if watch is not None:
        watch.done()
    if child.returncode != 0:
        from fsobs.collect.runmeta import finalize_incomplete

        finalize_incomplete(out, reason=f"torchrun exited with code {child.returncode}")
    return child.returncode


class _Progress:
    """One status line from the lines of rank 0's sidecar (one per finished step)."""

    def __init__(self, out: Path) -> None:
        self._out = out
        self._start = time.monotonic()
        self._shown = -1

    def _steps(self) -> int:
        for name in ("steps.rank0.jsonl.partial", "steps.rank0.jsonl"):
            path = self._out / name
            if path.exists():
                return path.read_bytes().count(b"\n")
        return 0

    def show(self) -> None:
        steps = self._steps()
        if steps != self._shown:
            elapsed = time.monotonic() - self._start
            print(f"\rfsobs run: {steps} step(s) done, {elapsed:.0f} s", end="", file=sys.stderr)
            self._shown = steps

    def done(self) -> None:
        self.show()
        print(file=sys.stderr)
