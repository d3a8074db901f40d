"""RunRecorder: a loop's run (trace, step sidecars, run.json) written in a few lines, analyzable
by ``fsobs analyze`` and ``fsobs whatif``, whole steps only, marked incomplete on a crash."""

from __future__ import annotations

import gc
import json
import socket
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch.autograd.profiler import record_function  # noqa: E402

import fsobs  # noqa: E402
from fsobs.analysis import analyze_path  # noqa: E402
from fsobs.cli import main  # noqa: E402
from fsobs.collect import ProfilerConfig, RunRecorder, StepProfiler  # noqa: E402
from fsobs.runformat import (  # noqa: E402
    RunMeta,
    SidecarWriter,
    StepRecord,
    read_run_meta,
    read_sidecars,
    write_run_json,
)
from optim import CostModel  # noqa: E402
from tests.support.dist import run_ranks  # noqa: E402

COST = CostModel(c0=2.0, a=1.0, b=0.5)
WINDOW = ProfilerConfig(wait=1, warmup=1, active=50, record_shapes=False)
"""A window longer than every loop here: close() comes while steps are being recorded."""
OFF = {"requested": False, "applied": False, "reason": None}


def _lengths(step: int) -> list[int]:
    return [step + 1, 3, 2 * step + 5]


def _work(step: int, lengths: list[int] | np.ndarray) -> None:
    """Compute that grows with the lengths, inside a range named ``work#<step>``."""
    with record_function(f"work#{step}"):
        x = torch.ones(8 * int(np.sum(lengths)), 32)
        for _ in range(3):
            x = torch.tanh(x @ torch.ones(32, 32))


def _loop(rec: RunRecorder, steps: int, raise_at: int = -1) -> None:
    for step in range(steps):
        given = [_lengths(step), np.array(_lengths(step)), torch.tensor(_lengths(step))]
        with rec.step(step, lengths=given[step % 3]) as s:
            _work(step, _lengths(step))
            if step == 3:
                gc.collect()  # a full collection: generation 2
            if step == raise_at:
                raise RuntimeError("loss exploded")
            s.loss = step / 4


def _windows(trace: Path) -> dict[str, tuple[int, int]]:
    """Name -> (start, end) ns of the ProfilerStep#N and work#N ranges of a trace."""
    events = fsobs.load_rank(trace).events
    names = events["name"].astype(str)
    ranges = events[names.str.startswith(("ProfilerStep#", "work#"))]
    return {
        str(n): (int(t), int(t + d))
        for n, t, d in ranges[["name", "ts_ns", "dur_ns"]].itertuples(index=False)
    }


def _assert_whole_steps(trace: Path, steps: list[int]) -> None:
    """The trace has exactly ``steps``, each holding the whole of its step's work."""
    windows = _windows(trace)
    assert sorted(int(n.split("#")[1]) for n in windows if n.startswith("Profiler")) == steps
    for step in steps:
        start, end = windows[f"ProfilerStep#{step}"]
        work_start, work_end = windows[f"work#{step}"]
        assert start <= work_start <= work_end <= end


