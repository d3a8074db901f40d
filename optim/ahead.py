"""The balance plan off the training thread: a planner thread that makes step N+1's plan while
step N trains (``FreeScale.shares``, ``BalancedBatchSampler``).

::

    training thread   |-- step N ----------------|-- step N+1 ---------------|
                       take N                     take N+1 (ready: no wait)
    planner thread       |plan N+1|                 |plan N+2|
                          ## fsobs:balance ##

:class:`PlanAhead` calls ``plan(step, item)`` for each item of ``items``, in order, on one
background thread, at most ``depth`` items ahead of the consumer (``depth=1``: the plan of the
next step is made once the current one is taken), and yields the results in order. The work is
the same function on the same inputs as on the training thread, so the results are identical
(same parts, same digest) and deterministic. What happens on the training thread:

- ``next()`` waits for the next result (``FreeScale`` records ``## fsobs:balance_wait ##``
  around it, a short range when it was ready); the planning itself (``## fsobs:balance ##``,
  recorded by ``plan``) lies on the planner thread, which torch.profiler records with
  ``profile_all_threads`` (:mod:`fsobs.collect.profiler`);
- an error on the planner thread (in ``plan`` or in ``items``) is raised on the training
  thread, at the step that needs the plan (every step before it gets its result first): the
  same exception (a ``ValueError`` naming the field stays one), with a note naming the step
  (:data:`NOTE`);
- :meth:`close` (also ``with``, and at the end of the items) stops and joins the thread: no
  thread is left, also when the loop stops early or raises. The thread finishes the item it is
  on first; ``items`` must not block indefinitely.

The GIL: the planner thread runs Python (the partitioners' heap loops), so it holds the GIL
while it plans. The training thread does not need it while it is inside torch's ops, backward
and collective waits, which release it; there the plan costs the training thread nothing. When
the training thread needs the GIL while the planner holds it, it waits for the planner's next
switch (at most ``sys.getswitchinterval()``, 5 ms): never longer in all than the planning
itself. BENCHMARKS.md ("Balance plan off the training thread") has the measured share.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Generic, TypeVar

__all__ = ["NOTE", "PlanAhead"]

T = TypeVar("T")
R = TypeVar("R")


NOTE = "step {step}: raised on the balance planner thread (optim.ahead)"
"""The note added to an error of the planner thread when the training thread raises it."""


@dataclass(frozen=True)
class _Planned(Generic[R]):
    value: R


@dataclass(frozen=True)
class _Failed:
    step: int
    error: BaseException


class _End:
    """The items are exhausted."""


_END = _End()


class PlanAhead(Generic[T, R]):
    """``plan(step, item)`` for each of ``items`` on a background thread, ``depth`` ahead of
    the consumer (module docstring). Item ``i`` is step ``first_step + i * stride`` (``stride``:
    the steps one item plans, a window's ``K``); ``wait_range``: the range around the
    consumer's wait (``FreeScale``: ``## fsobs:balance_wait ##``). Iterate it on one thread.
    Needs no torch."""

    def __init__(
        self,
        plan: Callable[[int, T], R],
        items: Iterable[T],
        *,
        first_step: int = 0,
        stride: int = 1,
        depth: int = 1,
        wait_range: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
        name: str = "freescale-planner",
    ) -> None:
        for field, value in (("stride", stride), ("depth", depth)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field}: must be an int >= 1, got {value!r}")
        self._plan, self._items, self._wait_range = plan, iter(items), wait_range
        self._first, self._stride = first_step, stride
        self._slots = threading.Semaphore(depth)
        self._results: queue.SimpleQueue[_Planned[R] | _Failed | _End] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the planner thread

    def _run(self) -> None:
        step = self._first
        try:
            while True:
                self._slots.acquire()
                if self._stop.is_set():
                    return
                item = next(self._items, _END)
                if isinstance(item, _End):
                    self._results.put(_END)
                    return
                self._results.put(_Planned(self._plan(step, item)))
                step += self._stride
        except BaseException as exc:  # every error reaches the training thread
            self._results.put(_Failed(step, exc))

    # ---------------------------------------------------------------- the training thread

    def __iter__(self) -> Iterator[R]:
        return self

    def __next__(self) -> R:
        """The next plan (waiting for it); StopIteration after the last one or :meth:`close`;
        the planner thread's error for a plan that failed, with its :data:`NOTE`."""
        if self._done:
            raise StopIteration
        with self._wait_range():
            result = self._results.get()
        if isinstance(result, _Planned):
            self._slots.release()
            return result.value
        self.close()
        if isinstance(result, _Failed):
            _add_note(result.error, NOTE.format(step=result.step))
            raise result.error
        raise StopIteration

    def close(self) -> None:
        """Stop the planner thread and wait for it (it finishes the item it is on); the plans
        not taken are dropped. Idempotent."""
        self._done = True
        self._stop.set()
        self._slots.release()  # wakes the thread if it waits for a free slot
        if self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def alive(self) -> bool:
        """Whether the planner thread is still running."""
        return self._thread.is_alive()

    def __enter__(self) -> PlanAhead[T, R]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)`` (Python 3.11's); on 3.10 the same attribute, which its
    tracebacks do not show."""
    notes = getattr(error, "__notes__", [])
    error.__notes__ = [*notes, note]  # type: ignore[attr-defined]  # 3.10's typeshed lacks it
