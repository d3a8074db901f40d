"""Faults during ``fsobs run`` (issue 25, points 1 and 7), on the real reference job: torchrun,
2 gloo ranks, a few steps of the tiny model.

- a second run into a stored run is refused, and the stored run is left as it was;
- SIGINT / SIGTERM to the launcher stop torchrun and every rank, mark the run incomplete and
  print one line;
- a rank killed with SIGKILL: the run keeps the profiling windows every rank finished, and the
  message says which steps can be analyzed;
- a full disk (a real one: a 1 MiB tmpfs, mounted in a user and mount namespace of its own,
  ``unshare -rm``; skipped where the system does not allow those): no temporary file is left,
  ``run.json`` says why the run is incomplete.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fsobs
from fsobs.cli import main
from fsobs.cli.run import what_can_be_analyzed
from fsobs.collect.profiler import ProfilerConfig
from fsobs.live.state import LiveRun
from fsobs.workload.config import JobConfig, ModelSpec, data_config_for, job_profiler
from fsobs.workload.launch import LaunchConfig, failure_report, launch
from fsobs.workload.train import FAIL_ENV

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
BATCH = 8
TINY = ["--model-size", "tiny", "--batch-size", str(BATCH), "--world-size", "2"]
WAIT_S = 180.0


def _tiny_job(steps: int, **fields: object) -> JobConfig:
    model = ModelSpec(size="tiny")
    fields.setdefault("profiler", job_profiler(steps))
    return JobConfig(
        steps=steps, batch_size=BATCH, model=model, data=data_config_for(model.config()), **fields
    )


def _snapshot(root: Path) -> dict[Path, bytes]:
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _leftovers(out: Path) -> list[str]:
    """Temporary and partial files in a run directory."""
    return sorted(p.name for p in out.iterdir() if p.name.startswith(".") or ".partial" in p.name)


def test_a_second_run_into_a_stored_run_is_refused(tmp_path, capsys):
    """The hole of issue 25: a --no-profile run (no trace) was run into again, its run.json
    rewritten and its logs deleted."""
    out = tmp_path / "run"
    argv = ["run", *TINY, "--steps", "3", "--no-profile", "--out", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    stored = _snapshot(out)
    assert {Path("run.json"), Path("job.json"), Path("logs/rank0.log")} <= set(stored)
    assert main(["run", *TINY, "--steps", "4", "--no-profile", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"fsobs: error: {out}: already holds job.json, logs, run.json, steps.rank0.jsonl, "
        "steps.rank1.jsonl; a run is written into a new or empty folder only\n"
    )
    assert _snapshot(out) == stored


def _run_processes(out: Path) -> list[int]:
    """Live processes (not zombies) whose command line names ``out``: torchrun and the ranks."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(out) in cmdline and state != "Z":
            found.append(int(proc.name))
    return found


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_launcher_stops_torchrun_and_every_rank(tmp_path, sig):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "fsobs.cli", "run", *TINY, "--steps", "500", "--out", str(out)]
    launcher = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # not ignored
    )
    try:
        _wait_for(lambda: _lines(out / "steps.rank1.jsonl.partial") >= 2, "two steps")
        job = _run_processes(out)
        assert len(job) >= 4, job  # the launcher, torchrun and its two ranks
        launcher.send_signal(sig)
        stdout, stderr = launcher.communicate(timeout=WAIT_S)
    finally:
        launcher.kill()
    assert launcher.returncode == 128 + sig
    assert stdout == ""
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr
    assert lines[0].startswith("fsobs run: 2 rank(s) on this node")
    assert lines[1].startswith("fsobs run: stopped")  # the progress bar's last state
    assert lines[2:] == [
        f"fsobs: error: {out}: stopped by {sig.name}; torchrun and every rank stopped, the run "
        "is marked incomplete; nothing can be analyzed (no rank left a trace)"
    ]
    assert _run_processes(out) == []
    meta = json.loads((out / "run.json").read_text())
    assert (meta["status"], meta["reason"]) == ("incomplete", f"stopped by {sig.name} to fsobs run")
    assert meta["ranks_present"] == []
    assert _leftovers(out) == []
    for rank in (0, 1):  # the steps every rank finished, published
        assert _lines(out / f"steps.rank{rank}.jsonl") >= 1