def test_every_step_once_with_its_lengths_loss_cost_and_pauses(tmp_path):
    run = tmp_path / "run"
    rec = RunRecorder(
        run, cost_model=COST, profiler=ProfilerConfig.every_step(8), workload={"a": 1}
    )
    running = read_run_meta(run / "run.json")  # marked incomplete until close()
    assert (running.status, running.reason, running.ranks_present) == ("incomplete", "running", ())
    _loop(rec, 8)
    rec.close()
    rec.close()  # a second close does nothing

    assert sorted(p.name for p in run.iterdir()) == [
        "rank0.trace.json.gz",
        "run.json",
        "steps.rank0.jsonl",
    ]
    analysis = analyze_path(run)
    side = analysis.run.sidecar
    assert side is not None and side["step"].tolist() == list(range(8))  # each step once
    assert [r.tolist() for r in side["seq_lengths"]] == [_lengths(s) for s in range(8)]
    assert side["loss"].tolist() == [s / 4 for s in range(8)]
    # c(L) = 2 + L + 0.5 L^2 summed over the 3 samples (s + 1, 3, 2s + 5)
    costs = [3 * 2 + (3 * s + 9) + 0.5 * ((s + 1) ** 2 + 9 + (2 * s + 5) ** 2) for s in range(8)]
    assert side["est_cost"].tolist() == costs
    assert side["id_overlap"].isna().all()  # no ids given
    assert side[["gc_count", "gc_ms", "gc_max_gen", "cpu_ms", "nivcsw"]].notna().all().all()
    step3 = side.set_index("step").loc[3]
    assert step3["gc_count"] >= 1 and step3["gc_max_gen"] == 2 and step3["gc_ms"] > 0
    assert (side["cpu_ms"] > 0).all()
    # every_step(8): wait 1, warmup 1, then steps 2..7, the last closed by close()
    _assert_whole_steps(run / "rank0.trace.json.gz", list(range(2, 8)))
    assert sorted(set(analysis.steps["step"])) == list(range(2, 8))

    meta = read_run_meta(run / "run.json")  # the strict reader
    assert (meta.status, meta.reason, meta.ranks_present) == ("complete", None, (0,))
    assert (meta.name, meta.world_size, meta.backend, meta.device) == ("run", 1, None, "cpu")
    assert meta.hosts == (socket.gethostname(),) and dict(meta.workload) == {"a": 1}
    assert {k: t.to_json() for k, t in meta.toggles.items()} == {
        "balance": OFF,
        "priority_overlap": OFF,
        "sm_free": OFF,
        "sync_gc": OFF,
    }
    assert meta.process_groups is None and not meta.simulated


