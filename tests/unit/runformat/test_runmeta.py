"""run.json: built and validated, written atomically, read by the loader; incomplete runs load."""

from __future__ import annotations

import json
import platform
import re

import pytest

import fsobs
from fsobs.errors import TraceFormatError
from fsobs.runformat import (
    RunMeta,
    ToggleStatus,
    finalize_incomplete,
    mark_incomplete,
    read_run_json,
    read_run_meta,
    write_run_json,
)
from tests.support.kineto import REFERENCE, step, trace, write

TOGGLES = {
    "load_balance": {"requested": True, "applied": True, "reason": None},
    "sm_free": {"requested": True, "applied": False, "reason": "no GPU"},
}


def _meta(**overrides):
    kwargs = dict(
        name="ref-2rank",
        world_size=2,
        backend="gloo",
        device="cpu",
        hosts=("host-a",),
        workload={"batch": 64, "seed": 0},
        toggles={k: ToggleStatus(**v) for k, v in TOGGLES.items()},
        ranks_present=(0, 1),
        status="complete",
    )
    return RunMeta.now(**(kwargs | overrides))


def _write_rank(run_dir, rank, world_size=2):
    doc = trace([step(0, 0.0, 100.0)], rank=rank, world_size=world_size, backend="gloo")
    write(run_dir / f"rank{rank}.trace.json.gz", doc)


def test_build_and_round_trip(tmp_path):
    meta = _meta()
    assert meta.format_version == 1
    assert meta.created.endswith("+00:00")
    assert meta.versions["python"] == platform.python_version()
    assert meta.versions["torch"] is not None  # torchrec may be None where not installed
    assert {k: t.to_json() for k, t in meta.toggles.items()} == TOGGLES
    assert meta.simulated is False
    path = write_run_json(tmp_path, meta)
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # no temporary file left
    text = path.read_text()
    written = json.loads(text)
    assert sorted(written) == [
        "backend", "created", "device", "format_version", "hosts", "name", "ranks_present",
        "reason", "simulated", "status", "toggles", "versions", "workload", "world_size",
    ]  # fmt: skip
    assert written["toggles"] == TOGGLES and written["hosts"] == ["host-a"]
    assert text == json.dumps(written, sort_keys=True, indent=2) + "\n"
    assert read_run_json(tmp_path) == meta


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"world_size": 0}, "world_size"),
        ({"status": "done"}, "status"),
        ({"ranks_present": (0,)}, "ranks_present"),
        ({"ranks_present": (0, 2), "status": "incomplete", "reason": "x"}, "ranks_present"),
        ({"status": "incomplete"}, "reason"),
        ({"reason": "why"}, "reason"),
        ({"hosts": "host-a"}, "hosts"),
    ],
)
def test_inconsistent_meta_is_refused(overrides, field):
    with pytest.raises(ValueError, match=field):
        _meta(**overrides)


OFF = {"requested": False, "applied": False, "reason": None}


@pytest.mark.parametrize(
    "toggle, wanted",
    [
        ({"requested": False, "applied": True, "reason": None}, "applied but not requested"),
        ({"requested": True, "applied": False, "reason": None}, "give the reason"),
        ({"requested": True}, "applied: required, but missing"),
        ({"requested": 1, "applied": True, "reason": None}, "must be true or false, got 1"),
        (
            {"requested": True, "applied": True, "why": None},
            "why: unknown field; expected one of \\['requested', 'applied', 'reason'\\]",
        ),
    ],
)
def test_bad_toggles_are_refused_naming_the_toggle(tmp_path, toggle, wanted):
    (tmp_path / "run.json").write_text(json.dumps({"toggles": {"y": OFF, "x": toggle}}))
    with pytest.raises(TraceFormatError, match=f"field toggles\\.x[.:].*{wanted}"):
        read_run_json(tmp_path)


@pytest.mark.parametrize(
    "content, field",
    [
        ({"world_size": 0}, "world_size"),
        ({"world_size": "4"}, "world_size"),
        ({"toggles": []}, "toggles"),
        ({"hosts": [1]}, "hosts"),
        ({"ranks_present": [0, 0]}, "ranks_present"),
        ({"status": "incomplete"}, "reason"),
        ({"simulated": "yes"}, "simulated"),
        ({"workload": 3}, "workload"),
        ({"status": "done"}, "status"),
        ({"wold_size": 4}, "wold_size"),
        ({"format_version": 2}, "format_version"),
    ],
)
def test_reader_names_the_bad_field(tmp_path, content, field):
    (tmp_path / "run.json").write_text(json.dumps(content))
    with pytest.raises(TraceFormatError, match=f"run.json: field {re.escape(field)}: ") as info:
        read_run_json(tmp_path)
    assert info.value.field == field and "\n" not in str(info.value)


