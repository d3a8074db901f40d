"""``fsobs watch``: the terminal view on hand-built states, the ``--once --json`` object, the
live loop, and the command line's one-line refusals."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from fsobs.cli import live as cli_live
from fsobs.cli import main
from fsobs.live.alerts import RULES, AlertConfig
from fsobs.live.model import (
    Alert,
    LateRank,
    LiveState,
    RankProgress,
    WindowEntry,
    WindowSummary,
    ago,
)
from fsobs.live.state import LiveConfig, LiveRun
from fsobs.live.view import render, watch
from fsobs.runformat import RunMeta, SidecarWriter, StepRecord, write_run_json
from fsobs.runformat.windows import WindowSchedule, read_capture, write_schedule


def rank(r: int, **fields) -> RankProgress:
    values = dict(
        rank=r,
        num_steps=120,
        last_step=119,
        step_ms=250.0,
        last_ms=260.0,
        est_cost=1.5e7,
        gc_ms=3.0,
        idle_s=0.5,
        closed=False,
    )
    return RankProgress(**(values | fields))


def summary(**fields) -> WindowSummary:
    values = dict(
        num_steps=10,
        step_ms=250.0,
        bubble_ratio=0.125,
        bubble_ms_per_step=31.25,
        classes_ms_per_step={
            "straggler_wait": 20.0,
            "exposed_comm": 11.25,
            "unattributed_comm": 0.0,
            "host_idle": 0.0,
            "other": 0.0,
        },
        straggler=1,
        straggler_wait_ms_per_step=20.0,
        late_steps={1: 8, 0: 2},
        causes={"data": 0.75, "unexplained": 0.25},
        imbalance_before=1.4,
        imbalance_after=1.05,
        analyzed_ns=1_790_000_000_000_000_000,
    )
    return WindowSummary(**(values | fields))


def window(first: int, state: str = "closed", **fields) -> WindowEntry:
    values = dict(
        wid=f"w{first:08d}",
        first_step=first,
        last_step=first + 9,
        trigger="schedule",
        request=None,
        state=state,
        published=(0, 1),
        summary=summary() if state == "closed" else None,
    )
    return WindowEntry(**(values | fields))


def alerts(*firing: str) -> tuple[Alert, ...]:
    return tuple(
        Alert(name=n, firing=n in firing, message=f"{n} message" if n in firing else "quiet")
        for n in RULES
    )


def live_state(**fields) -> LiveState:
    """A 2-rank run at step 119: two closed windows, one pending (rank 1 has not published)."""
    values = dict(
        run="out/live-0",
        name="live",
        status="running",
        reason=None,
        idle_s=0.5,
        world_size=2,
        step=119,
        ranks=(rank(0), rank(1, step_ms=310.0)),
        imbalance_before=1.4,
        imbalance_after=1.05,
        late_rank=LateRank(rank=1, share=0.8, cause="data"),
        windows=(window(50), window(100), window(110, "pending", published=(0,))),
        alerts=alerts(),
        capture=None,
        polled_ns=1_790_000_000_000_000_000,
    )
    return LiveState(**(values | fields))


def text(state: LiveState) -> str:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(render(state))
    return console.file.getvalue()


def rows(shown: str, first: str) -> list[str]:
    """The table lines of ``shown`` that start (after the border) with ``first``."""
    return [line for line in shown.splitlines() if line.strip("│ ").startswith(first)]


def cells(row: str) -> list[str]:
    return [c.strip() for c in row.split("│")[1:-1]]


# ---- render ----
def test_header_of_a_running_run():
    shown = text(live_state())
    assert "out/live-0 (live) · running" in shown
    assert "step 119 (ended on every rank) · 2 ranks" in shown
    assert "stopped" not in shown


def test_a_stopped_run_says_how_long_ago_and_why():
    state = live_state(status="stopped", idle_s=200.0, reason="no sidecar grew for 200 s")
    # 200 s = 3 min 20 s, said in whole minutes
    assert "· stopped 3 min ago: no sidecar grew for 200 s" in text(state)


def test_ago():
    assert [ago(45), ago(59.4), ago(60), ago(200), ago(2 * 3600 + 5 * 60 + 30)] == [
        "45 s",
        "59 s",
        "1 min",
        "3 min",
        "2 h 5 min",
    ]
    assert ago(math.inf) == "-"


def test_a_run_no_sidecar_of_which_was_seen_is_stopped_without_a_time():
    state = live_state(
        status="stopped",
        idle_s=math.inf,
        reason="no step recorded for no sidecar yet",
        ranks=(rank(0, idle_s=math.inf, num_steps=0, last_step=None, step_ms=None),),
    )
    shown = text(state)
    assert "· stopped: no step recorded" in shown
    (row,) = rows(shown, "0 ")
    assert cells(row)[1:4] + cells(row)[-1:] == ["0", "-", "-", "-"]


def test_rank_table():
    shown = text(live_state(ranks=(rank(0), rank(1, gc_ms=None, est_cost=None, closed=True))))
    (row0,) = rows(shown, "0 ")
    assert cells(row0) == ["0", "120", "119", "250.0", "260.0", "1.5e+07", "3.0", "0 s"]
    (row1,) = rows(shown, "1 ")
    assert cells(row1)[3:] == ["250.0", "260.0", "-", "-", "closed"]


def test_balance_and_late_rank():
    shown = text(live_state())
    assert "split imbalance (max/mean est. cost): 1.40 random → 1.05 used" in shown
    assert "late rank: rank 1 in 80% of recent straggler steps, cause: data" in shown
    bare = text(live_state(imbalance_before=None, imbalance_after=None, late_rank=None))
    assert "split imbalance: - (the sidecars have no balance fields)" in bare
    assert "late rank: none in the recent closed windows" in bare


def test_closed_windows_show_their_numbers():
    shown = text(live_state())
    (row,) = rows(shown, "w00000100")
    # bubble 0.125 = 12.5 %, classes by ms/step, zero classes left out; straggler 1 waits 20 ms
    assert cells(row) == [
        "w00000100",
        "100–109",
        "schedule",
        "12.5%",
        "straggler_wait 20.0, exposed_comm 11.2",
        "rank 1 (20.0 ms)",
    ]


def test_a_pending_window_is_shown_as_pending_not_as_a_smaller_run():
    # even a pending entry carrying some summary must not show numbers
    pending = window(110, "pending", published=(0,), summary=summary(bubble_ratio=0.5))
    shown = text(live_state(windows=(window(100), pending)))
    (row,) = rows(shown, "w00000110")
    assert cells(row) == [
        "w00000110",
        "110–119",
        "schedule",
        "pending",
        "published by ranks 0 of 2",
        "",
    ]
    assert "50.0%" not in shown


def test_missing_and_bad_windows_say_why():
    missing = window(
        120, "missing", trigger="capture", request="c1-abc", published=(0,), missed={1: "late"}
    )
    bad = window(130, "bad", error="rank1.trace.json.gz: truncated")
    shown = text(live_state(windows=(missing, bad)))
    (m,) = rows(shown, "w00000120")
    assert cells(m)[2:5] == ["capture", "missing", "rank 1: late"]
    (b,) = rows(shown, "w00000130")
    assert cells(b)[3:5] == ["bad", "rank1.trace.json.gz: truncated"]


def test_only_the_latest_windows_are_shown():
    windows = tuple(window(10 * i) for i in range(1, 13))
    shown = text(live_state(windows=windows))
    wids = [w for w in (f"w{10 * i:08d}" for i in range(1, 13)) if w in shown]
    assert wids == [f"w{10 * i:08d}" for i in range(5, 13)]  # the last 8 of 12


def test_firing_alerts_are_listed_the_others_counted():
    quiet = text(live_state())
    assert f"alerts: none firing ({len(RULES)} rules)" in quiet
    shown = text(live_state(alerts=alerts("late_rank", "gc_storm")))
    assert "alerts: 2 firing" in shown
    assert "  late_rank: late_rank message" in shown
    assert "  gc_storm: gc_storm message" in shown
    assert "bubble_ratio_up" not in shown


def test_capture_line():
    capture = {"id": "c1-abc", "start_step": 200, "steps": 5, "window": None, "state": "planned"}
    assert "capture c1-abc: steps 200–204, planned (no window yet)" in text(
        live_state(capture=capture)
    )
    bad = {"error": "capture.json: bad capture request"}
    assert "capture: capture.json: bad capture request" in text(live_state(capture=bad))


# ---- the JSON object ----
def test_json_object_fields():
    state = live_state(windows=(window(100), window(110, "pending", published=(0,))))
    out = json.loads(json.dumps(state.to_json(), allow_nan=False))
    assert out["status"] == "running"
    assert [(w["wid"], w["trigger"], w["state"]) for w in out["windows"]] == [
        ("w00000100", "schedule", "closed"),
        ("w00000110", "schedule", "pending"),
    ]
    assert out["windows"][0]["summary"]["late_steps"] == {"1": 8, "0": 2}
    assert out["windows"][1]["summary"] is None
    assert [(a["name"], a["firing"]) for a in out["alerts"]] == [(n, False) for n in RULES]


# ---- the loop ----
class Polls:
    """A run whose polls return the given states in turn."""

    def __init__(self, *states: LiveState) -> None:
        self.states = list(states)
        self.num_polls = 0

    def poll(self) -> LiveState:
        self.num_polls += 1
        return self.states.pop(0)


def test_watch_returns_once_the_run_completes_and_hands_on_every_state():
    running = live_state()
    done = replace(running, status="complete", step=199)
    polls = Polls(running, running, done, running)
    seen: list[LiveState] = []
    console = Console(file=io.StringIO(), width=200, color_system=None)
    last = watch(polls, console, 0.0, on_poll=seen.append)
    assert last is done
    assert polls.num_polls == 3  # the fourth state is never asked for
    assert seen == [running, running, done]
    assert "complete" in console.file.getvalue()


def test_watch_stops_on_a_stopped_run():
    stopped = live_state(status="stopped", idle_s=90.0, reason="no sidecar grew for 90 s")
    console = Console(file=io.StringIO(), width=200, color_system=None)
    assert watch(Polls(stopped), console, 0.0).status == "stopped"
    assert "stopped 1 min ago" in console.file.getvalue()


# ---- the command line ----
def one_line_error(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith("fsobs: error: ")
    return line


def test_watch_refuses_an_unknown_run_in_one_line(capsys, tmp_path):
    missing = tmp_path / "nope"
    line = one_line_error(capsys, "watch", str(missing), "--once")
    assert line.startswith(f"fsobs: error: {missing}: no such run folder")
    line = one_line_error(capsys, "watch", str(tmp_path), "--once", "--json")
    assert line.startswith(f"fsobs: error: {tmp_path}: no run here")


def test_watch_refuses_flags_that_do_not_go_together(capsys, tmp_path):
    assert "--json goes with --once" in one_line_error(capsys, "watch", str(tmp_path), "--json")
    line = one_line_error(capsys, "watch", str(tmp_path), "--once", "--prometheus", "0")
    assert "leave out --once" in line


def test_capture_refuses_an_unknown_run_in_one_line(capsys, tmp_path):
    line = one_line_error(capsys, "capture", str(tmp_path / "nope"), "--steps", "3")
    assert str(tmp_path / "nope") in line


T0_NS = 1_790_000_000_000_000_000


def step_record(step: int) -> StepRecord:
    """Step ``step`` of 100 ms, the steps one after another from ``T0_NS``."""
    start = T0_NS + step * 100_000_000
    return StepRecord.of(step, [10, 20], 30.0, start, start + 100_000_000)


@pytest.fixture
def running(tmp_path):
    """A run as a job leaves it while it trains: run.json incomplete ("running"), each of
    its 2 ranks' sidecars open (``.partial``) with steps 0, 1, 2; the run dir and writers."""
    meta = RunMeta(name="live", world_size=2, status="incomplete", reason="running")
    write_run_json(tmp_path, meta)
    with contextlib.ExitStack() as stack:
        writers = [stack.enter_context(SidecarWriter(tmp_path, r)) for r in range(2)]
        for writer in writers:
            for step in range(3):
                writer.write(step_record(step))
        yield tmp_path, writers


