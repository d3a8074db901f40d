"""Live runs in the app (issue 34, point 5): the Runs page marks and orders them, the Live page
follows a run from running to stopped, refreshing in place, and requests a capture."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dashboard.live_runs import request
from dashboard.store import list_runs
from dashboard.text import esc as escape_markdown
from fsobs import analyze_path
from fsobs.runformat import (
    RunMeta,
    SidecarWriter,
    StepRecord,
    mark_incomplete,
    write_run_json,
)
from fsobs.runformat.names import CAPTURE_JSON
from fsobs.runformat.windows import (
    WindowNote,
    WindowSchedule,
    window_dir,
    write_note,
    write_schedule,
)
from fsobs.simulate import write_gpu_run
from tests.support.stores import open_page

LIVE = "z/live"
"""The running run: its id sorts last, the Runs page must list it first."""
STEP_NS = 40_000_000
"""Every step of the live run lasts 40 ms on rank 0 and 50 ms on rank 1."""


class Job:
    """A 2-rank job writing ``<store>/z/live`` step by step: ``run.json`` incomplete, reason
    ``running``, and the sidecars still ``.partial``."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        write_run_json(
            run_dir,
            RunMeta(
                name="live", world_size=2, backend="gloo", status="incomplete", reason="running"
            ),
        )
        self.writers = [SidecarWriter(run_dir, rank) for rank in (0, 1)]
        self.steps = 0

    def step(self, count: int = 1) -> None:
        """Both ranks end ``count`` more steps (rank 1 10 ms slower)."""
        for _ in range(count):
            start = 10**18 + self.steps * 10**8
            for rank, writer in enumerate(self.writers):
                end = start + STEP_NS + rank * 10_000_000
                writer.write(
                    StepRecord.of(
                        self.steps,
                        [8, 16],
                        None,
                        start,
                        end,
                        imbalance_before=1.5,
                        imbalance_after=1.1,
                    )
                )
            self.steps += 1

    def abandon(self) -> None:
        for writer in self.writers:
            writer.abandon()


def _publish(run_dir: Path, first: int, last: int, ranks: tuple[int, ...]) -> None:
    """Publish window ``first``-``last`` of ``ranks`` as the profiler does: traces, then notes
    (synthetic 2-rank GPU traces, steps 10 and 11)."""
    folder = window_dir(run_dir, first)
    if ranks == (0, 1):
        write_gpu_run(folder, num_ranks=2, num_steps=last - first + 1, kernels_per_step=20, seed=3)
    for rank in ranks:
        note = WindowNote(
            rank=rank, first_step=first, last_step=last, trigger="schedule", closed_ns=1
        )
        write_note(run_dir, note)


@pytest.fixture
def live_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Job]]:
    """A store of three runs: ``a/done`` (complete), ``b/broke`` (incomplete: a rank died, no
    live layout) and the running :data:`LIVE` at step 15, whose job takes captures (a schedule
    of none), with window 10-11 published by both ranks and window 14-15 by rank 0 only
    (pending)."""
    store = tmp_path / "store"
    write_run_json(store / "a" / "done", RunMeta(name="done", world_size=2))
    write_run_json(
        store / "b" / "broke",
        RunMeta(name="broke", world_size=2, status="incomplete", reason="rank 1 died"),
    )
    job = Job(store / LIVE)
    write_schedule(store / LIVE, WindowSchedule(every=0, wait=0, warmup=1, active=1))
    job.step(16)
    _publish(store / LIVE, 10, 11, (0, 1))
    _publish(store / LIVE, 14, 15, (0,))
    monkeypatch.setenv("FSOBS_STORE", str(store))
    yield store, job
    job.abandon()


def _open(page: str = "runs", **query: str) -> AppTest:
    return open_page(page, timeout=30, **query)


def _windows(at: AppTest) -> pd.DataFrame:
    """The Live page's table of windows (its dataframes have no key in AppTest)."""
    return next(d.value for d in at.dataframe if "window" in d.value.columns)


def _titles(at: AppTest) -> list[str]:
    specs = [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]
    return [s["layout"]["template"]["layout"]["title"]["text"] for s in specs]


