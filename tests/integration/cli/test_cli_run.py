"""``fsobs run``'s flags: a frozen set, and the JobConfig they build; the folders it refuses and
the signals it notes (no torchrun here: the real job runs in tests/integration/workload/test_run.py
and
tests/integration/workload/test_faults.py)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys

import pytest

from fsobs.cli import build_parser, main
from fsobs.cli.run import job_config
from fsobs.errors import LaunchError
from fsobs.workload.config import JobConfig, ModelSpec
from fsobs.workload.launch import LaunchConfig, _stop_signals, launch
from optim.config import PriorityConfig
from optim.plan import BalanceConfig

ALLOWED_OPTIONS = frozenset(
    {
        "-h",
        "--help",
        "-v",
        "--verbose",
        "--world-size",
        "--steps",
        "--out",
        "--preset",
        "--model-size",
        "--batch-size",
        "--num-samples",
        "--seed",
        "--item-popularity",
        "--threads-per-rank",
        "--no-profile",
        "--profile-window",
        "--profile-every",
        "--balance",
        "--balance-method",
        "--balance-mode",
        "--balance-counts",
        "--balance-window",
        "--cost-model",
        "--priority-overlap",
        "--dense-order",
        "--sm-free",
        "--sync-gc",
        "--dense-mb",
        "--ddp-bucket-mb",
    }
)
"""Every option of ``fsobs run``. Do not add to it: a new knob of the job goes into its
component's config (``JobConfig`` and the configs it composes), which a run reads from
``job.json``; only a knob that users switch per run from the shell earns a flag."""


def _run_parser() -> argparse.ArgumentParser:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices["run"]


def test_no_new_run_options():
    actions = _run_parser()._actions
    options = {option for action in actions for option in action.option_strings}
    assert options - ALLOWED_OPTIONS == set(), (
        "new `fsobs run` options: put the knob into its component's config instead"
    )
    assert ALLOWED_OPTIONS - options == set(), "an option is gone: update ALLOWED_OPTIONS"
    assert [a.dest for a in actions if not a.option_strings] == ["rdzv"]  # torchrun's, after --


def _job(*extra: str) -> JobConfig:
    return job_config(build_parser().parse_args(["run", "--world-size", "2", "--out", "x", *extra]))


def test_the_flags_defaults_are_the_configs():
    assert _job() == JobConfig()


def test_run_json_workload_is_the_job_configs_json():
    """``run.json``'s ``workload`` of a run without flags: ``job.json``'s sections, the
    defaults of each config (``data``'s tables those of the small model)."""
    workload = _job().to_json()
    assert list(workload) == [
        *("steps", "batch_size", "model", "data", "profiler", "freescale", "cost_model"),
        *("optimizer", "ddp_bucket_mb", "save_params"),
    ]
    assert (workload["steps"], workload["batch_size"], workload["cost_model"]) == (20, 32, None)
    assert workload["model"] == {"size": "small", "dense_mb": 0.0}
    assert workload["freescale"]["balance"] == {
        "enabled": False,
        "method": "kk",
        "counts": "equal",
        "mode": "plan",
        "check_every": 10,
        "window": 1,
    }
    assert workload["freescale"]["priority_overlap"] == {"enabled": False, "dense_order": "auto"}
    assert workload["data"]["seed"] == 0 and workload["data"]["num_items"] == 20_000
    assert workload["profiler"]["active"] == 20 - 2 and workload["profiler"]["every"] is None


def test_the_flags_build_the_job():
    job = _job(
        *("--steps", "6", "--model-size", "tiny", "--batch-size", "8", "--seed", "3"),
        *("--preset", "powerlaw", "--num-samples", "512", "--no-profile"),
        *("--dense-mb", "16", "--ddp-bucket-mb", "4", "--sm-free", "--sync-gc"),
    )
    assert (job.steps, job.batch_size, job.seed, job.ddp_bucket_mb) == (6, 8, 3, 4)
    assert job.model == ModelSpec(size="tiny", dense_mb=16.0) and job.model.config().wide_dim > 0
    assert (job.data.preset, job.data.num_samples, job.data.num_items) == ("powerlaw", 512, 1000)
    prof = job.profiler
    assert (prof.enabled, prof.wait, prof.warmup, prof.active, prof.repeat) == (False, 1, 1, 4, 1)
    assert not prof.record_shapes
    assert job.freescale.sm_free.enabled and job.freescale.sync_gc.enabled
    assert not job.freescale.balance.enabled and not job.freescale.priority_overlap.enabled


def test_profile_window_makes_live_windows_of_that_many_steps():
    """--profile-window 4: live windows of a wait, a warm-up and 4 recorded steps, back to back
    (a cycle of 6 steps: 2-5, 8-11, 14-17 of 20); --profile-every 10 spaces them (2-5, 12-15);
    --profile-every 0 alone: captures only."""
    prof = _job("--profile-window", "4").profiler
    assert (prof.wait, prof.warmup, prof.active, prof.repeat, prof.every) == (1, 1, 4, 1, 6)
    assert prof.schedule.scheduled(0, 19) == [(2, 5), (8, 11), (14, 17)]
    assert not prof.record_shapes
    spaced = _job("--profile-window", "4", "--profile-every", "10").profiler
    assert spaced.schedule.scheduled(0, 19) == [(2, 5), (12, 15)]
    assert _job("--profile-window", "4").to_json()["profiler"]["every"] == 6
    assert _job("--profile-every", "0").profiler.schedule.scheduled(0, 19) == []
    assert JobConfig().to_json()["profiler"]["every"] is None


def test_run_builds_the_balance_toggle(tmp_path, monkeypatch):
    assert _job("--balance").freescale.balance == BalanceConfig(enabled=True)
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"c0": 1.0, "a": 2.0, "b": 3.0}))
    monkeypatch.chdir(tmp_path)
    job = _job("--balance", "--balance-method", "lpt", "--balance-mode", "shuffle")
    assert job.freescale.balance == BalanceConfig(enabled=True, method="lpt", mode="shuffle")
    assert _job("--balance", "--cost-model", "cost.json").cost_model == cost.resolve()
    unequal = _job("--balance", "--balance-counts", "unequal", "--balance-window", "2")
    assert unequal.freescale.balance == BalanceConfig(enabled=True, counts="unequal", window=2)
    assert unequal.to_json()["freescale"]["balance"]["counts"] == "unequal"
    assert unequal.to_json()["freescale"]["balance"]["window"] == 2