def test_minimal_foreign_run_json_reads(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"world_size": 4, "name": None}))
    meta = read_run_json(tmp_path)
    assert (meta.world_size, meta.name, meta.status, meta.toggles) == (4, None, "complete", {})


def test_complete_run_loads(tmp_path):
    _write_rank(tmp_path, 0)
    _write_rank(tmp_path, 1)
    write_run_json(tmp_path, _meta())
    run = fsobs.load_run(tmp_path)
    assert run.rank_ids == [0, 1] and run.warnings == []
    assert run.meta.status == "complete"


def test_incomplete_run_with_a_missing_rank_warns(tmp_path):
    _write_rank(tmp_path, 0)
    write_run_json(tmp_path, _meta())
    with pytest.raises(fsobs.MissingRankError):  # the control: "complete" but rank 1 is missing
        fsobs.load_run(tmp_path)
    meta = mark_incomplete(tmp_path, "rank 1 crashed at step 7", [0])
    assert meta.status == "incomplete" and meta.ranks_present == (0,)
    assert meta.name == "ref-2rank"  # other keys are kept
    run = fsobs.load_run(tmp_path)
    assert run.rank_ids == [0] and run.world_size == 2
    assert run.warnings == ["loaded 1 of 2 ranks (missing: 1)"]
    assert run.meta.reason == "rank 1 crashed at step 7"


def test_finalize_cleans_up_and_describes(tmp_path):
    _write_rank(tmp_path, 1)
    write_run_json(tmp_path, _meta())
    leftover = tmp_path / ".rank0.trace.json.gz.raw-123.0badf00d.tmp"
    leftover.write_text('{"traceEvents": [')
    kineto = tmp_path / (leftover.name + ".tmp")  # Kineto writes there before renaming
    kineto.write_text('{"traceEvents": [')
    kept = tmp_path / ".notes.tmp"  # not a name of ours
    kept.write_text("x")
    meta = finalize_incomplete(tmp_path)
    assert not leftover.exists() and not kineto.exists() and kept.exists()
    assert meta.ranks_present == (1,)
    assert meta.reason == "interrupted: no trace from ranks [0]"
    assert fsobs.load_run(tmp_path).rank_ids == [1]
    assert finalize_incomplete(tmp_path, "killed by the launcher").reason == (
        "killed by the launcher"
    )


def test_mark_incomplete_without_run_json(tmp_path):
    meta = mark_incomplete(tmp_path, "launcher died", [1, 0])
    assert meta.ranks_present == (0, 1) and meta.format_version == 1
    assert meta.world_size is None
    assert json.loads((tmp_path / "run.json").read_text())["world_size"] is None
    with pytest.raises(ValueError, match="reason"):
        mark_incomplete(tmp_path, "", [0])


def test_a_workload_knob_reads_from_the_job_config_json_and_from_an_old_flat_record():
    """The knob at a dotted path of the job config's JSON; an older run's flat record answers
    under its flat name; a knob neither has is None."""
    nested = RunMeta(workload={"steps": 4, "data": {"seed": 7}, "freescale": {"balance": {}}})
    assert (nested.knob("steps"), nested.knob("data.seed")) == (4, 7)
    assert nested.knob("freescale.balance.window") is None
    flat = RunMeta(workload={"steps": 10, "seed": 3, "balance_window": 2, "model_size": "small"})
    assert (flat.knob("steps"), flat.knob("data.seed"), flat.knob("model.size")) == (
        10,
        3,
        "small",
    )
    assert flat.knob("freescale.balance.window") == 2
    assert flat.knob("data.preset") is None and RunMeta().knob("steps") is None


def test_a_stored_run_with_a_flat_workload_still_reads():
    """traces/ab_balance_2rank/test (written before run.json held the job config's JSON)."""
    meta = read_run_meta(REFERENCE.parent / "ab_balance_2rank" / "test" / "run.json")
    assert (meta.knob("freescale.balance.enabled"), meta.knob("data.seed")) == (True, 0)
    assert (meta.knob("freescale.balance.method"), meta.knob("steps")) == ("kk", 10)
