"""msgspec's errors in the run format's words: the field first, then what it must be and got."""

from __future__ import annotations

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
        ({"name": 3}, "name must be a string, got 3"),
        ({"name": "a", "counts": [1, 2.5]}, "counts must be an integer, got 2.5"),
        ({"name": "a", "counts": "12"}, "counts must be a list, got '12'"),
        ({"name": "a", "share": True}, "share must be a number, got True"),
        ({"name": "a", "inner": {"size": "x"}}, "inner.size must be an integer, got 'x'"),
        ({"name": "a", "inner": {"size": 1, "colour": 2}}, "unknown field 'inner.colour'"),
        ({"name": "a", "colour": 2}, "unknown field 'colour'"),
        ({"counts": []}, "name is missing"),
        ({"name": "a", "inner": {}}, "inner.size is missing"),
        ([1], "the value must be an object, got [1]"),
    ],
)
def test_errors_name_the_field_and_the_value(obj, wanted):
    with pytest.raises(ValueError) as info:
        convert(obj, _Outer)
    assert str(info.value) == wanted


def test_good_input_is_converted_strictly():
    assert convert({"name": "a", "share": 1}, _Outer) == _Outer(name="a", share=1.0)
    with pytest.raises(ValueError, match="name must be a string, got 1"):
        convert({"name": 1}, _Outer)  # never str(1)


class _Ruled(msgspec.Struct):
    low: int = 0
    high: int = 1

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise FieldError("high", f"high: must be >= low ({self.low}), got {self.high}")


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