def test_run_builds_the_overlap_toggle():
    assert _job("--priority-overlap").freescale.priority_overlap == PriorityConfig(enabled=True)
    concurrent = _job("--priority-overlap", "--dense-order", "concurrent")
    assert concurrent.freescale.priority_overlap.dense_order == "concurrent"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--dense-order", "concurrent"], "--dense-order needs --priority-overlap"),
        (["--cost-model", "missing.json"], "missing.json: cost model file not found"),
        (["--cost-model", "bad.json"], "bad cost model: "),
        (["--balance-method", "lpt"], "--balance-method needs --balance"),
        (["--balance-mode", "shuffle"], "--balance-mode needs --balance"),
        (["--balance-counts", "unequal"], "--balance-counts needs --balance"),
        (["--balance-window", "2"], "--balance-window needs --balance"),
        (
            ["--balance", "--balance-window", "2", "--balance-counts", "equal"],
            "window: 2 needs counts 'unequal'",
        ),
        (["--balance", "--balance-method", "lpt", "--balance-counts", "equal"], "counts: "),
        (["--steps", "2"], "steps: must be > wait + warmup (2)"),
        (["--preset", "zipf"], "preset: unknown 'zipf'"),
        (["--batch-size", "0"], "batch_size: must be >= 1"),
        (["--dense-mb", "-1"], "dense_mb: must be >= 0"),
        (["--profile-window", "0"], "profile_window: must be an integer from 1"),
        (["--steps", "6", "--profile-window", "5"], "to the job's 6 steps less a wait"),
        (["--profile-window", "4", "--no-profile"], "--profile-window needs the profiler"),
        (["--profile-every", "3"], "profile_every: needs profile_window"),
        (
            ["--profile-window", "4", "--profile-every", "5"],
            "profile_every: must be an integer >= ",
        ),
        (["--profile-every", "0", "--no-profile"], "--profile-every needs the profiler"),
    ],
)
def test_run_rejects_bad_options_before_launching(tmp_path, monkeypatch, capsys, extra, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.json").write_text('{"c0": 1}')
    argv = ["run", "--world-size", "2", "--out", str(tmp_path / "out"), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_run_rejects_an_unknown_method():
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(
            ["run", "--world-size", "2", "--out", "x", "--balance-method", "x"]
        )
    assert info.value.code == 2


def test_the_job_config_imports_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import fsobs.workload.config, fsobs.workload.launch, fsobs.collect.profiler\n"
        "fsobs.workload.config.JobConfig()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


RUN_PARTS = [
    "run.json",
    "job.json",
    "steps.rank0.jsonl",
    "steps.rank1.jsonl.partial",
    "rank0.trace.json.gz",
    "logs/rank0.log",
    ".rank0.trace.json.gz.raw-12.0123abcd.tmp",
    "notes.txt",  # not ours, but a run never mixes with other files either
]


def _snapshot(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("part", RUN_PARTS)
def test_run_refuses_a_folder_holding_anything_before_writing(tmp_path, capsys, part):
    """Any part of a run (or anything else) in --out: one line naming the folder, exit code 2,
    nothing written, nothing removed."""
    out = tmp_path / "out"
    (out / part).parent.mkdir(parents=True, exist_ok=True)
    (out / part).write_bytes(b"kept as it was\n")
    before = _snapshot(out)
    argv = ["run", "--world-size", "2", "--steps", "4", "--model-size", "tiny", "--out", str(out)]
    assert main([*argv, "--no-profile"]) == 2
    err = capsys.readouterr().err
    name = part.split("/")[0]
    assert err == (
        f"fsobs: error: {out}: already holds {name}; a run is written into a new or empty "
        "folder only\n"
    )
    assert _snapshot(out) == before
    assert sorted(p.name for p in out.iterdir()) == [name]


def test_run_refuses_a_file_and_lists_what_a_folder_holds(tmp_path):
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(LaunchError, match="file: is not a folder"):
        launch(LaunchConfig(world_size=1, out=file), progress=False)
    out = tmp_path / "out"
    out.mkdir()
    for name in ("a", "b", "c", "d", "e", "f"):
        (out / name).write_text("x")
    with pytest.raises(LaunchError, match=r"already holds a, b, c, d, e, \.\.\.; a run is"):
        launch(LaunchConfig(world_size=1, out=out), progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["a", "b", "c", "d", "e", "f"]


def test_the_launcher_notes_stop_signals_and_keeps_ignored_ones_ignored():
    """Real signals to this process: noted (not raised) while the job runs, the handlers
    restored afterwards; a signal ignored before (nohup, a background job) stays ignored."""
    term, sigint = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with _stop_signals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
    assert stop == [signal.SIGTERM, signal.SIGINT]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == (term, sigint)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with _stop_signals() as stop:
            os.kill(os.getpid(), signal.SIGINT)
        assert stop == []
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, sigint)


def test_a_balance_window_implies_unequal_counts():
    """``--balance-window 2`` alone: kk's counts resolve to unequal (a window's counts differ
    per step), as if ``--balance-counts unequal`` had been given."""
    job = _job("--balance", "--balance-window", "2")
    assert job == _job("--balance", "--balance-window", "2", "--balance-counts", "unequal")
    assert job.freescale.balance == BalanceConfig(enabled=True, counts="unequal", window=2)