def test_the_store_lists_a_live_run_once_without_its_windows(live_store: tuple[Path, Job]) -> None:
    store, _ = live_store
    entries = {e.run_id: e for e in list_runs(store)}
    assert list(entries) == ["a/done", "b/broke", LIVE]  # not z/live/windows/w00000010
    assert entries[LIVE].live and entries[LIVE].unfinished
    assert not entries["b/broke"].live and not entries["a/done"].live


def test_runs_page_lists_running_runs_first_and_does_not_parse_them(
    live_store: tuple[Path, Job],
) -> None:
    at = _open("runs")
    table = at.dataframe[0].value
    assert list(table["run"]) == [LIVE, "b/broke", "a/done"]
    assert list(table["status"]) == ["running", "stopped", "complete"]
    assert list(table["why stopped"]) == ["", "rank 1 died", ""]
    assert table["problem"].iloc[0] == "running: open it on the Live page"
    links = {link.proto.label: link.proto.query_string for link in at.get("page_link")}
    assert links[LIVE] == f"run={LIVE.replace('/', '%2F')}"
    assert "1 run(s) running" in [c.value for c in at.caption]


def test_bubbles_page_of_a_running_run_points_to_the_live_page(
    live_store: tuple[Path, Job],
) -> None:
    at = _open("bubbles", run=LIVE)
    assert not at.error and not at.get("plotly_chart")
    assert "is a live run, not finished" in at.info[0].value
    assert "Open it live" in [link.proto.label for link in at.get("page_link")]


def test_live_page_follows_the_run_from_running_to_stopped(live_store: tuple[Path, Job]) -> None:
    store, job = live_store
    at = _open("live")
    assert at.selectbox(key="run").value == LIVE  # running runs first: the default
    assert at.success[0].value.startswith("Running: step 15, 2 ranks, a sidecar grew ")
    titles = _titles(at)
    assert "<b>Step time (steps 0-15 read)</b>" in titles
    assert "<b>Bubble ratio per window (1 of 2 closed)</b>" in titles
    assert "<b>Bubble classes per window (1 closed)</b>" in titles
    assert any(t.startswith("<b>Imbalance per step") for t in titles)
    windows = _windows(at)
    assert list(windows["state"]) == ["closed", "pending"]
    assert windows["note"].iloc[1] == "waiting for rank(s) 1"
    window = analyze_path(window_dir(store / LIVE, 10))  # the indexer completed it into a run
    assert windows["bubble ratio"].iloc[0] == pytest.approx(window.summary["bubble_ratio"], 1e-3)
    specs = [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]
    assert {s["layout"]["uirevision"] for s in specs} == {LIVE}  # zoom kept across refreshes
    reader = at.session_state["live_runs"][str(store / LIVE)]

    at.selectbox(key="live_every").set_value("30 s")
    job.step(2)
    at.run()
    assert at.success[0].value.startswith("Running: step 17,")
    assert "<b>Step time (steps 0-17 read)</b>" in _titles(at)
    assert list(_windows(at)["state"]) == ["closed", "missing"]
    missing = "window_missing: window missing: w00000014 (steps 14-15): rank 1 did not publish it"
    assert [e.value for e in at.error] == [escape_markdown(missing)]  # the firing alert, first
    assert at.session_state["live_runs"][str(store / LIVE)] is reader  # one reader per run
    assert at.selectbox(key="live_every").value == "30 s"

    mark_incomplete(store / LIVE, "rank 1 killed: [SIGKILL](http://x) *now*", [0])
    at.run()
    assert not at.success
    warning = at.warning[0].value
    assert warning.startswith("Stopped ") and " ago. Reason: " in warning
    assert warning.endswith(escape_markdown("rank 1 killed: [SIGKILL](http://x) *now*"))
    assert not at.button  # no capture for a run that is not running


def test_a_job_whose_sidecars_stopped_growing_is_stopped_on_both_pages(
    live_store: tuple[Path, Job],
) -> None:
    """A job killed without a launcher to say so: its sidecars stop growing."""
    store, _ = live_store
    then = time.time() - 10 * 60
    for sidecar in (store / LIVE).glob("steps.rank*.jsonl.partial"):
        os.utime(sidecar, (then, then))
    table = _open("runs").dataframe[0].value.set_index("run")
    assert table.loc[LIVE, "status"] == "stopped"
    reason = "no step recorded for 10 min (the job may have died)"
    assert table.loc[LIVE, "why stopped"] == reason
    at = _open("live", run=LIVE)
    assert [w.value for w in at.warning] == [
        f"Stopped 10 min ago. Reason: {escape_markdown(reason)}"
    ]


