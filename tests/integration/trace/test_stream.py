"""The streaming reader gives exactly what the whole-file reader gives, and falls back safely."""

from __future__ import annotations

import gzip
import json

import pytest

from fsobs.trace import _build, _decode
from tests.support.kineto import REFERENCE, kernel, launch, step, trace, x

BIG = 2**34


def _same(path, *, streams=True):
    """The public reader equals the whole-file reader; ``streams``: without falling back."""
    a = (
        _build._build_streaming(path, BIG, BIG)
        if streams
        else _build.build_rank_trace(path, BIG, BIG)
    )
    b = _build._build_whole(path, BIG, False)
    assert a.events.equals(b.events)
    assert a.collectives.equals(b.collectives)
    assert (a.rank, a.world_size, a.host_name, a.process_groups) == (
        b.rank,
        b.world_size,
        b.host_name,
        b.process_groups,
    )
    assert a.thread_names == b.thread_names and a.device_properties == b.device_properties
    return a


@pytest.mark.parametrize(
    "path", sorted(REFERENCE.rglob("*.json.gz")), ids=lambda p: str(p.relative_to(REFERENCE))
)
def test_streaming_equals_whole_file_on_every_reference_trace(path):
    _same(path)


def _events(n):
    out = [step(1, 0, 10_000)]
    for i in range(n):
        out += [launch(10 + i, corr=i), kernel(f"k{i % 7}", 20 + i, 1, corr=i)]
    return out


@pytest.mark.parametrize(
    "dump",
    [
        lambda d: json.dumps(d),  # "}, {"
        lambda d: json.dumps(d, separators=(",", ":")),  # "},{"
        lambda d: json.dumps(d, indent=2),  # Kineto-like lines
    ],
    ids=["spaced", "compact", "indented"],
)
def test_layouts_and_many_pieces(tmp_path, monkeypatch, dump):
    monkeypatch.setattr(_decode, "PIECE", 4096)  # many pieces, cuts everywhere
    doc = trace(_events(3000), rank=1, world_size=2)
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(dump(doc).encode()))
    assert _same(path).rank == 1


def test_keys_after_trace_events(tmp_path, monkeypatch):
    """Kineto's on-demand path writes distributedInfo after traceEvents."""
    monkeypatch.setattr(_decode, "PIECE", 1024)
    doc = trace(_events(200), rank=None)
    doc["distributedInfo"] = {
        "rank": 3,
        "world_size": 4,
        "pg_config": [{"pg_name": "0", "ranks": "[0, 1, 2, 3]"}],
    }
    doc["traceName"] = "out/rank3.json"
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    got = _same(path)
    assert got.rank == 3 and got.process_groups[0].ranks == (0, 1, 2, 3)


def test_misleading_text_inside_strings_falls_back(tmp_path, monkeypatch):
    """A cut inside a string makes a piece that does not decode: the whole-file path takes over."""
    monkeypatch.setattr(_decode, "PIECE", 512)
    events = _events(50) + [x("weird}, {name", "cpu_op", 1, 1), x('q\\"}, {\\"', "cpu_op", 2, 1)]
    doc = trace(events)
    doc["traceName"] = "x]}, {y"
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(Exception):  # noqa: B017 (any failure: the reader falls back)
        _build._build_streaming(path, BIG, BIG)
    got = _same(path, streams=False)
    assert set(got.events["name"].astype(str)) >= {"weird}, {name", 'q\\"}, {\\"'}
    assert len(got.events) == len(events)


def test_empty_trace_events(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace([])))
    assert len(_same(path).events) == 0
