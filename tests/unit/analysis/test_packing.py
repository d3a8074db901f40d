"""A rank's step parts and class interval sets survive the packed pickle
(fsobs.analysis.bubbles.packing) whole: every field, every array's values and dtype, empty
arrays and arrays of several dtypes included."""

from __future__ import annotations

import numpy as np

from fsobs.analysis.bubbles.classify import StepBubbles
from fsobs.analysis.bubbles.packing import pack, pack_bubbles, unpack, unpack_bubbles
from fsobs.analysis.bubbles.parts import StepParts
from fsobs.analysis.bubbles.windows import GpuCoverage


def _i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def _parts() -> list[StepParts]:
    gpu = StepParts(
        rank=3,
        step=7,
        device="gpu",
        window=(100, 200),
        compute=(_i64(100, 150), _i64(120, 190)),
        comm=(_i64(130), _i64(160)),
        comm_rows=_i64(4, 9),
        everything=(_i64(100), _i64(190)),
        contention_ns=12,
        cpu_ns=80,
        coverage=GpuCoverage(unlaunched_events=1, unlaunched_ns=5),
    )
    cpu = StepParts(
        rank=3,
        step=8,
        device="cpu",
        window=(200, 300),
        compute=(_i64(), _i64()),
        comm=(np.array([210.0]), np.array([250.5])),  # float64, as a gloo rank's can be
        comm_rows=np.array([11], np.int32),
        loading=(_i64(200), _i64(205)),
        loader_comm=(_i64(201), _i64(204)),
        clock="cpu",
    )
    return [gpu, cpu]


def _same(a: object, b: object) -> bool:
    if isinstance(a, tuple) and a and isinstance(a[0], np.ndarray):
        assert isinstance(b, tuple)
        return all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray)
        return a.dtype == b.dtype and a.tolist() == b.tolist()
    return a == b


def test_every_field_comes_back_with_its_values_and_dtype() -> None:
    before = _parts()
    after = unpack(pack(before))
    assert len(after) == 2
    for old, new in zip(before, after, strict=True):
        assert type(new) is StepParts
        assert vars(old).keys() == vars(new).keys()
        for name, value in vars(old).items():
            assert _same(value, getattr(new, name)), name
    assert after[1].comm[1].tolist() == [250.5]
    assert after[1].comm_rows.dtype == np.int32
    assert after[0].transfer[0].tolist() == []
    assert after[0].coverage == GpuCoverage(unlaunched_events=1, unlaunched_ns=5)


def test_no_parts() -> None:
    assert unpack(pack([])) == []


def test_class_interval_sets_come_back_in_their_order_with_every_field() -> None:
    """A rank's StepBubbles (what the bubble store spills): the classes in their order, each
    interval set with its values and dtype, and the per-rank charges."""
    steps = [
        StepBubbles(
            rank=2,
            step=0,
            window=(0, 100),
            classes={"busy": (_i64(0, 50), _i64(40, 90)), "straggler_wait": (_i64(40), _i64(50))},
            contention_ns=3,
            caused_ns={1: 10},
            by_role_ns={("straggler_wait", "embedding"): 10},
        ),
        StepBubbles(
            rank=2,
            step=1,
            window=(100, 150),
            classes={"straggler_wait": (_i64(), _i64()), "busy": (np.array([100.5]), _i64(149))},
        ),
    ]
    after = unpack_bubbles(pack_bubbles(steps))
    for old, new in zip(steps, after, strict=True):
        assert type(new) is StepBubbles
        assert list(new.classes) == list(old.classes)
        for name, intervals in old.classes.items():
            assert _same(intervals, new.classes[name]), name
        assert (new.rank, new.step, new.window) == (old.rank, old.step, old.window)
        assert (new.contention_ns, new.caused_ns, new.by_role_ns) == (
            old.contention_ns,
            old.caused_ns,
            old.by_role_ns,
        )
    assert after[1].classes["busy"][0].dtype == np.float64
    assert unpack_bubbles(pack_bubbles([])) == []
