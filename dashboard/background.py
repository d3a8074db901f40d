"""Analyses that run off the sessions' script threads: one job registry per server.

A big run takes tens of seconds to parse; parsed inline, the session that opened it shows only a
spinner and a second session opening the same run parses it a second time. Here a run's analysis
is a :class:`Job` on a small thread pool (:data:`WORKERS`), keyed by (store, run id, signature):
every session that asks for the same key gets the same job, reads its progress while it runs and
its result when it is done (``dashboard/pending.py`` draws that; ``dashboard/cache.py`` says what
a job computes and hands a finished job's result to the in-memory cache the pages read).

The parsing itself runs where :mod:`fsobs.trace.loader` puts it: this machine's processes, or the
Dask scheduler ``FSOBS_DASK_SCHEDULER`` names (:func:`scheduler`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum

import streamlit as st

from dashboard.store import Signature
from fsobs import Analysis
from fsobs.trace import scheduler_address

logger = logging.getLogger(__name__)

Key = tuple[str, str, Signature]
"""(store, run id, signature of the run's files): what one analysis is of."""
Result = tuple[Analysis | None, str | None]
"""The analysis, or the one-line reason there is none."""
Progress = Callable[[int, int], None]
Work = Callable[[Progress], Result]
"""What a job runs: told ``progress(done, total)`` as ranks are parsed."""

WORKERS = 2
"""Analyses running at once; more wait, queued (each one parses on every core already)."""
KEEP_FINISHED = 8
"""Finished jobs no session has taken yet that the registry keeps (oldest dropped first)."""


class State(Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


PARSING = "parsing rank traces"
LAST_STAGE = "matching collectives / classifying"


@dataclass(frozen=True)
class Snapshot:
    """A job as one moment saw it."""

    state: State
    done: int
    """Ranks parsed so far."""
    total: int | None
    """Ranks to parse; None until the loader has found the run's files."""

    @property
    def finished(self) -> bool:
        return self.state in (State.DONE, State.FAILED)

    @property
    def fraction(self) -> float:
        """Of the parsing, 0..1 (the last stage counts as parsed)."""
        return self.done / self.total if self.total else 0.0

    @property
    def text(self) -> str:
        """``parsing rank traces: 17 of 64``, or the stage it is in."""
        if self.state is State.QUEUED:
            return "queued: waiting for another analysis to finish"
        if self.finished:
            return self.state.name.lower()
        if self.total is None:
            return "looking for the run's traces"
        if self.done < self.total:
            return f"{PARSING}: {self.done} of {self.total}"
        return LAST_STAGE


@dataclass(eq=False)
class Job:
    """One analysis, shared by every session that asked for its key."""

    key: Key
    _state: State = State.QUEUED
    _done: int = 0
    _total: int | None = None
    _result: Result | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _finished: threading.Event = field(default_factory=threading.Event)

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(self._state, self._done, self._total)

    @property
    def result(self) -> Result | None:
        """The analysis or its one-line error once finished; None before."""
        with self._lock:
            return self._result

    def wait(self) -> Result:
        """The result, once the job has finished."""
        self._finished.wait()
        result = self.result
        assert result is not None
        return result

    def progress(self, done: int, total: int) -> None:
        with self._lock:
            self._done, self._total = done, total

    def run(self, work: Work) -> None:
        with self._lock:
            self._state = State.RUNNING
        try:
            result = work(self.progress)
        except BaseException as exc:  # work reports its errors; this is a bug in it
            logger.exception("background analysis of %s failed", self.key[1])
            result = (None, f"unexpected error while analyzing ({type(exc).__name__}): {exc}")
        with self._lock:
            self._result = result
            self._state = State.FAILED if result[0] is None else State.DONE
        self._finished.set()


class Registry:
    """The jobs of one server: at most one per key, run by a pool of :data:`WORKERS` threads."""

    def __init__(self, workers: int = WORKERS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fsobs-analysis")
        self._jobs: dict[Key, Job] = {}
        self._lock = threading.Lock()

    def submit(self, key: Key, work: Work) -> Job:
        """The job of ``key``: the one already there (queued, running or not yet taken), else a
        new one running ``work``."""
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                job = self._jobs[key] = Job(key)
                self._pool.submit(job.run, work)
                self._drop_old()
            return job

    def find(self, key: Key) -> Job | None:
        with self._lock:
            return self._jobs.get(key)

    def forget(self, key: Key) -> None:
        """Drop a finished job (its result is kept elsewhere now)."""
        with self._lock:
            job = self._jobs.get(key)
            if job is not None and job.snapshot().finished:
                del self._jobs[key]

    def _drop_old(self) -> None:
        finished = [k for k, j in self._jobs.items() if j.snapshot().finished]
        for key in finished[: max(0, len(finished) - KEEP_FINISHED)]:
            del self._jobs[key]

    def shutdown(self) -> None:
        """Wait for the jobs running and queued (tests; a server just exits)."""
        self._pool.shutdown(wait=True)


@st.cache_resource
def registry() -> Registry:
    """The server's registry, shared by all sessions."""
    return Registry()


def scheduler() -> str | None:
    """The Dask scheduler the loader parses on (``FSOBS_DASK_SCHEDULER``), None for this
    machine's processes: the same rule :func:`fsobs.trace.loader.map_run` follows."""
    return scheduler_address(None)
