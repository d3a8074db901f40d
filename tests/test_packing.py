"""A rank's step parts survive the packed pickle (fsobs.analysis.bubbles.packing) whole: every
field, every array's values and dtype, empty arrays and arrays of several dtypes included."""

from __future__ import annotations

import numpy as np

from fsobs.analysis.bubbles.packing import pack, unpack
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
