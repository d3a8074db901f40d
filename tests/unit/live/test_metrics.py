"""``fsobs watch --prometheus``: ``/metrics`` served on a free port, scraped over HTTP and
parsed with prometheus_client's own parser."""

from __future__ import annotations

import contextlib
import math
import re
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fsobs.cli import live as cli_live
from fsobs.cli import main
from fsobs.live.alerts import RULES
from fsobs.live.metrics import LiveCollector, serve
from fsobs.runformat import RunMeta, SidecarWriter, write_run_json
from tests.unit.live.test_watch import alerts, live_state, rank, step_record, summary, window

RUN = "out/live-0"


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Metric name -> sorted labels -> value, from one GET of /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
        body = response.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def by(metrics, name: str, label: str, run: str = RUN) -> dict[str, float]:
    """One metric's samples of run ``run``, keyed by ``label``."""
    found = {}
    for labels, value in metrics[name].items():
        labels = dict(labels)
        assert labels.pop("run") == run
        found[labels[label]] = value
    return found


@pytest.fixture(scope="module")
def server():
    """One server for the module (each stop waits up to its 0.5 s poll): every test hands
    it a state of its own first."""
    with serve(0) as running:
        yield running


def test_nothing_is_served_before_the_first_state():
    with serve(0) as fresh:
        assert scrape(fresh.port) == {}


def test_run_and_rank_metrics(server):
    state = live_state(
        ranks=(
            rank(0, step_ms=250.0, last_ms=262.0, gc_ms=3.0),
            rank(1, step_ms=310.0, gc_ms=None),
        ),
    )
    server.update(state)
    m = scrape(server.port)
    assert by(m, "fsobs_run_status", "status") == {"running": 1, "complete": 0, "stopped": 0}
    assert m["fsobs_run_step"] == {(("run", RUN),): 119}
    assert m["fsobs_run_idle_seconds"] == {(("run", RUN),): 0.5}
    assert by(m, "fsobs_rank_idle_seconds", "rank") == {"0": 0.5, "1": 0.5}
    assert by(m, "fsobs_rank_step_seconds", "rank") == {"0": 0.25, "1": 0.31}
    assert by(m, "fsobs_rank_last_step_seconds", "rank") == {"0": 0.262, "1": 0.26}
    assert by(m, "fsobs_rank_last_step", "rank") == {"0": 119, "1": 119}
    assert by(m, "fsobs_rank_gc_seconds_per_step", "rank") == {"0": 0.003}  # rank 1 unknown
    assert m["fsobs_imbalance_before"] == {(("run", RUN),): 1.4}
    assert m["fsobs_imbalance_after"] == {(("run", RUN),): 1.05}
    assert m["fsobs_straggler_rank"] == {(("run", RUN),): 1}
    # two closed windows and one pending (live_state's default index)
    assert by(m, "fsobs_windows", "state") == {"closed": 2, "pending": 1, "missing": 0, "bad": 0}


def test_a_new_state_replaces_the_old_one(server):
    server.update(live_state())
    server.update(live_state(status="stopped", late_rank=None, imbalance_after=None))
    m = scrape(server.port)
    assert by(m, "fsobs_run_status", "status") == {"running": 0, "complete": 0, "stopped": 1}
    assert m["fsobs_straggler_rank"] == {(("run", RUN),): -1}
    assert "fsobs_imbalance_after" not in m  # unknown: left out, not 0


