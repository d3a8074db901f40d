"""``fsobs watch --prometheus PORT``: the latest :class:`~fsobs.live.model.LiveState` as
Prometheus metrics on ``/metrics`` (text format, ``prometheus_client``).

Every metric is a gauge named ``fsobs_*``, labelled by ``run``, in seconds where it is a
time. The collector lives in a registry of its own (never the process-wide one), and a
scrape reads the state handed to :meth:`LiveCollector.update` last: nothing is computed per
scrape. Only the latest :data:`MAX_WINDOWS` closed windows are exported, so the ``window``
label's cardinality stays bounded however long the run::

    fsobs_run_status{run,status}                        1 for the current status, 0 others
    fsobs_run_step{run}                                 the last step every rank ended
    fsobs_run_idle_seconds{run}                         since any sidecar last grew
    fsobs_rank_step_seconds{run,rank}                   median of the rank's recent steps
    fsobs_rank_last_step{run,rank}                      the rank's last step number
    fsobs_rank_last_step_seconds{run,rank}              its wall time
    fsobs_rank_gc_seconds_per_step{run,rank}            mean GC pause per recent step
    fsobs_rank_idle_seconds{run,rank}                   since its sidecar last grew
    fsobs_imbalance_before{run}, fsobs_imbalance_after{run}   max/mean est. cost, both splits
    fsobs_straggler_rank{run}                           the late rank, -1 for none
    fsobs_windows{run,state}                            windows of the index by state
    fsobs_window_bubble_ratio{run,window}               closed windows only
    fsobs_window_bubble_seconds_per_step{run,window,class}
    fsobs_window_straggler_wait_seconds_per_step{run,window}
    fsobs_window_straggler_rank{run,window}             -1 for none
    fsobs_alert_firing{run,alert}                       0 or 1, every rule of fsobs.live.alerts

A value the state does not know (None, NaN) is left out rather than exported as 0.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from types import TracebackType
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from fsobs.live.alerts import RULES
from fsobs.live.model import STATUSES, WINDOW_STATES, LiveState, RankProgress, WindowEntry

MAX_WINDOWS = 10
"""Closed windows exported (the latest)."""
DEFAULT_HOST = "127.0.0.1"


class LiveCollector(Collector):
    """Metric families from the latest state (none before the first :meth:`update`)."""

    def __init__(self, *, max_windows: int = MAX_WINDOWS) -> None:
        if max_windows < 1:
            raise ValueError(f"max_windows: must be >= 1, got {max_windows}")
        self._max_windows = max_windows
        self._state: LiveState | None = None

    def update(self, state: LiveState) -> None:
        """Export ``state`` from the next scrape on (one reference swap: thread-safe)."""
        self._state = state

    def collect(self) -> Iterator[Metric]:
        state = self._state
        if state is None:
            return
        yield from _run_metrics(state)
        yield from _rank_metrics(state.run, state.ranks)
        windows = state.closed_windows[-self._max_windows :]
        yield from _window_metrics(state.run, windows)
        alerts = {a.name: a.firing for a in state.alerts}
        firing = _gauge("alert_firing", "1 while the alert rule fires", ["alert"])
        for name in dict.fromkeys((*RULES, *alerts)):
            firing.add_metric([state.run, name], float(alerts.get(name, False)))
        yield firing


class MetricsServer:
    """``/metrics`` served from a daemon thread; a context manager that stops it."""

    def __init__(self, collector: LiveCollector, server: WSGIServer, thread: threading.Thread):
        self.collector = collector
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        """The port bound (the one chosen when asked for port 0)."""
        return int(self._server.server_port)

    @property
    def url(self) -> str:
        host = str(self._server.server_address[0])
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/metrics"

    def update(self, state: LiveState) -> None:
        self.collector.update(state)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def serve(port: int, host: str | None = None, *, max_windows: int = MAX_WINDOWS) -> MetricsServer:
    """Start serving a new :class:`LiveCollector` on ``host:port`` (port 0: any free one;
    host None: :data:`DEFAULT_HOST`, this machine only)."""
    collector = LiveCollector(max_windows=max_windows)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    addr = DEFAULT_HOST if host is None else host
    server, thread = start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(collector, server, thread)


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"fsobs_{name}", doc, labels=["run", *labels])


def _add(family: GaugeMetricFamily, labels: list[str], value: float | None) -> None:
    """One sample, unless the value is unknown."""
    if value is not None and math.isfinite(value):
        family.add_metric(labels, float(value))


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000


def _run_metrics(state: LiveState) -> Iterator[Metric]:
    run = state.run
    status = _gauge("run_status", "1 for the run's current status", ["status"])
    for name in STATUSES:
        status.add_metric([run, name], float(name == state.status))
    step = _gauge("run_step", "The last step every rank has ended", [])
    _add(step, [run], state.step)
    idle = _gauge("run_idle_seconds", "Seconds since any step sidecar last grew", [])
    _add(idle, [run], state.idle_s)
    before = _gauge("imbalance_before", "Max/mean estimated cost, random split (recent)", [])
    _add(before, [run], state.imbalance_before)
    after = _gauge("imbalance_after", "Max/mean estimated cost, split used (recent)", [])
    _add(after, [run], state.imbalance_after)
    straggler = _gauge("straggler_rank", "The rank late in most recent steps, -1 for none", [])
    straggler.add_metric([run], -1.0 if state.late_rank is None else float(state.late_rank.rank))
    counts = _gauge("windows", "Windows of the run's index by state", ["state"])
    for name in WINDOW_STATES:
        counts.add_metric([run, name], float(sum(w.state == name for w in state.windows)))
    yield from (status, step, idle, before, after, straggler, counts)


def _rank_metrics(run: str, ranks: tuple[RankProgress, ...]) -> Iterator[Metric]:
    step = _gauge("rank_step_seconds", "Median wall time of the rank's recent steps", ["rank"])
    last = _gauge("rank_last_step", "The rank's last step", ["rank"])
    last_s = _gauge("rank_last_step_seconds", "Wall time of the rank's last step", ["rank"])
    gc = _gauge("rank_gc_seconds_per_step", "Mean GC pause per recent step", ["rank"])
    idle = _gauge("rank_idle_seconds", "Seconds since the rank's sidecar last grew", ["rank"])
    for r in ranks:
        labels = [run, str(r.rank)]
        _add(step, labels, _seconds(r.step_ms))
        _add(last, labels, r.last_step)
        _add(last_s, labels, _seconds(r.last_ms))
        _add(gc, labels, _seconds(r.gc_ms))
        _add(idle, labels, r.idle_s)
    yield from (step, last, last_s, gc, idle)


def _window_metrics(run: str, windows: tuple[WindowEntry, ...]) -> Iterator[Metric]:
    ratio = _gauge("window_bubble_ratio", "Bubble time / rank time in the window", ["window"])
    classes = _gauge(
        "window_bubble_seconds_per_step",
        "Bubble seconds per (rank, step) of one class in the window",
        ["window", "class"],
    )
    wait = _gauge(
        "window_straggler_wait_seconds_per_step",
        "Straggler wait per (rank, step) in the window",
        ["window"],
    )
    straggler = _gauge(
        "window_straggler_rank", "The window's most frequent straggler, -1 for none", ["window"]
    )
    for w in windows:
        s = w.summary
        if s is None:  # a closed window always has one; nothing to export otherwise
            continue
        _add(ratio, [run, w.wid], s.bubble_ratio)
        for name, ms in sorted(s.classes_ms_per_step.items()):
            _add(classes, [run, w.wid, name], _seconds(ms))
        _add(wait, [run, w.wid], _seconds(s.straggler_wait_ms_per_step))
        straggler.add_metric([run, w.wid], -1.0 if s.straggler is None else float(s.straggler))
    yield from (ratio, classes, wait, straggler)