def test_a_loop_ending_inside_the_window_exports_whole_steps_that_whatif_takes(tmp_path, capsys):
    run = tmp_path / "run"
    rec = RunRecorder(run, cost_model=COST, profiler=WINDOW)
    _loop(rec, 12)
    rec.close()
    _assert_whole_steps(run / "rank0.trace.json.gz", list(range(2, 12)))
    capsys.readouterr()
    assert main(["whatif", str(run), "--draws", "5", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["run"]["steps"] == 10 and len(result["predictions"]) == 7  # 3 toggles


def test_torch_convention_stopped_inside_the_window_leaves_a_step_whatif_refuses(tmp_path, capsys):
    """What the recorder avoids: ``prof.step()`` after each step, the profiler stopped while
    recording, exports the range opened by the last ``prof.step()``, a step no sidecar has."""
    run = tmp_path / "run"
    with StepProfiler(run, 0, WINDOW) as prof, SidecarWriter(run, 0) as sidecar:
        for step in range(12):
            start = time.time_ns()
            _work(step, _lengths(step))
            cost = float(COST(np.array(_lengths(step))).sum())
            sidecar.write(StepRecord.of(step, _lengths(step), cost, start, time.time_ns()))
            prof.step()
    write_run_json(run, RunMeta.now(world_size=1, ranks_present=(0,)))
    assert fsobs.load_rank(run / "rank0.trace.json.gz").steps == list(range(2, 13))
    capsys.readouterr()
    assert main(["whatif", str(run), "--draws", "5"]) == 2
    assert "has none for step 12" in capsys.readouterr().err


def _raise_between_steps(run: Path) -> None:
    with RunRecorder(run, profiler=ProfilerConfig.every_step(8)) as rec:
        _loop(rec, 4)
        raise RuntimeError("loader died")


def _raise_in_a_step(run: Path) -> None:
    rec = RunRecorder(run, profiler=ProfilerConfig.every_step(8))
    _loop(rec, 8, raise_at=4)


@pytest.mark.parametrize(
    ("crash", "reason", "steps"),
    [
        (_raise_in_a_step, "rank 0: RuntimeError in step 4: loss exploded", [2, 3, 4]),
        (_raise_between_steps, "rank 0: RuntimeError between steps: loader died", [2, 3]),
    ],
    ids=["in-a-step", "between-steps"],
)
def test_a_loop_that_raises_leaves_an_incomplete_run_of_whole_files(tmp_path, crash, reason, steps):
    run = tmp_path / "run"
    with pytest.raises(RuntimeError):
        crash(run)
    # no .partial sidecar, no temporary file: every name is a final one, every file whole
    assert sorted(p.name for p in run.iterdir()) == [
        "rank0.trace.json.gz",
        "run.json",
        "steps.rank0.jsonl",
    ]
    meta = read_run_meta(run / "run.json")
    assert (meta.status, meta.reason, meta.ranks_present) == ("incomplete", reason, (0,))
    side = read_sidecars(run)
    assert side is not None and side["step"].tolist() == [0, 1, 2, 3]  # the steps that ended
    # the trace has what was recorded; a step that raised is cut where it raised
    assert fsobs.load_rank(run / "rank0.trace.json.gz").steps == steps


def test_after_a_failed_step_nothing_more_is_recorded(tmp_path):
    rec = RunRecorder(tmp_path / "run", profiler=WINDOW)
    with pytest.raises(RuntimeError, match="loss exploded"):
        _loop(rec, 3, raise_at=1)
    with pytest.raises(RuntimeError, match="failed"), rec.step(1, lengths=[1]):
        pass
    rec.close()  # nothing: the run stays incomplete
    assert read_run_meta(tmp_path / "run" / "run.json").status == "incomplete"


def test_id_overlap_per_table_against_the_previous_step(tmp_path):
    run = tmp_path / "run"
    ids = [
        {"t_item": [3, 3, 8], "t_cat": [1]},
        {"t_item": [3, 5, 8, 8, 9], "t_cat": [1, 2]},  # 3, 8, 8 of 5 seen; 1 of 2
        {"t_item": np.array([5, 7]), "t_cat": []},  # 5 of 2 seen; t_cat has no id
        None,  # no ids: no share, and none for the next step either
        {"t_item": torch.tensor([5])},
        {"t_item": [6]},
    ]
    rec = RunRecorder(run, profiler=ProfilerConfig(enabled=False))
    for step, table_ids in enumerate(ids):
        with rec.step(step, lengths=[1], ids=table_ids):
            pass
    rec.close()
    side = read_sidecars(run)
    assert side is not None
    assert [None if not isinstance(d, dict) else d for d in side["id_overlap"]] == [
        None,
        {"t_item": 3 / 5, "t_cat": 1 / 2},
        {"t_item": 1 / 2},
        None,
        None,
        {"t_item": 0.0},
    ]
    meta = read_run_meta(run / "run.json")  # profiling off: no trace, so not complete
    assert meta.status == "incomplete" and meta.reason is not None
    assert meta.reason.startswith("no trace from ranks [0]") and meta.ranks_present == ()


def test_bad_input_names_the_field(tmp_path):
    with pytest.raises(ValueError, match="freescale: needs a status"):
        RunRecorder(tmp_path / "a", freescale=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cost_model"):
        RunRecorder(tmp_path / "b", cost_model=3.0)  # type: ignore[arg-type]
    rec = RunRecorder(tmp_path / "c", profiler=WINDOW)
    with pytest.raises(ValueError, match="step: expected 0"):
        rec.step(1, lengths=[1]).__enter__()
    with pytest.raises(ValueError, match="lengths: step 0 ended without them"), rec.step(0):
        pass
    assert read_run_meta(tmp_path / "c" / "run.json").status == "incomplete"
    rec = RunRecorder(tmp_path / "d", profiler=WINDOW)
    with pytest.raises(ValueError, match="ids: must map"), rec.step(0, lengths=[1], ids=[1]):  # type: ignore[arg-type]
        pass
    with pytest.raises(FileExistsError):  # a run directory is written once
        RunRecorder(tmp_path / "c")


# ---------------------------------------------------------------- two gloo ranks, FreeScale

STEPS = 10
GLOBAL_BATCH = 8


def _global_lengths(step: int) -> np.ndarray:
    return np.random.default_rng(step).integers(1, 60, size=GLOBAL_BATCH)


def _rank_main(rank: int, world_size: int, run_dir: str) -> None:
    from optim import BalanceConfig, FreeScale, FreeScaleConfig, SyncGCConfig

    config = FreeScaleConfig(
        balance=BalanceConfig(enabled=True), sync_gc=SyncGCConfig(enabled=True)
    )
    fs = FreeScale(config, cost_model=COST)
    fs.setup()
    rec = RunRecorder(run_dir, freescale=fs, cost_model=fs.cost_model, profiler=WINDOW)
    for step in range(STEPS):
        lengths = _global_lengths(step)
        with rec.step(step, ids={"t_item": np.arange(step, step + 4)}) as s:
            share = fs.split(step, lengths)  # this rank's part of the global batch
            s.lengths = lengths[share.positions]
            _work(step, s.lengths)
            total = torch.tensor([float(np.sum(s.lengths))])
            dist.all_reduce(total)
            s.loss = float(total) / 1000
            fs.after_step(step)
    rec.close()
    fs.close()


@pytest.mark.multiprocess
def test_two_gloo_ranks_with_freescale_write_a_run_whatif_takes(tmp_path, capsys):
    run = tmp_path / "run"
    run_ranks(_rank_main, 2, str(run))
    analysis = analyze_path(run)
    assert analysis.run.rank_ids == [0, 1]
    side = analysis.run.sidecar
    assert side is not None
    assert side.groupby("rank")["step"].apply(list).tolist() == [list(range(STEPS))] * 2
    for step, rows in side.groupby("step"):  # every sample of the global batch, once
        got = np.concatenate(rows["seq_lengths"].tolist())
        assert sorted(got.tolist()) == sorted(_global_lengths(int(step)).tolist())
        assert rows["loss"].tolist() == [float(np.sum(got)) / 1000] * 2
    c = COST
    assert side["est_cost"].tolist() == [
        float(sum(c.c0 + c.a * v + c.b * v * v for v in r)) for r in side["seq_lengths"]
    ]
    # arange(s, s + 4) after arange(s - 1, s + 3): 3 of 4 ids seen, on both ranks
    for rank in (0, 1):
        shares = side[side["rank"] == rank]["id_overlap"].tolist()
        assert shares == [None] + [{"t_item": 0.75}] * (STEPS - 1)
    for rank in (0, 1):
        _assert_whole_steps(run / f"rank{rank}.trace.json.gz", list(range(2, STEPS)))
    capsys.readouterr()
    assert main(["whatif", str(run), "--draws", "5"]) == 0

    meta = read_run_meta(run / "run.json")
    assert (meta.status, meta.world_size, meta.backend, meta.ranks_present) == (
        "complete",
        2,
        "gloo",
        (0, 1),
    )
    toggles = {k: t.to_json() for k, t in meta.toggles.items()}
    assert toggles["balance"] == {"requested": True, "applied": True, "reason": None}
    # this loop never calls fs.attach, where sync_gc turns automatic collection off: the toggle
    # did nothing (after_step collects only once started), and says so
    assert toggles["sync_gc"] == {
        "requested": True,
        "applied": False,
        "reason": "not started: automatic collection is turned off at fs.attach",
    }
    assert toggles["priority_overlap"] == toggles["sm_free"] == OFF
    assert meta.process_groups and all(
        g["size"] == 2 and g["backend"] == "gloo" for g in meta.process_groups.values()
    )
