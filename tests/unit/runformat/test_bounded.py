"""``run.json`` and step sidecars are read with a size bound (issue 25): a 2 GB ``run.json`` or a
sidecar line of 1 GB is refused in one line naming the file and the limit, in memory bounded by
the limit (the big files are sparse: they take no disk and no time to write)."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dashboard.balance_plan import stored_cost_model
from dashboard.store import list_runs
from fsobs.cli import main
from fsobs.errors import TraceReadError
from fsobs.runformat import read_run_json, read_sidecars
from fsobs.runformat.bounded import (
    CHUNK,
    MAX_RUN_JSON_BYTES,
    MAX_SIDECAR_LINE_BYTES,
    iter_lines,
    read_limited,
)
from tests.support.kineto import write_allreduce_run

MiB, GiB = 2**20, 2**30
GOOD_LINE = b'{"step": 1, "seq_lengths": [3, 5]}\n'


def _sparse(path: Path, head: bytes, size: int) -> Path:
    """``head``, then zero bytes up to ``size`` (a hole: nothing written)."""
    with path.open("wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def _peak(call: Callable[[], Any]) -> tuple[BaseException, int]:
    """The exception ``call`` raises and the peak bytes Python allocated meanwhile."""
    tracemalloc.start()
    try:
        call()
    except BaseException as exc:  # the caller checks what it is
        return exc, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    raise AssertionError("no error")


def test_the_limits_are_the_documented_ones():
    assert (MAX_RUN_JSON_BYTES, MAX_SIDECAR_LINE_BYTES) == (16 * MiB, 64 * MiB)


def test_a_2_gb_run_json_is_refused_in_bounded_memory(tmp_path):
    path = _sparse(tmp_path / "run.json", b'{"name": "x"', 2 * GiB)
    error, peak = _peak(lambda: read_run_json(tmp_path))
    assert isinstance(error, TraceReadError)
    assert str(error) == f"{path}: run metadata is over the 16 MiB limit"
    assert peak < 3 * MAX_RUN_JSON_BYTES  # the bytes read, grown in place (2 GiB otherwise)


def test_a_1_gb_sidecar_line_is_refused_in_bounded_memory(tmp_path):
    path = _sparse(tmp_path / "steps.rank1.jsonl", GOOD_LINE + b'{"step": 2', GiB)
    error, peak = _peak(lambda: read_sidecars(tmp_path))
    assert isinstance(error, TraceReadError)
    assert (error.path, error.rank, error.field) == (str(path), 1, "line 2")
    assert (
        str(error)
        == f"{path}: rank 1: field line 2: step record is over the 64 MiB limit of a line"
    )
    assert peak < 3 * MAX_SIDECAR_LINE_BYTES


def test_run_json_at_the_limit_reads_one_byte_more_does_not(tmp_path):
    text = b'{"name": "x"}'
    path = tmp_path / "run.json"
    path.write_bytes(text + b" " * (MAX_RUN_JSON_BYTES - len(text)))
    assert read_run_json(tmp_path).name == "x"
    path.write_bytes(text + b" " * (MAX_RUN_JSON_BYTES + 1 - len(text)))
    with pytest.raises(TraceReadError, match="over the 16 MiB limit"):
        read_run_json(tmp_path)


def test_lines_up_to_the_limit_across_chunks(tmp_path):
    """Lines of exactly ``limit`` bytes, one spanning three chunks, a blank one and a last one
    without its newline come back whole and numbered; one byte more is refused at its line."""
    limit = 2 * CHUNK + 10
    lines = [b"a" * limit, b"", b"b" * 7, b"c" * limit]
    path = tmp_path / "f"
    path.write_bytes(b"\n".join(lines))
    assert list(iter_lines(path, limit)) == list(enumerate(lines, start=1))
    path.write_bytes(b"\n".join([*lines, b"d" * (limit + 1)]))
    with pytest.raises(TraceReadError) as error:
        list(iter_lines(path, limit, rank=4))
    assert (error.value.rank, error.value.field) == (4, "line 5")


def test_read_limited_at_and_over_the_limit(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * (CHUNK + 3))
    assert read_limited(path, CHUNK + 3, "thing") == b"x" * (CHUNK + 3)
    with pytest.raises(TraceReadError, match=f"^{path}: thing is over the 1 MiB limit$"):
        read_limited(path, CHUNK, "thing")


def _run(root: Path) -> Path:
    write_allreduce_run(root, [(100, 60), (80, 120)])
    return root


@pytest.mark.parametrize("which", ["run.json", "sidecar"])
def test_the_cli_refuses_in_one_line(which, tmp_path, capsys):
    root = _run(tmp_path / "run")
    if which == "run.json":
        path = _sparse(root / "run.json", b"{", 2 * GiB)
        wanted = f"{path}: run metadata is over the 16 MiB limit"
    else:
        path = _sparse(root / "steps.rank1.jsonl", GOOD_LINE, GiB)
        wanted = f"{path}: rank 1: field line 2: step record is over the 64 MiB limit of a line"
    for argv in (["analyze", str(root)], ["fit-cost", str(root)], ["whatif", str(root)]):
        assert main(argv) == 2
        assert capsys.readouterr() == ("", f"fsobs: error: {wanted}\n")


def test_the_dashboard_store_reads_run_json_with_the_bound(tmp_path):
    root = _run(tmp_path / "store" / "big")
    path = _sparse(root / "run.json", json.dumps({"name": "big"}).encode(), 2 * GiB)
    (entry,) = list_runs(tmp_path / "store")
    assert entry.meta is None
    assert entry.meta_error == f"run.json unreadable: {path}: run metadata is over the 16 MiB limit"


def test_a_2_gb_cost_model_is_refused_in_bounded_memory(tmp_path, capsys):
    """``--cost-model`` and the dashboard's stored ``cost_model.json``: one line naming the file
    and the 1 MiB limit, after reading at most the limit."""
    root = _run(tmp_path / "run")
    path = _sparse(root / "cost_model.json", b"{", 2 * GiB)
    tracemalloc.start()
    try:
        choice, why = stored_cost_model(root)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * MiB
    assert choice is None and why == "cost_model.json: cost model is over the 1 MiB limit"
    assert main(["whatif", str(root), "--cost-model", str(path)]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"fsobs: error: bad cost model: {path}: over the 1 MiB limit of a cost model file\n"
    )
