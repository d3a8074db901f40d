"""Run one function on N gloo ranks, one process each (after torchrec's
``distributed/test_utils/multi_process.py``)::

    def _check(rank: int, world_size: int, out: Path) -> None:
        ...  # the default process group is up: gloo, world_size ranks

    def test_x(tmp_path):
        run_ranks(_check, 2, tmp_path)

Every rank is a fresh ``spawn`` process (so ``fn`` and its arguments must pickle: a module-level
function); it runs with one intra-op thread, joins the group at a free port of 127.0.0.1, runs
``fn(rank, world_size, *args)`` and destroys the group, also when ``fn`` raises. The test fails
unless every rank exits with code 0 (a rank that raised exits with 1; its traceback is in the
captured stderr). Ranks hand results back through files.
"""

from __future__ import annotations

import gc
import multiprocessing
import socket
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

import torch
import torch.distributed as dist

TIMEOUT_S = 300.0
"""How long the ranks may take together before they are killed and the test fails."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_main(
    rank: int, world_size: int, port: int, fn: Callable[..., None], args: tuple[Any, ...]
) -> None:
    torch.set_num_threads(1)
    init = f"tcp://127.0.0.1:{port}"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
    finally:
        # A DDP model lives in reference cycles: collected at the interpreter's exit, its
        # reducer drops the process group while gloo's threads may still run, and the process
        # aborts ("terminate called without an active exception"). Collect it here, first.
        gc.collect()
        dist.destroy_process_group()


def run_ranks(fn: Callable[..., None], world_size: int, *args: Any) -> None:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; assert they all exit 0.

    When a rank fails, the others (likely waiting for it in a collective) are killed."""
    port = free_port()
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_rank_main, args=(rank, world_size, port, fn, args))
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + TIMEOUT_S
    running = list(procs)
    while running and time.monotonic() < deadline:
        wait([proc.sentinel for proc in running], timeout=deadline - time.monotonic())
        running = [proc for proc in running if proc.exitcode is None]
        if any(proc.exitcode for proc in procs):
            break
    for proc in running:
        proc.kill()
        proc.join()
    codes = [proc.exitcode for proc in procs]
    assert codes == [0] * world_size, f"exit code of each rank: {codes}"
