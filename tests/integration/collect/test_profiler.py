"""StepProfiler: one atomic gzipped trace per rank, a no-op when disabled, training unchanged."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import fsobs  # noqa: E402
from fsobs.collect import ProfilerConfig, StepProfiler  # noqa: E402
from fsobs.collect import profiler as profiler_module  # noqa: E402

CONFIG = ProfilerConfig(wait=1, warmup=1, active=2, record_shapes=False)


def _work(num_steps: int, prof: StepProfiler) -> None:
    a = torch.ones(16, 16)
    for _ in range(num_steps):
        a = torch.tanh(a @ a)
        prof.step()


def _trace_doc(path: Path) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)


def _step_names(doc: dict) -> list[str]:
    names = {e.get("name", "") for e in doc["traceEvents"]}
    return sorted(n for n in names if n.startswith("ProfilerStep#"))


def test_one_gzipped_trace_with_the_active_steps(tmp_path):
    with StepProfiler(tmp_path, 0, CONFIG) as prof:
        _work(6, prof)
    assert prof.num_exports == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.trace.json.gz"]
    doc = _trace_doc(prof.trace_path)
    assert _step_names(doc) == ["ProfilerStep#2", "ProfilerStep#3"]  # wait=1, warmup=1, active=2
    assert "distributedInfo" not in doc  # torch.distributed is not initialized here
    rank = fsobs.load_rank(prof.trace_path)
    assert (rank.rank, rank.steps) == (-1, [2, 3])
    run = fsobs.load_run(tmp_path)
    assert run.rank_ids == [0] and run.world_size == 1
    assert run.warnings == ["rank0.trace.json.gz: no distributedInfo.rank; treated as rank 0"]


def test_leaving_early_exports_the_recorded_steps(tmp_path):
    with StepProfiler(tmp_path, 3, CONFIG) as prof:
        _work(3, prof)  # steps 0, 1, 2 end; step 3 is being recorded when the block ends
    assert fsobs.load_rank(tmp_path / "rank3.trace.json.gz").steps == [2, 3]


def test_repeat_keeps_every_cycle(tmp_path):
    """Each window is written when it closes, the file holding every window so far: a rank
    killed after the first window keeps it."""
    config = ProfilerConfig(wait=1, warmup=1, active=2, repeat=3, record_shapes=False)
    seen = []
    with StepProfiler(tmp_path, 0, config) as prof:
        for step in range(config.num_steps + 2):
            _work(1, prof)
            if step in (3, 7):  # the ends of the first two windows (steps 2-3 and 6-7)
                seen.append(_step_names(_trace_doc(prof.trace_path)))
                assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == [
                    "rank0.trace.json.gz"
                ]
    assert seen == [
        ["ProfilerStep#2", "ProfilerStep#3"],
        ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#6", "ProfilerStep#7"],
    ]
    assert prof.num_exports == 3
    assert [p.name for p in tmp_path.iterdir()] == ["rank0.trace.json.gz"]  # no temporary left
    doc = _trace_doc(prof.trace_path)
    assert _step_names(doc) == [f"ProfilerStep#{n}" for n in (10, 11, 2, 3, 6, 7)]
    assert fsobs.load_rank(prof.trace_path).steps == [2, 3, 6, 7, 10, 11]


def test_disabled_is_a_no_op(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("torch.profiler.profile must not be created when disabled")

    monkeypatch.setattr(torch.profiler, "profile", refuse)
    run_dir = tmp_path / "run"
    prof = StepProfiler(run_dir, 0, replace(CONFIG, enabled=False))
    prof.step()  # also outside the block
    with prof:
        _work(6, prof)
    assert not run_dir.exists()
    assert prof.num_exports == 0


def _train(enabled: bool, run_dir: Path) -> dict[str, torch.Tensor]:
    torch.manual_seed(1234)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = torch.Generator().manual_seed(99)
    config = ProfilerConfig(enabled=enabled)  # the defaults, record_shapes included
    with StepProfiler(run_dir, 0, config) as prof:
        for _ in range(config.num_steps + 1):
            x = torch.randn(16, 8, generator=data)
            y = torch.randn(16, 4, generator=data)
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            prof.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_profiling_does_not_change_what_is_trained(tmp_path):
    on = _train(True, tmp_path / "on")
    off = _train(False, tmp_path / "off")
    assert (tmp_path / "on" / "rank0.trace.json.gz").exists()
    assert not (tmp_path / "off").exists()
    assert on.keys() == off.keys()
    for key in on:
        assert torch.equal(on[key], off[key]), key


def _torn_export(self, path, *args, **kwargs):
    Path(path).write_text('{"traceEvents": [')
    raise OSError("disk full")


def _torn_gzip(source: Path, target: Path) -> None:
    target.write_bytes(gzip.compress(b'{"traceEvents": [')[:10])
    raise OSError("disk full")


@pytest.mark.parametrize("stage", ["export", "gzip"])
def test_failed_export_leaves_no_file(tmp_path, monkeypatch, stage):
    if stage == "export":
        monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", _torn_export)
    else:
        monkeypatch.setattr(profiler_module, "_gzip", _torn_gzip)
    config = ProfilerConfig(wait=0, warmup=1, active=1, repeat=3, record_shapes=False)
    steps_done = 0
    with pytest.raises(OSError, match="disk full"):
        with StepProfiler(tmp_path, 0, config) as prof:
            for _ in range(8):  # the failures happen between cycles, inside torch's step()
                _work(1, prof)
                steps_done += 1
    assert steps_done == 8  # raised when the block is left, never into the training loop
    assert prof.num_exports == 0
    assert list(tmp_path.iterdir()) == []


def test_refuses_to_overwrite_a_trace(tmp_path):
    (tmp_path / "rank0.trace.json.gz").write_bytes(b"")
    with pytest.raises(FileExistsError, match="rank0.trace.json.gz"):
        with StepProfiler(tmp_path, 0, CONFIG):
            pass


def test_step_outside_the_block_is_an_error(tmp_path):
    with pytest.raises(RuntimeError, match="outside"):
        StepProfiler(tmp_path, 0, CONFIG).step()


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"wait": -1}, "wait"),
        ({"warmup": 0}, "warmup"),
        ({"active": 0}, "active"),
        ({"repeat": 0}, "repeat"),
        ({"active": 2.0}, "active"),
        ({"record_shapes": 1}, "record_shapes"),
        ({"enabled": "no"}, "enabled"),
    ],
)
def test_config_is_validated(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ProfilerConfig(**kwargs)


def test_config_step_counts():
    config = ProfilerConfig(wait=2, warmup=1, active=3, repeat=2)
    assert (config.cycle_steps, config.num_steps) == (6, 12)
    every = ProfilerConfig.every_step(20, record_shapes=False)
    assert (every.wait, every.warmup, every.active, every.repeat) == (1, 1, 18, 1)
    assert ProfilerConfig.every_step(6, wait=2).active == 3
    with pytest.raises(ValueError, match="steps: must be > wait \\+ warmup \\(2\\)"):
        ProfilerConfig.every_step(2)
    with pytest.raises(ValueError, match="rank"):
        StepProfiler("x", -1, config)


def test_an_error_mid_cycle_keeps_the_previous_complete_cycle(tmp_path):
    """A rank stopped by an error (or torchrun's SIGTERM) keeps the trace of its last full cycle,
    so that every rank's trace covers the same steps."""
    config = ProfilerConfig(wait=1, warmup=1, active=2, repeat=2)
    with pytest.raises(KeyboardInterrupt), StepProfiler(tmp_path, 0, config) as prof:
        for step in range(7):  # cycle 1 = steps 0-3 (exported), cycle 2 stops at step 6
            torch.ones(8).sum()
            if step == 6:
                raise KeyboardInterrupt
            prof.step()
    assert fsobs.load_rank(tmp_path / "rank0.trace.json.gz").steps == [2, 3]
