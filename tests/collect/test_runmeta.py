"""run.json: built and validated, written atomically, read by the loader; incomplete runs load."""

from __future__ import annotations

import json
import platform

import pytest

pytest.importorskip("torch")  # fsobs.collect needs torch

import fsobs  # noqa: E402
from fsobs.collect import (  # noqa: E402
    build_run_meta,
    finalize_incomplete,
    mark_incomplete,
    read_run_json,
    write_run_json,
)
from tests.kineto import step, trace, write  # noqa: E402

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
        hosts=["host-a"],
        workload={"batch": 64, "seed": 0},
        toggles=TOGGLES,
        ranks_present=[0, 1],
        status="complete",
    )
    return build_run_meta(**(kwargs | overrides))


def _write_rank(run_dir, rank, world_size=2):
    doc = trace([step(0, 0.0, 100.0)], rank=rank, world_size=world_size, backend="gloo")
    write(run_dir / f"rank{rank}.trace.json.gz", doc)


def test_build_and_round_trip(tmp_path):
    meta = _meta()
    assert meta["format_version"] == 1
    assert meta["created"].endswith("+00:00")
    assert meta["versions"]["python"] == platform.python_version()
    assert meta["versions"]["torch"] is not None  # torchrec may be None where not installed
    assert meta["toggles"] == TOGGLES and meta["simulated"] is False
    path = write_run_json(tmp_path, meta)
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # no temporary file left
    text = path.read_text()
    assert text == json.dumps(meta, sort_keys=True, indent=2) + "\n"
    assert read_run_json(tmp_path) == meta


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"world_size": 0}, "world_size"),
        ({"status": "done"}, "status"),
        ({"ranks_present": [0]}, "ranks_present"),
        ({"ranks_present": [0, 2], "status": "incomplete", "reason": "x"}, "ranks_present"),
        ({"status": "incomplete"}, "reason"),
        ({"reason": "why"}, "reason"),
        ({"hosts": "host-a"}, "hosts"),
        ({"toggles": {"x": {"requested": False, "applied": True, "reason": None}}}, "toggles.x"),
        ({"toggles": {"x": {"requested": True, "applied": False, "reason": None}}}, "toggles.x"),
        ({"toggles": {"x": {"requested": True}}}, "toggles.x"),
    ],
)
def test_inconsistent_meta_is_refused(overrides, field):
    with pytest.raises(ValueError, match=field):
        _meta(**overrides)


def test_complete_run_loads(tmp_path):
    _write_rank(tmp_path, 0)
    _write_rank(tmp_path, 1)
    write_run_json(tmp_path, _meta())
    run = fsobs.load_run(tmp_path)
    assert run.rank_ids == [0, 1] and run.warnings == []
    assert run.meta["status"] == "complete"


def test_incomplete_run_with_a_missing_rank_warns(tmp_path):
    _write_rank(tmp_path, 0)
    write_run_json(tmp_path, _meta())
    with pytest.raises(fsobs.MissingRankError):  # the control: "complete" but rank 1 is missing
        fsobs.load_run(tmp_path)
    meta = mark_incomplete(tmp_path, "rank 1 crashed at step 7", [0])
    assert meta["status"] == "incomplete" and meta["ranks_present"] == [0]
    assert meta["name"] == "ref-2rank"  # other keys are kept
    run = fsobs.load_run(tmp_path)
    assert run.rank_ids == [0] and run.world_size == 2
    assert run.warnings == ["loaded 1 of 2 ranks (missing: 1)"]
    assert run.meta["reason"] == "rank 1 crashed at step 7"


def test_finalize_cleans_up_and_describes(tmp_path):
    _write_rank(tmp_path, 1)
    write_run_json(tmp_path, _meta())
    leftover = tmp_path / ".rank0.trace.json.gz.raw-123.0badf00d.tmp"
    leftover.write_text('{"traceEvents": [')
    meta = finalize_incomplete(tmp_path)
    assert not leftover.exists()
    assert meta["ranks_present"] == [1]
    assert meta["reason"] == "interrupted: no trace from ranks [0]"
    assert fsobs.load_run(tmp_path).rank_ids == [1]
    assert finalize_incomplete(tmp_path, "killed by the launcher")["reason"] == (
        "killed by the launcher"
    )


def test_mark_incomplete_without_run_json(tmp_path):
    meta = mark_incomplete(tmp_path, "launcher died", [1, 0])
    assert meta["ranks_present"] == [0, 1] and meta["format_version"] == 1
    assert "world_size" not in meta
    with pytest.raises(ValueError, match="reason"):
        mark_incomplete(tmp_path, "", [0])
