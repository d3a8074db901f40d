"""Parse the ranks on a Dask cluster instead of this machine's process pool.

The loader (:func:`fsobs.trace.loader.map_run`) parses and reduces each file in its own fork
pool by default. When a Dask scheduler is named (``fsobs analyze --scheduler ADDRESS``,
``FSOBS_DASK_SCHEDULER``, or ``LoadConfig(scheduler=...)``), :class:`DaskCluster` runs the same
picklable function as one task per file on the cluster's workers instead. Each task opens its
file on the worker (a local path the workers share, or a URL), so the client never holds trace
bytes; only the reduced ranks (e.g. the analysis summaries) come back, in file order. dask is
imported only when a cluster is used.

Failures on a cluster: bad input raises its :class:`~fsobs.errors.FsobsError` once (the task
returns it instead of raising, so Dask does not retry what would fail again); any other
exception is retried :data:`TASK_RETRIES` times; a worker that dies while parsing is replaced
by Dask, which runs the task again elsewhere up to its ``distributed.scheduler.allowed-failures``
(default 3) times, after which :class:`ClusterError` names the file. No rank is ever dropped.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from fsobs.errors import ClusterError, FsobsError

if TYPE_CHECKING:
    from fsobs.storage import Location

SCHEDULER_ENV = "FSOBS_DASK_SCHEDULER"
"""Environment variable naming the Dask scheduler when ``LoadConfig.scheduler`` is None."""
LOCAL = "local"
"""``LoadConfig(scheduler="local")``: this machine's pool, whatever the environment says."""
TASK_RETRIES = 2
"""Extra tries of a cluster task that raised something other than bad input."""
CONNECT_TIMEOUT_S = 30

T = TypeVar("T", bound="Location")  # the files
R = TypeVar("R")


Progress = Callable[[int, int], None]
"""Told (items done, items) as the items are processed; called in the caller's process."""


@dataclass(frozen=True)
class DaskCluster:
    """The workers of the Dask scheduler at ``address`` (``tcp://host:8786``)."""

    address: str

    def map(
        self,
        fn: Callable[[T], R],
        items: Sequence[T],
        progress: Progress,
        keep: Callable[[R], R],
    ) -> list[R]:
        """``[keep(fn(item)) for item in items]``, ``fn`` as cluster tasks and ``keep`` here as
        each result arrives; ``progress(done, total)`` once with 0 done, then as each task's
        result arrives."""
        total = len(items)
        progress(0, total)
        if not items:
            return []
        distributed = _import_distributed()
        with self._client(distributed) as client:
            tag = uuid.uuid4().hex[:8]
            keys = [f"fsobs-parse-{i}-{tag}" for i in range(total)]
            futures = client.map(
                _run_task, items, fn=fn, key=keys, pure=False, retries=TASK_RETRIES
            )
            index = {f.key: i for i, f in enumerate(futures)}
            outcomes: list[Any] = [None] * total
            finished = distributed.as_completed(futures, loop=client.loop)
            for done, future in enumerate(finished, start=1):
                i = index[future.key]
                outcome = _outcome(future, items[i], distributed)
                future.release()  # the result is here: the cluster may drop it
                outcomes[i] = outcome if isinstance(outcome, BaseException) else keep(outcome)
                progress(done, total)
            return raise_first(outcomes)

    def _client(self, distributed: Any) -> Any:
        try:
            return distributed.Client(self.address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as exc:
            raise ClusterError(
                f"cannot connect to the Dask scheduler at {self.address} ({exc})"
            ) from exc


def raise_first(outcomes: list[Any]) -> list[Any]:
    """``outcomes`` (results, or the exceptions of the items that failed), once none failed;
    else the first failure in item order is raised."""
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes


def scheduler_address(
    configured: str | None, environ: Mapping[str, str] = os.environ
) -> str | None:
    """The scheduler to use: ``configured``, else ``$FSOBS_DASK_SCHEDULER``; None (or
    ``"local"``) means this machine's pool."""
    address = configured or environ.get(SCHEDULER_ENV, "").strip() or None
    return None if address == LOCAL else address


@dataclass(frozen=True)
class _Failed:
    """Bad input found by a task, returned rather than raised (not worth a retry)."""

    error: FsobsError


def _run_task(item: Any, fn: Callable[[Any], Any]) -> Any:
    """What a cluster task runs."""
    try:
        return fn(item)
    except FsobsError as exc:
        return _Failed(exc)


def _outcome(future: Any, item: Location, distributed: Any) -> Any:
    """The task's result, or the error to raise for it: its bad input, the exception it kept
    raising, or :class:`ClusterError` when the cluster lost it."""
    import asyncio  # here, not at the top: start-up of a command without a cluster

    try:
        result = future.result()
    except distributed.KilledWorker as exc:
        return ClusterError(
            f"the Dask workers parsing this file kept dying (out of memory?): {exc}", path=item
        )
    except (Exception, asyncio.CancelledError) as exc:
        if future.status == "error":  # the task's own exception, after its retries
            return exc
        return ClusterError(
            f"the Dask cluster lost the task parsing this file ({type(exc).__name__}: {exc})",
            path=item,
        )
    return result.error if isinstance(result, _Failed) else result


def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError as exc:
        raise ClusterError(
            "analysis on a Dask cluster needs dask and distributed: "
            "pip install 'freescale[cluster]'"
        ) from exc
    return distributed