def watch_json(capsys, run_dir: Path, *flags: str) -> dict:
    assert main(["watch", str(run_dir), "--once", "--json", *flags]) == 0
    out = capsys.readouterr().out
    return json.loads(out, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))


def test_watch_once_json_follows_run_json(capsys, running):
    run, _ = running
    out = watch_json(capsys, run)
    assert (out["status"], out["world_size"], out["step"]) == ("running", 2, 2)
    assert [r["rank"] for r in out["ranks"]] == [0, 1]
    assert out["ranks"][0]["last_ms"] == 100.0
    write_run_json(run, RunMeta(name="live", world_size=2))  # the job's end: complete
    assert watch_json(capsys, run)["status"] == "complete"


def test_ctrl_c_ends_the_view_quietly(capsys, running, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_live, "watch", interrupted)
    assert main(["watch", str(running[0]), "--interval", "0.01"]) == 0
    assert capsys.readouterr() == ("", "")


def test_prometheus_without_prometheus_client_says_what_to_install(capsys, running, monkeypatch):
    monkeypatch.setitem(sys.modules, "fsobs.live.metrics", None)  # import fails
    line = one_line_error(capsys, "watch", str(running[0]), "--prometheus", "0")
    assert line.endswith("pip install 'freescale[live]'")


def test_watch_once_says_a_run_whose_sidecars_stopped_growing_stopped(capsys, running):
    run, writers = running
    past = time.time() - 200  # 200 s ago: past the default 120 s of 3 steps of 100 ms
    for writer in writers:
        os.utime(writer.partial_path, (past, past))
    assert main(["watch", str(run), "--once"]) == 0
    assert "· stopped 3 min ago" in capsys.readouterr().out
    assert watch_json(capsys, run)["status"] == "stopped"
    assert watch_json(capsys, run, "--stale-after", "300")["status"] == "running"


