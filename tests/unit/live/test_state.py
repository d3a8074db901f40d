"""LiveRun on runs written by hand or by the simulator: the sidecars read as they grow, each
window's state, the index kept once, how a run is called running / stopped / complete."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from fsobs.analysis import analyze_path
from fsobs.live import sidecar_tail, state
from fsobs.live.sidecar_tail import SidecarTail
from fsobs.live.state import LiveConfig, LiveRun, run_status
from fsobs.runformat import RunMeta, StepRecord, write_run_json
from fsobs.runformat.names import sidecar_file_name
from fsobs.runformat.windows import WindowSchedule
from fsobs.simulate import SimConfig, SimWindows, simulate, write_run

# 2 ranks, 12 steps, a window of 3 steps every 4 after a warm-up step: 1-3, 5-7, 9-11
SIM = SimConfig(world_size=2, steps=12, seed=3, batch_per_rank=4)
LIVE = SimWindows(schedule=WindowSchedule(every=4, wait=0, warmup=1, active=3))


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("sim") / "run"
    write_run(simulate(SIM), run, workers=1, windows=LIVE)
    return run


def _copy(run: Path, to: Path) -> Path:
    shutil.copytree(run, to)
    return to


def _line(step: int, wall_ms: float = 10.0) -> bytes:
    record = StepRecord.of(
        step, [5, 7], 12.0, 10**9 + step * 10**8, 10**9 + step * 10**8 + int(wall_ms * 1e6)
    )
    return (record.to_line() + "\n").encode()


def test_the_tail_reads_whole_new_lines_and_follows_the_rename(tmp_path):
    tail = SidecarTail(tmp_path, 0)
    assert tail.read_new() == [] and tail.path is None
    partial = tmp_path / (sidecar_file_name(0) + ".partial")
    torn = _line(1)
    partial.write_bytes(_line(0) + torn[:20])
    assert [r.step for r in tail.read_new()] == [0]  # the torn line waits for its end
    with partial.open("ab") as handle:
        handle.write(torn[20:] + _line(2, wall_ms=25.0))
    rows = tail.read_new()
    assert [(r.step, r.wall_ms) for r in rows] == [(1, 10.0), (2, 25.0)]
    assert rows[0].values["est_cost"] == 12.0 and not tail.closed
    partial.rename(tmp_path / sidecar_file_name(0))  # published: the same bytes
    with (tmp_path / sidecar_file_name(0)).open("ab") as handle:
        handle.write(_line(3))
    assert [r.step for r in tail.read_new()] == [3] and tail.closed


def test_a_first_read_starts_near_the_end_and_a_window_is_found_by_bisection(tmp_path, monkeypatch):
    path = tmp_path / sidecar_file_name(1)
    path.write_bytes(b"".join(_line(s) for s in range(5000)))
    monkeypatch.setattr(sidecar_tail, "FIRST_READ_BYTES", 2000)
    tail = SidecarTail(tmp_path, 1)
    rows = tail.read_new()
    assert rows[-1].step == 4999 and 0 < len(rows) < 2000 // 100  # only the last lines
    assert rows == sorted(rows, key=lambda r: r.step) and rows[0].step == 5000 - len(rows)
    lines = tail.lines(1234, 1236)
    assert [json.loads(line)["step"] for line in lines] == [1234, 1235, 1236]
    assert [json.loads(line)["step"] for line in tail.lines(0, 1)] == [0, 1]


def test_every_window_of_a_finished_run_is_closed_and_analyzed_once(
    simulated, tmp_path, monkeypatch
):
    run = _copy(simulated, tmp_path / "run")
    live = LiveRun(run).poll()
    assert live.status == "complete" and live.step == 11
    assert [(w.wid, w.state, w.first_step, w.last_step) for w in live.windows] == [
        ("w00000001", "closed", 1, 3),
        ("w00000005", "closed", 5, 7),
        ("w00000009", "closed", 9, 11),
    ]
    folder = run / "windows" / "w00000005"
    # the window is a run of its own now, and its summary is its whole analysis
    alone = analyze_path(folder)
    summary = live.windows[1].summary
    assert summary is not None and summary.num_steps == 3
    assert summary.bubble_ratio == pytest.approx(alone.summary["bubble_ratio"])
    assert sorted(alone.run.sidecar["step"].unique()) == [5, 6, 7]
    # a second reader takes summary.json: nothing is analyzed again
    monkeypatch.setattr(state, "analyze_window", _must_not_run)
    again = LiveRun(run).poll()
    assert [w.summary for w in again.windows] == [w.summary for w in live.windows]


def _must_not_run(*args: object) -> None:
    raise AssertionError("analyzed again")


def test_a_window_is_pending_until_every_rank_publishes_then_missing(simulated, tmp_path):
    """Rank 1 has not published 9-11: pending while it is in step 12 (a rank publishes a
    window before it ends the step after it); missing once it is 2 steps past; a scheduled
    window no rank published (13-15) is missing too once every rank is 2 steps past it."""
    run = _copy(simulated, tmp_path / "run")
    meta = json.loads((run / "run.json").read_text())
    write_run_json(
        run, RunMeta(**{**_meta_fields(meta), "status": "incomplete", "reason": "running"})
    )
    for name in ("window.rank1.json", "rank1.trace.json.gz"):
        (run / "windows" / "w00000009" / name).unlink()
    sidecars = [run / sidecar_file_name(r) for r in (0, 1)]
    for path in sidecars:
        path.rename(path.with_name(path.name + ".partial"))
    live = LiveRun(run, LiveConfig(stale_after_s=600))
    first = live.poll()
    assert first.status == "running"
    assert [w.state for w in first.windows] == ["closed", "closed", "pending"]
    assert first.windows[2].published == (0,)
    for rank in (0, 1):
        with open(sidecars[rank].with_name(sidecars[rank].name + ".partial"), "ab") as h:
            h.write(b"".join(_line(s) for s in range(12, 18)))
    later = live.poll()
    assert [(w.wid, w.state, w.published) for w in later.windows] == [
        ("w00000001", "closed", (0, 1)),
        ("w00000005", "closed", (0, 1)),
        ("w00000009", "missing", (0,)),
        ("w00000013", "missing", ()),
    ]
    missing = next(a for a in later.alerts if a.name == "window_missing")
    assert missing.firing and "w00000009" in missing.message and "w00000013" in missing.message
    assert later.step == 17


def _meta_fields(meta: dict) -> dict:
    fields = set(RunMeta.__struct_fields__)
    out = {k: v for k, v in meta.items() if k in fields and k != "toggles"}
    out["hosts"] = tuple(out.get("hosts", ()))
    out["ranks_present"] = None
    return out


def test_a_run_whose_sidecars_stopped_growing_is_stopped_with_how_long_ago(tmp_path):
    write_run_json(tmp_path, RunMeta(name="r", world_size=1, status="incomplete", reason="running"))
    partial = tmp_path / (sidecar_file_name(0) + ".partial")
    partial.write_bytes(_line(0) + _line(1))
    assert run_status(tmp_path, stale_after_s=60) == ("running", None)
    old = partial.stat().st_mtime_ns - 200 * 10**9
    os.utime(partial, ns=(old, old))
    assert run_status(tmp_path, stale_after_s=60) == (  # 200 s: 3 min
        "stopped",
        "no step recorded for 3 min (the job may have died)",
    )
    write_run_json(
        tmp_path, RunMeta(name="r", world_size=1, status="incomplete", reason="rank 0 died")
    )
    assert run_status(tmp_path) == ("stopped", "rank 0 died")
