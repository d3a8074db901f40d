"""A real 2-rank ``fsobs run`` in live windows, watched while it runs (issue 34, point 8).

One job of 160 steps on 2 gloo ranks, a window of 2 recorded steps every 40 (2-3, 42-43, ...):
a watcher polls it the way ``fsobs watch`` does (:class:`~fsobs.live.state.LiveRun`); every
window must show closed within a few seconds of its last rank's note; a capture asked for
once the first window closed is recorded by both ranks on the same steps, the steps
``request_capture`` announced; at the end ``fsobs watch --once --json`` says complete with
every window and its trigger. (A rank killed mid-run: tests/integration/workload/test_faults.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from fsobs.cli import main
from fsobs.live.capture import request_capture
from fsobs.live.state import LiveConfig, LiveRun
from fsobs.runformat.windows import WindowSchedule, list_windows

STEPS, EVERY, WINDOW = 160, 40, 2
SHOWN_WITHIN_S = 5.0
"""How soon after its last note a closed window must show (polls every 0.25 s)."""
TIMEOUT_S = 240.0


def test_a_running_job_is_watched_and_captures_on_demand(tmp_path, capsys):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "fsobs.cli", "run", "--world-size", "2"]
    cmd += ["--model-size", "tiny", "--batch-size", "8", "--steps", str(STEPS)]
    cmd += ["--profile-window", str(WINDOW), "--profile-every", str(EVERY), "--out", str(out)]
    log = tmp_path / "job.log"
    with log.open("wb") as sink:
        job = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
    shown: dict[str, int] = {}  # window -> when a poll first showed it closed (ns)
    statuses: list[str] = []
    capture = None
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not (out / "run.json").exists():
            assert job.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        live = LiveRun(out, LiveConfig(stale_after_s=60))
        while True:
            state = live.poll()
            statuses.append(state.status)
            for window in state.closed_windows:
                shown.setdefault(window.wid, state.polled_ns)
            if capture is None and shown and state.step is not None and state.step < 60:
                capture = request_capture(out, 3, lead_s=1.0)
            if state.status != "running" or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        assert job.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        job.kill()
    assert statuses[0] == "running" and statuses[-1] == "complete"
    assert capture is not None, "the first window closed too late to ask for a capture"

    folders = {w.wid: w for w in list_windows(out)}
    # the scheduled windows, less one the capture overlaps (it gives way to the capture)
    schedule = WindowSchedule(every=EVERY, wait=1, warmup=1, active=WINDOW)
    taken = [(capture.first_step, capture.last_step)]
    scheduled = [
        f"w{first:08d}"
        for first, last in schedule.scheduled(0, STEPS - 1)
        if not schedule.gives_way((first, last), taken)
    ]
    assert set(scheduled) <= set(folders)
    # every window showed closed within a few seconds of its last rank's note
    for wid, folder in folders.items():
        published = max(note.closed_ns for note in folder.notes.values())
        assert wid in shown, f"{wid} never showed closed"
        assert (shown[wid] - published) / 1e9 < SHOWN_WITHIN_S, wid
    # the capture: both ranks recorded the steps request_capture announced, noted as a capture
    taken = folders[capture.window.name]
    assert sorted(taken.notes) == [0, 1]
    for note in taken.notes.values():
        assert (note.first_step, note.last_step) == (capture.first_step, capture.last_step)
        assert (note.trigger, note.request, note.missed) == ("capture", capture.request.id, None)
    assert capture.last_step - capture.first_step == 2
    assert not (set(range(capture.first_step, capture.last_step + 1)) & {2, 3})

    assert main(["watch", str(out), "--once", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "complete" and report["step"] == STEPS - 1
    listed = {w["wid"]: w for w in report["windows"]}
    assert set(listed) == set(folders)
    assert {w["state"] for w in listed.values()} == {"closed"}
    assert listed[capture.window.name]["trigger"] == "capture"
    assert {listed[wid]["trigger"] for wid in scheduled} == {"schedule"}
    assert listed[scheduled[0]]["summary"]["num_steps"] == WINDOW
    assert report["capture"]["state"] == "closed"
    assert {a["name"] for a in report["alerts"]} >= {"bubble_ratio_up", "window_missing"}
    # the run's own folder has no trace: analyze names a window to read instead
    assert main(["analyze", str(out)]) == 2
    assert f"a live run: its traces are in its {len(folders)} window(s)" in capsys.readouterr().err
    # each closed window is a run of its own now: its sidecar lines and run.json are there
    first = Path(folders[scheduled[0]].path)
    assert sorted(p.name for p in first.iterdir()) == [
        "rank0.trace.json.gz",
        "rank1.trace.json.gz",
        "run.json",
        "steps.rank0.jsonl",
        "steps.rank1.jsonl",
        "summary.json",
        "window.rank0.json",
        "window.rank1.json",
    ]
    lines = (first / "steps.rank1.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [2, 3]