def test_capture_says_which_steps_and_where(capsys, running):
    run, _ = running
    # a window of steps 31-35 every 40 steps (30 idle, 1 warm-up step)
    write_schedule(run, WindowSchedule(every=40, wait=30, warmup=1, active=5))
    assert main(["capture", str(run), "--steps", "5"]) == 0
    request = read_capture(run)
    # last step 2; 3 s of lead at 100 ms a step = 30 steps: asked from step 2 + 1 + 30 = 33
    assert (request.start_step, request.steps) == (33, 5)
    # 33 (warm-up 32) falls in the scheduled 31-35: the ranks record 35 + 1 + 1 = 37 .. 41
    window = run / "windows" / "w00000037"
    assert capsys.readouterr().out == (
        f"capture {request.id}: steps 37-41 will be recorded; the window will appear in {window}\n"
    )


def test_capture_refuses_a_complete_or_stopped_run_in_one_line(capsys, running):
    run, _ = running
    write_run_json(run, RunMeta(world_size=2))
    assert "complete" in one_line_error(capsys, "capture", str(run), "--steps", "3")
    write_run_json(run, RunMeta(world_size=2, status="incomplete", reason="rank 1 died"))
    assert "stopped (rank 1 died)" in one_line_error(capsys, "capture", str(run), "--steps", "3")
    assert not (run / "capture.json").exists()


def test_watch_flags_make_the_live_config(capsys, running, monkeypatch):
    seen: list[LiveConfig] = []

    class Spy(LiveRun):
        def __init__(self, run_dir, config):
            seen.append(config)
            super().__init__(run_dir, config)

    monkeypatch.setattr(cli_live, "LiveRun", Spy)
    flags = ("--alert-threshold", "2", "--alert-min-windows", "4", "--stale-after", "30")
    watch_json(capsys, running[0], *flags)
    alerts = AlertConfig(threshold=2.0, min_windows=4)
    assert seen == [LiveConfig(stale_after_s=30.0, alerts=alerts)]
    watch_json(capsys, running[0])
    assert seen[1] == LiveConfig()  # the flags' defaults are the configs'
