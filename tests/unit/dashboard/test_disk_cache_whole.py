"""A disk-cache entry is fresh only when it is whole (issue 25, point 8: a truncated entry was
called fresh, so the Runs table took a big run for analyzed and parsed it unasked).

An entry is a JSON header line, the pickled analysis, and right after it an end line
``fsobs-cache-end <pickle length, 16 hex digits> <sha256 of the pickle, 64 hex digits>\\n``
(:data:`END_LEN` bytes); these tests read the file back by that rule, then damage it.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from pathlib import Path

import pytest

from dashboard import disk_cache
from dashboard.cache import is_cheap
from dashboard.store import list_runs
from fsobs import Analysis, analyze_path

RUN_ID = "sim/control"
END_LEN = len("fsobs-cache-end ") + 16 + 1 + 64 + 1


@pytest.fixture
def store(store: Path) -> Path:
    """The conftest's private store copy, without the cache the app tests may have left."""
    shutil.rmtree(store / disk_cache.CACHE_DIR, ignore_errors=True)
    return store


@pytest.fixture(scope="module")
def analysis(shared_store: Path) -> Analysis:
    return analyze_path(shared_store / RUN_ID)


def _written(store: Path, analysis: Analysis) -> tuple[Path, bytes, object]:
    signature = next(e for e in list_runs(store) if e.run_id == RUN_ID).signature
    assert disk_cache.write(store, RUN_ID, signature, analysis)
    path = disk_cache.entry_path(store, RUN_ID)
    return path, path.read_bytes(), signature


def test_an_entry_is_header_pickle_and_end_line(store, analysis):
    path, data, signature = _written(store, analysis)
    header_end = data.index(b"\n") + 1
    header = json.loads(data[:header_end])
    assert header["format"] == 2 and header["run_id"] == RUN_ID
    end_start = len(data) - END_LEN
    payload, end = data[header_end:end_start], data[end_start:]
    digest = hashlib.sha256(payload).hexdigest()
    assert end == f"fsobs-cache-end {len(payload):016x} {digest}\n".encode()
    again = pickle.loads(payload)
    assert isinstance(again, Analysis) and again.steps.equals(analysis.steps)
    assert disk_cache.is_fresh(store, RUN_ID, signature)


def _cuts(data: bytes) -> dict[str, bytes]:
    header_end = data.index(b"\n") + 1
    end_start = len(data) - END_LEN
    return {
        "one byte short": data[:-1],
        "end line half gone": data[: end_start + 20],
        "no end line": data[:end_start],
        "half the pickle": data[: (header_end + end_start) // 2],
        "header only": data[:header_end],
        "a byte too many": data + b"x",
        "end line twice": data + data[end_start:],
    }


@pytest.mark.parametrize(
    "damage",
    [
        "one byte short",
        "end line half gone",
        "no end line",
        "half the pickle",
        "header only",
        "a byte too many",
        "end line twice",
    ],
)
def test_a_cut_or_lengthened_entry_is_not_fresh_and_not_read(store, analysis, damage):
    path, data, signature = _written(store, analysis)
    path.write_bytes(_cuts(data)[damage])
    assert not disk_cache.is_fresh(store, RUN_ID, signature)
    assert disk_cache.read(store, RUN_ID, signature) is None
    assert disk_cache.write(store, RUN_ID, signature, analysis)  # the next analysis replaces it
    assert disk_cache.is_fresh(store, RUN_ID, signature)


def test_a_flipped_byte_in_the_pickle_is_never_unpickled(store, analysis):
    """Same length, so ``is_fresh`` (which reads no pickle) cannot tell; ``read`` checks the
    digest and analyzes again rather than return a silently different analysis."""
    path, data, signature = _written(store, analysis)
    header_end = data.index(b"\n") + 1
    damaged = bytearray(data)
    damaged[header_end + 200] ^= 0x01
    path.write_bytes(bytes(damaged))
    assert disk_cache.is_fresh(store, RUN_ID, signature)
    assert disk_cache.read(store, RUN_ID, signature) is None


def test_a_truncated_entry_does_not_make_a_big_run_look_analyzed(store, analysis, monkeypatch):
    """What the Runs table goes by: a run over the size it analyzes unasked counts as cheap only
    if it was analyzed already; a cut entry is no such proof."""
    monkeypatch.setattr("dashboard.cache.AUTO_ANALYZE_BYTES", 0)  # every run is "big"
    path, data, _ = _written(store, analysis)
    entry = next(e for e in list_runs(store) if e.run_id == RUN_ID)
    assert is_cheap(store, entry)
    path.write_bytes(data[:-1])
    assert not is_cheap(store, entry)