def test_a_killed_rank_leaves_the_windows_every_rank_finished(tmp_path):
    """Windows of two steps (wait 1, warm-up 1): steps 2-3, 6-7, 10-11. Rank 1 is killed with
    SIGKILL at the start of step 9: both ranks have written the windows 2-3 and 6-7 (rank 1 did
    step 8, whose collectives need rank 0, after rank 0 wrote its window at the end of step 7)."""
    out = tmp_path / "run"
    windows = ProfilerConfig(active=2, repeat=3, record_shapes=False)
    config = LaunchConfig(
        world_size=2, out=out, job=_tiny_job(12, profiler=windows), env={FAIL_ENV: "1:9:KILL"}
    )
    code = launch(config, progress=False)
    assert code > 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "incomplete" and meta["ranks_present"] == [0, 1]
    # rank 0 may note the broken connection; torchrun saw rank 1 exit first
    assert meta["reason"] == f"torchrun exited with code {code}; rank 1 failed first (exit code -9)"
    assert failure_report(out).startswith("rank 1 failed first (exit code -9)")
    assert _leftovers(out) == []
    run = fsobs.load_run(out)
    assert run.rank_ids == [0, 1]
    assert [run[r].steps for r in (0, 1)] == [[2, 3, 6, 7], [2, 3, 6, 7]]
    assert sorted(run.sidecar.loc[run.sidecar["rank"] == 1, "step"]) == list(range(9))
    assert set(fsobs.analyze_path(out).steps["step"]) == {2, 3, 6, 7}
    assert what_can_be_analyzed(out) == f"fsobs analyze {out} reads steps 2-3, 6-7 of rank(s) 0, 1"