def test_capture_from_the_live_page_writes_the_request(live_store: tuple[Path, Job]) -> None:
    store, _ = live_store
    at = _open("live", run=LIVE)
    at.number_input(key="live_capture_steps").set_value(7)
    at.run()
    at.button(key="live_capture").click().run()
    assert not at.exception
    request_file = json.loads((store / LIVE / CAPTURE_JSON).read_text())
    assert request_file["steps"] == 7
    first = request_file["start_step"]
    assert first > 15  # past the job's progress
    assert [s.value for s in at.success][-1] == escape_markdown(
        f"Capture {request_file['id']} requested: steps {first}-{first + 6} will be recorded, "
        f"in windows/w{first:08d}"
    )
    assert (
        f"Latest request: steps {first}-{first + 6} ({request_file['id']}): "
        in [t.value for t in at.text][-1]
    )
    at.button(key="live_capture").click().run()  # a second one while the first is pending
    refused = escape_markdown(f"Capture refused: {LIVE}: capture ")
    errors = [e.value for e in at.error if e.value.startswith(refused)]
    assert len(errors) == 1 and "still pending" in errors[0]
    assert json.loads((store / LIVE / CAPTURE_JSON).read_text()) == request_file


def test_a_capture_of_a_stopped_run_is_refused_in_one_line(live_store: tuple[Path, Job]) -> None:
    store, _ = live_store
    mark_incomplete(store / LIVE, "rank 1 killed", [0])
    done, message = request(store, store / LIVE, 5)
    assert not done
    assert (
        message
        == f"Capture refused: {LIVE}: the run has stopped (rank 1 killed): nothing to capture"
    )
    assert not (store / LIVE / CAPTURE_JSON).exists()


def test_a_live_run_with_a_broken_run_json_is_unknown_and_said_so(
    live_store: tuple[Path, Job],
) -> None:
    store, _ = live_store
    (store / LIVE / "run.json").write_text("{")
    table = _open("runs").dataframe[0].value.set_index("run")
    assert table.loc[LIVE, "status"] == "unknown"
    assert "not valid JSON" in str(table.loc[LIVE, "why stopped"])
    at = _open("live", run=LIVE)
    error = at.error[0].value
    assert len(at.error) == 1 and error.startswith("Cannot read the run\\: ")
    assert escape_markdown(f"{LIVE}/run.json") in error and str(store) not in error
    assert not at.get("plotly_chart")


def test_live_page_on_a_url_store_says_so_and_offers_nothing(
    live_store: tuple[Path, Job], monkeypatch: pytest.MonkeyPatch
) -> None:
    """LiveRun reads local files: a URL store has no live view (and no capture)."""
    monkeypatch.setenv("FSOBS_STORE", "memory://no-live-here")
    at = _open("live", run=LIVE)
    assert [i.value for i in at.info] == [
        "This run store is a URL: live views read a local store only."
    ]
    assert not at.button and not at.get("plotly_chart") and not at.selectbox


def test_live_page_of_a_read_only_store_shows_the_run_and_offers_no_capture(
    live_store: tuple[Path, Job], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fsobs dashboard --read-only``: the run is shown, a capture cannot be requested."""
    monkeypatch.setenv("FSOBS_READ_ONLY", "1")
    at = _open("live", run=LIVE)
    assert at.get("plotly_chart") and not at.button and not at.number_input
    assert "capture requests are off" in " ".join(c.value for c in at.caption)


def test_escape_markdown_leaves_no_markup() -> None:
    text = "**b** [l](u) `c` $x$ :red[r] <i>h</i> &amp;\n  next"
    escaped = escape_markdown(text)
    assert escaped == (r"\*\*b\*\* \[l\]\(u\) \`c\` \$x\$ \:red\[r\] \<i\>h\</i\> \&amp; next")


def test_live_page_names_an_unknown_run_and_shows_nothing_else(
    live_store: tuple[Path, Job],
) -> None:
    at = _open("live", run="../z/live")
    assert [e.value for e in at.error] == ["No run `../z/live` in the store (run= in the URL)."]
    assert not at.get("plotly_chart") and not at.success and not at.button
