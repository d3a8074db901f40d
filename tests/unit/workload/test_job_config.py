"""``JobConfig`` and its ``job.json``: a round trip gives the same config, a bad field is one
``JobConfigError`` line naming the file and the field (no torch needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fsobs.collect.profiler import ProfilerConfig
from fsobs.errors import FsobsError, JobConfigError
from fsobs.runformat.names import JOB_JSON
from fsobs.workload.config import (
    JobConfig,
    ModelConfig,
    ModelSpec,
    data_config_for,
    job_profiler,
    read_job_json,
    write_job_json,
)
from optim.config import FreeScaleConfig, PriorityConfig, SMFreeConfig
from optim.plan import BalanceConfig
from optim.sync_gc import SyncGCConfig


def _every_section_changed() -> JobConfig:
    model = ModelSpec(size="tiny", dense_mb=0.5)
    return JobConfig(
        steps=8,
        batch_size=4,
        model=model,
        data=data_config_for(
            model.config(), preset="uniform", num_samples=300, seed=7, length_scale=0.5
        ),
        profiler=ProfilerConfig(
            enabled=False, wait=0, warmup=1, active=3, repeat=2, record_shapes=True
        ),
        freescale=FreeScaleConfig(
            balance=BalanceConfig(enabled=True, method="lpt", mode="shuffle", check_every=0),
            priority_overlap=PriorityConfig(enabled=True, dense_order="concurrent"),
            sm_free=SMFreeConfig(enabled=True, fallback="efficiency", capacity=64),
            sync_gc=SyncGCConfig(enabled=True, every=3, generation=1),
        ),
        cost_model=Path("/abs/cost.json"),
        optimizer="sgd",
        ddp_bucket_mb=2,
        save_params=True,
    )


@pytest.mark.parametrize("job", [JobConfig(), _every_section_changed()], ids=["default", "all"])
def test_round_trip_through_json(job):
    text = json.dumps(job.to_json())
    assert JobConfig.from_json(json.loads(text)) == job


def test_round_trip_through_the_run_directory(tmp_path):
    job = _every_section_changed()
    path = write_job_json(tmp_path / "run", job)
    assert path == tmp_path / "run" / JOB_JSON
    assert [p.name for p in path.parent.iterdir()] == [JOB_JSON]  # no temporary file left
    assert read_job_json(path.parent) == job
    on_disk = json.loads(path.read_text())
    assert on_disk["model"] == {"size": "tiny", "dense_mb": 0.5}
    assert on_disk["cost_model"] == "/abs/cost.json" and on_disk["freescale"]["sm_free"]["capacity"]


def test_a_left_out_field_takes_its_default():
    obj = JobConfig().to_json()
    del obj["save_params"], obj["freescale"]["balance"]["check_every"], obj["freescale"]["sync_gc"]
    assert JobConfig.from_json(obj) == JobConfig()
    assert JobConfig.from_json({}) == JobConfig()


def _set(path: str, value: object) -> dict[str, object]:
    obj = JobConfig().to_json()
    *parents, name = path.split(".")
    node = obj
    for parent in parents:
        node = node[parent]
    node[name] = value
    return obj


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("data.preset", "zipf", "unknown 'zipf', expected one of"),
        ("data.num_samples", "many", "must be an integer, got 'many'"),
        ("data.num_samples", 1.5, "must be an integer, got 1.5"),
        ("batch_size", True, "must be an integer, got True"),
        ("data.length_scale", float("nan"), "must be a finite number, got nan"),
        ("freescale.balance.enabled", 1, "must be true or false, got 1"),
        ("freescale.balance.method", "x", "must be one of ['kk', 'lpt', 'random'], got 'x'"),
        ("freescale.priority_overlap.dense_order", "late", "must be one of ['auto', "),
        ("profiler.wait", -1, "must be an integer >= 0, got -1"),
        ("model.size", "huge", "must be one of ['tiny', 'small', 'medium'], got 'huge'"),
        ("cost_model", 5, "must be a path (a string), got 5"),
        ("optimizer", "adam", "unknown 'adam'"),
        ("steps", 0, "must be >= 1, got 0"),
        ("stepz", 20, "unknown field; expected one of ['steps', "),
        ("data.colour", "red", "unknown field"),
        ("data", [], "must be an object, got []"),
    ],
)
def test_a_bad_field_is_one_line_naming_the_file_and_the_field(tmp_path, field, value, message):
    (tmp_path / JOB_JSON).write_text(json.dumps(_set(field, value)))
    with pytest.raises(JobConfigError) as info:
        read_job_json(tmp_path)
    error = info.value
    assert isinstance(error, FsobsError) and "\n" not in str(error)
    assert (error.path, error.field) == (str(tmp_path / JOB_JSON), field)
    assert str(error).startswith(f"{tmp_path / JOB_JSON}: field {field}: ")
    assert message in str(error)


@pytest.mark.parametrize(
    ("field", "value", "named", "message"),
    [
        ("model.size", "tiny", "data.num_items", "20000 ids, but the model's table has 1000 rows"),
        ("steps", 10, "profiler", "its cycles take 20 steps, the job has 10"),
    ],
)
def test_sections_are_checked_against_each_other(tmp_path, field, value, named, message):
    (tmp_path / JOB_JSON).write_text(json.dumps(_set(field, value)))
    with pytest.raises(JobConfigError, match=f"field {named}: {message}") as info:
        read_job_json(tmp_path)
    assert info.value.field == named


def test_an_unreadable_job_json(tmp_path):
    with pytest.raises(JobConfigError, match=r"job\.json: cannot read the job config"):
        read_job_json(tmp_path)
    (tmp_path / JOB_JSON).write_text("{")
    with pytest.raises(JobConfigError, match=r"job\.json: not JSON: "):
        read_job_json(tmp_path)
    (tmp_path / JOB_JSON).write_text("[]")
    with pytest.raises(JobConfigError, match=r"job\.json: must be an object, got \[\]"):
        read_job_json(tmp_path)


def test_the_default_job_is_fsobs_runs():
    job = JobConfig()
    assert job.model.config() == ModelConfig.preset("small")
    assert job.data == data_config_for(ModelConfig.preset("small"))
    assert job.profiler == job_profiler(20) == ProfilerConfig(active=18, record_shapes=False)
    assert job.freescale == FreeScaleConfig() and job.seed == 0


def test_model_spec_sizes_the_dense_block():
    shape = ModelSpec(size="small", dense_mb=16).config()
    assert shape == ModelConfig.preset("small", wide_dim=shape.wide_dim_for(16))
    assert shape.wide_dim > 0 and ModelSpec().config().wide_dim == 0