def test_fsobs_run_in_windows_keeps_the_first_window_of_a_killed_job(tmp_path, capsys):
    """``fsobs run --steps 8 --profile-window 2``: live windows 2-3 and 6-7. Rank 1 is killed
    with SIGKILL at the start of step 5, after its step 4, whose collectives need rank 0 past
    the end of step 3, where rank 0 published its first window: every rank's first window is
    on disk, the run is stopped for a live view (with the launcher's reason), its first window
    closed and analyzable as a run of its own."""
    out = tmp_path / "run"
    cmd = [*TINY, "--steps", "8", "--profile-window", "2", "--out", str(out)]
    env = os.environ | {FAIL_ENV: "1:5:KILL"}
    done = subprocess.run(
        [sys.executable, "-m", "fsobs.cli", "run", *cmd],
        capture_output=True,
        text=True,
        env=env,
        timeout=WAIT_S,
    )
    assert done.returncode == 1, done.stderr
    first = out / "windows" / "w00000002"
    assert (
        f"the run is marked incomplete; fsobs watch {out} --once lists its 1 published window(s) "
        f"(steps 2-3); fsobs analyze {first} reads the last\n"
    ) in done.stderr
    assert sorted(p.name for p in first.glob("rank*.trace.json.gz")) == [
        "rank0.trace.json.gz",
        "rank1.trace.json.gz",
    ]
    assert not list(out.glob("rank*.trace.json.gz"))  # live windows only
    meta = json.loads((out / "run.json").read_text())
    assert (meta["status"], meta["ranks_present"]) == ("incomplete", [0, 1])
    assert meta["reason"].endswith("rank 1 failed first (exit code -9)"), meta["reason"]
    assert meta["workload"]["profiler"]["every"] == 4
    assert _leftovers(out) == []
    state = LiveRun(out).poll()
    assert (state.status, state.reason) == ("stopped", meta["reason"])
    assert state.step == 4  # both ranks ended step 4 (rank 0 was stopped in step 5)
    assert [(w.wid, w.state, w.published) for w in state.windows] == [
        ("w00000002", "closed", (0, 1))
    ]  # 6-7 was never reached: no window, not a missing one
    assert state.windows[0].summary is not None and state.windows[0].summary.num_steps == 2
    assert main(["analyze", "--json", str(first)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["run"]["steps"] == [2, 3]
    assert sorted({(row["rank"], row["step"]) for row in report["steps"]}) == [
        (0, 2), (0, 3), (1, 2), (1, 3)
    ]  # fmt: skip


def _namespaces_allowed() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    return probe.returncode == 0


DISK = "1m"
"""The tmpfs: room for the job's config, logs, sidecars and run.json, not for a trace."""
_IN_NAMESPACE = """
import json, shutil, sys
from pathlib import Path
from fsobs.cli import main
disk, report = Path(sys.argv[1]), Path(sys.argv[2])
code = main(["run", *sys.argv[3:], "--out", str(disk / "run")])
run = disk / "run"
report.write_text(json.dumps({
    "code": code,
    "files": sorted(p.name for p in run.iterdir()),
    "run_json": json.loads((run / "run.json").read_text()),
    "free": shutil.disk_usage(disk).free,
}))
"""


@pytest.mark.skipif(not _namespaces_allowed(), reason="no user and mount namespaces here")
def test_a_full_disk_leaves_no_temporary_and_says_why(tmp_path):
    disk, report = tmp_path / "disk", tmp_path / "report.json"
    disk.mkdir()
    flags = [*TINY, "--steps", "6"]
    script = (
        f"mount -t tmpfs -o size={DISK} tmpfs {disk} && "
        f'exec "$0" -c "$1" {disk} {report} {" ".join(flags)}'
    )
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, sys.executable, _IN_NAMESPACE],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(report.read_text())
    assert result["code"] == 1
    error = next(line for line in done.stderr.splitlines() if line.startswith("fsobs: error:"))
    assert error == (
        f"fsobs: error: {disk / 'run'}: the job failed (torchrun exit code 1); the run is marked "
        "incomplete; nothing can be analyzed (no rank left a trace)"
    )
    assert "Traceback" not in done.stderr.split("fsobs: error:")[0]  # before the rank's log tail
    assert [f for f in result["files"] if f.startswith(".") or ".partial" in f] == []
    assert result["free"] > 2**19  # the disk is not left full (the others take ~20 KB)
    meta = result["run_json"]
    assert meta["status"] == "incomplete" and meta["ranks_present"] == []
    assert meta["reason"].startswith("torchrun exited with code 1; rank ")
    assert "the profiler could not write the window" in meta["reason"]
    assert "MiB free on the disk" in meta["reason"]


_PROFILE_ON_FULL_DISK = """
import json, os, sys, torch
from pathlib import Path
from fsobs.collect import ProfilerConfig, StepProfiler
disk, report = Path(sys.argv[1]), Path(sys.argv[2])
error = None
try:
    with StepProfiler(disk, 0, ProfilerConfig(wait=0, warmup=1, active=3)) as prof:
        a = torch.ones(16, 16)
        for _ in range(4):
            for _ in range(100):
                a = torch.tanh(a @ a)
            prof.step()
except OSError as exc:
    error = str(exc)
st = os.statvfs(disk)
report.write_text(json.dumps({"error": error, "files": os.listdir(disk),
                              "free": st.f_bfree, "blocks": st.f_blocks}))
"""


@pytest.mark.skipif(not _namespaces_allowed(), reason="no user and mount namespaces here")
def test_a_full_disk_fails_the_export_and_frees_the_space_at_once(tmp_path):
    """Kineto writes ``<name>.tmp``, fails, keeps it open and leaves it: the profiler removes it
    and frees its space while the process still runs (the training goes on)."""
    disk, report = tmp_path / "disk", tmp_path / "report.json"
    disk.mkdir()
    script = f'mount -t tmpfs -o size=64k tmpfs {disk} && exec "$0" -c "$1" {disk} {report}'
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, sys.executable, _PROFILE_ON_FULL_DISK],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(report.read_text())
    assert result["error"].startswith(
        f"{disk / 'rank0.trace.json.gz'}: the profiler could not write the window ("
    )
    assert result["files"] == []
    assert result["free"] == result["blocks"]  # 64 KiB free again
