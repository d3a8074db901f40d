"""Background analysis (``dashboard/background.py``, ``dashboard/pending.py``): one job per run
whoever asks, its progress in ranks, its one-line error, and the page that shows the progress
and then renders as usual (through AppTest; ``test_browser_background.py`` drives two real
browser sessions)."""

from __future__ import annotations

import shutil
import threading
import time
from functools import partial
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboard import background, cache, disk_cache
from dashboard.background import LAST_STAGE, Registry, Result, Snapshot, State
from dashboard.store import RunEntry, find_run, list_runs
from dashboard.widgets import KPIS, format_kpi
from fsobs import analyze_path
from tests.support.stores import APP, NUM_RANKS

SIM = "sim/control"


def _entry(store: Path, run_id: str) -> RunEntry:
    entry = find_run(list_runs(store), run_id)
    assert entry is not None
    return entry


def test_two_askers_of_one_key_share_one_job() -> None:
    registry = Registry()
    gate, calls = threading.Event(), []

    def work(progress: background.Progress) -> Result:
        calls.append(1)
        gate.wait(30)
        return None, "stopped"

    key = ("store", "run", (("rank0.json", 1, 2),))
    jobs: list[background.Job] = []
    askers = [
        threading.Thread(target=lambda: jobs.append(registry.submit(key, work))) for _ in range(2)
    ]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join()
    other = registry.submit(("store", "other run", ()), work)
    gate.set()
    registry.shutdown()
    assert jobs[0] is jobs[1] and other is not jobs[0]
    assert calls == [1, 1]  # one run for the shared key, one for the other
    assert jobs[0].snapshot().state is State.FAILED and jobs[0].result == (None, "stopped")


def test_progress_counts_the_runs_ranks(store: Path) -> None:
    shutil.rmtree(store / disk_cache.CACHE_DIR, ignore_errors=True)  # parsed, not read back
    entry = _entry(store, SIM)
    key = (str(store), entry.run_id, entry.signature)
    seen: list[tuple[int, int]] = []

    def work(progress: background.Progress) -> Result:
        def tell(done: int, total: int) -> None:
            seen.append((done, total))
            progress(done, total)

        return cache.analysis_of(*key, progress=tell)

    registry = Registry()
    job = registry.submit(key, work)
    registry.shutdown()
    assert {total for _, total in seen} == {NUM_RANKS}
    assert [done for done, _ in seen] == list(range(NUM_RANKS + 1))
    snap = job.snapshot()
    assert (snap.state, snap.done, snap.total, snap.fraction) == (State.DONE, 4, 4, 1.0)
    assert job.result is not None and job.result[0] is not None
    expected = analyze_path(store / SIM).summary["bubble_ratio"]
    assert job.result[0].summary["bubble_ratio"] == expected


def test_the_stages_in_words() -> None:
    assert Snapshot(State.RUNNING, 17, 64).text == "parsing rank traces: 17 of 64"
    assert Snapshot(State.RUNNING, 64, 64).text == LAST_STAGE
    assert Snapshot(State.RUNNING, 0, None).text == "looking for the run's traces"
    assert Snapshot(State.QUEUED, 0, None).text.startswith("queued")
    assert Snapshot(State.RUNNING, 16, 64).fraction == 0.25


def test_a_failed_analysis_gives_its_one_line(store: Path) -> None:
    entry = _entry(store, "broken")
    registry = Registry()
    key = (str(store), "broken", entry.signature)
    job = registry.submit(key, partial(cache.analysis_of, *key))

    def bug(progress: background.Progress) -> Result:
        raise RuntimeError("a bug")

    buggy = registry.submit(("s", "r", ()), bug)
    registry.shutdown()
    assert job.snapshot().state is State.FAILED and job.result is not None
    analysis, error = job.result
    assert analysis is None and error is not None
    assert "\n" not in error and "not valid JSON" in error
    assert error.startswith("broken/rank0.json") and str(store) not in error
    assert buggy.result == (None, "unexpected error while analyzing (RuntimeError): a bug")


def _bubbles(run_id: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["run"] = run_id
    at.switch_page("app_pages/bubbles.py")
    at.run()
    assert not at.exception, at.exception
    return at


def _progress_texts(at: AppTest) -> list[str]:
    return [e.proto.text for e in at.get("progress")]


def test_a_big_run_shows_progress_then_the_page(
    app_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sessions open a run whose analysis is running (held until both have looked): both
    show the pending view of that one job, then the page with the job's KPIs."""
    monkeypatch.setattr("dashboard.cache.INLINE_BYTES", 0)  # every run is "big"
    shutil.rmtree(app_env / disk_cache.CACHE_DIR, ignore_errors=True)  # not analyzed yet
    entry = _entry(app_env, SIM)
    key = (str(app_env), SIM, entry.signature)
    gate = threading.Event()

    def held(progress: background.Progress) -> Result:
        progress(1, NUM_RANKS)
        gate.wait(60)
        return cache.analysis_of(*key, progress=progress)

    job = background.registry().submit(key, held)
    first, second = _bubbles(SIM), _bubbles(SIM)  # two sessions, while the job is held
    for at in (first, second):
        assert not at.metric  # the page waits
        assert any("Analyzing in the background" in i.value for i in at.info)
        assert any("world size 4" in m.value for m in at.markdown)
        assert _progress_texts(at) == [f"parsing rank traces: 1 of {NUM_RANKS}"]
    assert background.registry().find(key) is job
    gate.set()
    deadline = time.monotonic() + 120
    while not job.snapshot().finished:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    expected = analyze_path(app_env / SIM).summary
    for at in (first, second):
        at.run()
        assert not at.exception, at.exception
        assert not _progress_texts(at)
        metrics = {m.label: m.value for m in at.metric}
        for name, label, unit in KPIS:
            assert metrics[label] == format_kpi(expected[name], unit)
    assert background.registry().find(key) is None  # taken into the in-memory cache
    assert cache.is_analyzed(app_env, entry)


@pytest.mark.multiprocess
def test_on_a_dask_scheduler_the_job_parses_there(
    app_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``FSOBS_DASK_SCHEDULER`` set, the page says so and the job's ranks are parsed by
    that scheduler's workers (its task names are the loader's ``fsobs-parse-*``)."""
    distributed = pytest.importorskip("distributed")
    monkeypatch.setattr("dashboard.cache.INLINE_BYTES", 0)  # every run is "big"
    shutil.rmtree(app_env / disk_cache.CACHE_DIR, ignore_errors=True)
    entry = _entry(app_env, SIM)
    with (
        distributed.LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",
            worker_dashboard_address=None,
        ) as local,
        distributed.Client(local.scheduler_address, set_as_default=False) as client,
    ):
        monkeypatch.setenv("FSOBS_DASK_SCHEDULER", local.scheduler_address)
        at = _bubbles(SIM)
        job = background.registry().find((str(app_env), SIM, entry.signature))
        assert job is not None  # submitted by the page, which looked at it right after
        assert any(f"on the Dask scheduler `{local.scheduler_address}`" in i.value for i in at.info)
        job.wait()
        at.run()
        assert not at.exception, at.exception
        prefixes = client.run_on_scheduler(
            lambda dask_scheduler: list(dask_scheduler.task_prefixes)
        )
    assert "fsobs-parse" in prefixes, prefixes
    monkeypatch.delenv("FSOBS_DASK_SCHEDULER")
    expected = analyze_path(app_env / SIM).summary
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Bubble ratio"] == format_kpi(expected["bubble_ratio"], "pct")