def test_window_metrics_of_the_closed_windows_only(server):
    wide = summary(bubble_ratio=0.2, straggler=None, classes_ms_per_step={"host_idle": 40.0})
    windows = (window(50), window(100, summary=wide), window(110, "pending", published=(0,)))
    server.update(live_state(windows=windows))
    m = scrape(server.port)
    assert by(m, "fsobs_window_bubble_ratio", "window") == {"w00000050": 0.125, "w00000100": 0.2}
    assert by(m, "fsobs_window_straggler_rank", "window") == {"w00000050": 1, "w00000100": -1}
    # the default summary: 20 ms straggler wait, 11.25 ms exposed comm per step, zeros too
    seconds = {
        (dict(k)["window"], dict(k)["class"]): v
        for k, v in m["fsobs_window_bubble_seconds_per_step"].items()
    }
    assert seconds == {
        ("w00000050", "straggler_wait"): 0.02,
        ("w00000050", "exposed_comm"): 0.01125,
        ("w00000050", "unattributed_comm"): 0.0,
        ("w00000050", "host_idle"): 0.0,
        ("w00000050", "other"): 0.0,
        ("w00000100", "host_idle"): 0.04,
    }
    assert by(m, "fsobs_window_straggler_wait_seconds_per_step", "window") == {
        "w00000050": 0.02,
        "w00000100": 0.02,
    }


def test_every_alert_rule_is_exported_firing_or_not(server):
    server.update(live_state(alerts=alerts("gc_storm")))
    firing = by(scrape(server.port), "fsobs_alert_firing", "alert")
    assert firing == {name: float(name == "gc_storm") for name in RULES}


def test_window_labels_stay_bounded():
    collector = LiveCollector(max_windows=3)
    collector.update(live_state(windows=tuple(window(10 * i) for i in range(1, 21))))
    (ratio,) = (f for f in collector.collect() if f.name == "fsobs_window_bubble_ratio")
    assert [s.labels["window"] for s in ratio.samples] == ["w00000180", "w00000190", "w00000200"]


def test_nan_is_left_out():
    collector = LiveCollector()
    collector.update(live_state(windows=(window(50, summary=summary(bubble_ratio=math.nan)),)))
    (ratio,) = (f for f in collector.collect() if f.name == "fsobs_window_bubble_ratio")
    assert ratio.samples == []


def test_every_metric_is_named_fsobs_and_labelled_by_run(server):
    server.update(live_state())
    m = scrape(server.port)
    assert m and all(name.startswith("fsobs_") for name in m)
    assert all(dict(labels)["run"] == RUN for samples in m.values() for labels in samples)


def test_the_server_binds_localhost_by_default(server):
    assert server.url == f"http://127.0.0.1:{server.port}/metrics"


def test_fsobs_watch_serves_the_state_at_each_poll(capsys, tmp_path, monkeypatch):
    """``fsobs watch RUN --prometheus 0`` on a 2-rank run that trains: the endpoint says
    running with the ranks' 100 ms steps; once run.json says complete the endpoint says so
    for ``LINGER_S`` more, then the command ends."""
    monkeypatch.setattr(cli_live, "LINGER_S", 1.0)
    write_run_json(tmp_path, RunMeta(world_size=2, status="incomplete", reason="running"))
    done: list[int] = []
    with contextlib.ExitStack() as stack:
        for r in range(2):
            writer = stack.enter_context(SidecarWriter(tmp_path, r))
            for step in range(3):
                writer.write(step_record(step))
        argv = ["watch", str(tmp_path), "--interval", "0.05", "--prometheus", "0"]
        thread = threading.Thread(target=lambda: done.append(main(argv)))
        thread.start()
        try:
            port = int(wait_for(lambda: re.search(r":(\d+)/metrics", capsys.readouterr().err))[1])
            m = wait_for(lambda: scrape(port) or None)
            assert by(m, "fsobs_run_status", "status", str(tmp_path))["running"] == 1
            assert by(m, "fsobs_rank_step_seconds", "rank", str(tmp_path)) == {"0": 0.1, "1": 0.1}
            write_run_json(tmp_path, RunMeta(world_size=2))  # the job's end: complete
            complete = wait_for(
                lambda: by(scrape(port), "fsobs_run_status", "status", str(tmp_path))["complete"]
                == 1
            )
            assert complete
        finally:
            write_run_json(tmp_path, RunMeta(world_size=2))
            thread.join(timeout=10)
    assert done == [0]


def wait_for(probe, timeout_s: float = 10.0):
    """The first true value of ``probe()``, tried every 20 ms."""
    deadline = time.monotonic() + timeout_s
    while (value := probe()) is None or value is False:
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return value
