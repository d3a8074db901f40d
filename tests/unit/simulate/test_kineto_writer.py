"""The Kineto trace text both simulated-trace writers share: µs, header, footer, events."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from fsobs.runformat import trace_file_name
from fsobs.simulate.kineto_writer import (
    COMPACT,
    KINETO,
    Layout,
    compact_event,
    footer,
    header,
    process_group,
    us,
)


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0.000"),
        (1, "0.001"),
        (1500, "1.500"),
        (1_000_000, "1000.000"),
        (-1, "-0.001"),  # floor division gave "-1.999"
        (-1500, "-1.500"),  # floor division gave "-2.500"
        (-1000, "-1.000"),
        (-999_999, "-999.999"),
    ],
)
def test_us_is_exact_for_both_signs(ns: int, text: str) -> None:
    assert us(ns) == text


def test_us_round_trips_every_value_near_zero() -> None:
    for ns in range(-3_000, 3_001):
        assert Decimal(us(ns)) * 1000 == ns


def test_trace_file_name() -> None:
    assert trace_file_name(3) == "rank3.trace.json.gz"
    assert trace_file_name(3, gzip=False) == "rank3.trace.json"


@pytest.mark.parametrize("layout", [COMPACT, KINETO])
def test_header_and_footer_enclose_events_as_one_json_object(layout: Layout) -> None:
    groups = [process_group("0", "default_pg", 2)]
    head = header(
        layout,
        rank=1,
        world_size=2,
        groups=groups,
        devices='[{"id": 0}]',
        host="sim-node0",
        environment=[("with_stack", "0")],
    )
    event = compact_event("kernel", "k", 0, 7, 2500, -1, '"correlation":1')
    trace = json.loads(head + event + footer(layout, 123, trace_name="r.json"))
    assert list(trace) == [
        "schemaVersion",
        "deviceProperties",
        "distributedInfo",
        "with_stack",
        "host_name",
        "traceEvents",
        "traceName",
        "displayTimeUnit",
        "baseTimeNanoseconds",
    ]
    assert trace["distributedInfo"]["rank"] == 1
    assert trace["distributedInfo"]["pg_config"] == groups
    assert trace["baseTimeNanoseconds"] == 123
    assert trace["traceEvents"] == [
        {
            "ph": "X",
            "cat": "kernel",
            "name": "k",
            "pid": 0,
            "tid": 7,
            "ts": 2.5,
            "dur": -0.001,
            "args": {"correlation": 1},
        }
    ]


def test_compact_layout_is_one_line_per_event() -> None:
    head = header(COMPACT, rank=0, world_size=1, groups=[], devices="[]", host="h")
    assert head.count("\n") == 1 and head.endswith('"traceEvents":[\n')
    assert footer(COMPACT, 5) == '\n],"displayTimeUnit":"ms","baseTimeNanoseconds":5}\n'
