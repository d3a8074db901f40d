"""msgspec's errors in the run format's words: the field first, then what it must be and got."""

from __future__ import annotations

import dataclasses
import math
import pickle
from pathlib import Path
from typing import Literal

import msgspec
import pytest

from fsobs.runformat.structs import FieldError, convert


class _Inner(msgspec.Struct, forbid_unknown_fields=True):
    size: int


class _Outer(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    counts: list[int] = []
    share: float | None = None
    inner: _Inner | None = None


@pytest.mark.parametrize(
    ("obj", "wanted"),
    [
        ({"name": 3}, "name: must be a string, got 3"),
        ({"name": "a", "counts": [1, 2.5]}, "counts: must be an integer, got 2.5"),
        ({"name": "a", "counts": "12"}, "counts: must be a list, got '12'"),
        ({"name": "a", "share": True}, "share: must be a number, got True"),
        ({"name": "a", "inner": {"size": "x"}}, "inner.size: must be an integer, got 'x'"),
        (
            {"name": "a", "inner": {"size": 1, "colour": 2}},
            "inner.colour: unknown field; expected one of ['size']",
        ),
        (
            {"name": "a", "colour": 2},
            "colour: unknown field; expected one of ['name', 'counts', 'share', 'inner']",
        ),
        ({"counts": []}, "name: required, but missing"),
        ({"name": "a", "inner": {}}, "inner.size: required, but missing"),
        ([1], "must be an object, got [1]"),
    ],
)
def test_errors_name_the_field_and_the_value(obj, wanted):
    with pytest.raises(FieldError) as info:
        convert(obj, _Outer)
    assert str(info.value) == wanted


def test_good_input_is_converted_strictly():
    assert convert({"name": "a", "share": 1}, _Outer) == _Outer(name="a", share=1.0)
    with pytest.raises(FieldError, match="^name: must be a string, got 1$"):
        convert({"name": 1}, _Outer)  # never str(1)


class _Ruled(msgspec.Struct):
    low: int = 0
    high: int = 1

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise FieldError("high", f"must be >= low ({self.low}), got {self.high}")


@pytest.mark.parametrize(
    ("obj", "kind", "field"),
    [
        ({"name": "a", "inner": {"size": "x"}}, _Outer, "inner.size"),
        ({"name": "a", "counts": [1, 2.5]}, _Outer, "counts"),
        ({"name": "a", "inner": {"size": 1, "colour": 2}}, _Outer, "inner.colour"),
        ({}, _Outer, "name"),
        ({"low": 2}, _Ruled, "high"),  # a rule of __post_init__ keeps its field
    ],
)
def test_the_error_carries_the_field(obj: object, kind: type, field: str) -> None:
    with pytest.raises(FieldError) as info:
        convert(obj, kind)
    assert info.value.field == field


# ---- dataclasses: what a config's from_json relies on ----
@dataclasses.dataclass(kw_only=True, frozen=True)
class _Limits:
    low: int = 0
    high: int = 1
    scale: float = 1.0

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise FieldError("high", f"must be >= low ({self.low}), got {self.high}")


@dataclasses.dataclass(kw_only=True, frozen=True)
class _Config:
    limits: _Limits = dataclasses.field(default_factory=_Limits)
    mode: Literal["x", "y"] = "x"
    dims: tuple[int, ...] = (1,)
    where: Path | None = None


@pytest.mark.parametrize(
    ("obj", "wanted"),
    [
        ({"limits": {"low": 3, "high": 2}}, "limits.high: must be >= low (3), got 2"),
        (
            {"limits": {"colour": 1}},
            "limits.colour: unknown field; expected one of ['low', 'high', 'scale']",
        ),
        ({"limits": {"scale": math.inf}}, "limits.scale: must be a finite number, got inf"),
        ({"limits": {"scale": math.nan}}, "limits.scale: must be a finite number, got nan"),
        ({"limits": {"low": True}}, "limits.low: must be an integer, got True"),
        ({"limits": []}, "limits: must be an object, got []"),
        ({"mode": "z"}, "mode: must be one of ['x', 'y'], got 'z'"),
        ({"dims": [1, "2"]}, "dims: must be an integer, got '2'"),
        ({"where": 3}, "where: must be a path (a string), got 3"),
    ],
)
def test_a_dataclass_field_is_named_from_the_top(obj: object, wanted: str) -> None:
    with pytest.raises(FieldError) as info:
        convert(obj, _Config)
    assert str(info.value) == wanted


def test_a_dataclass_is_built_from_json_with_its_defaults() -> None:
    got = convert({"limits": {"high": 5}, "dims": [2, 3], "where": "a/b"}, _Config)
    assert got == _Config(limits=_Limits(high=5), dims=(2, 3), where=Path("a/b"))
    assert convert({}, _Config) == _Config()


def test_a_field_error_survives_a_process_pool() -> None:
    error = pickle.loads(pickle.dumps(FieldError("a.b", "must be >= 1, got 0")))
    assert (error.field, error.reason, str(error)) == (
        "a.b",
        "must be >= 1, got 0",
        "a.b: must be >= 1, got 0",
    )
    assert FieldError("", "bad").within("x").field == "x"
