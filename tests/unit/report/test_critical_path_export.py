"""The critical path in ``fsobs analyze --json``, in the text report, and as flow events in
``fsobs export``'s Perfetto traces, on the two-rank run of
:func:`tests.test_critical_path.two_rank_docs` (its path worked out there by hand)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from fsobs.cli import main
from tests.support.kineto import BASE_NS, write_ranks
from tests.unit.analysis.test_critical_path import two_rank_docs


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_ranks(tmp_path / "run", two_rank_docs())


def _ns(us: float) -> int:
    return BASE_NS + int(us * 1000)


def test_analyze_json_has_the_path_in_the_documented_shape(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bubble charged to the root rank is the step's bubble over both ranks: rank 0's
    window 90 µs less 40 busy (fwd 20 + bwd 20) = 50, rank 1's 90 - 70 = 20: 70 µs. Rank 1 kept
    rank 0 waiting at the all_reduce (no marker: role ``other``) while its GPU worked: cause
    ``gpu_active``."""
    assert main(["analyze", str(run_dir), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["critical_path"]
    keys = ("rank", "kind", "name", "start_ns", "end_ns")
    segments = [(1, "kernel", "fwd", 10, 60), (0, "collective", "all_reduce", 60, 80)]
    segments.append((0, "kernel", "bwd", 80, 100))
    assert got == {
        "steps": [
            {
                "step": 1,
                "root_rank": 1,
                "end_rank": 0,
                "start_ns": _ns(10),
                "end_ns": _ns(100),
                "charged": {
                    "bubble_ms": pytest.approx(0.070),
                    "phase": "other",
                    "cause": "gpu_active",
                },
                "segments": [
                    dict(zip(keys, (r, k, n, _ns(lo), _ns(hi)), strict=True))
                    for r, k, n, lo, hi in segments
                ],
            }
        ]
    }


def test_report_names_the_root_rank_and_the_top_three_segments(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The step time is 90 µs, so durations are in µs; fwd 50 first, then the two 20 µs
    segments in (rank, kind, name) order."""
    assert main(["analyze", str(run_dir)]) == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    at = lines.index("Critical path: root rank 1 in 1 of 1 step(s)")
    assert lines[at + 1 : at + 4] == [
        "rank 1 kernel fwd: 50.0 µs per step",
        "rank 0 collective all_reduce: 20.0 µs per step",
        "rank 0 kernel bwd: 20.0 µs per step",
    ]


def test_export_draws_the_path_with_one_flow_per_jump(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every rank's file has the three segments as slices (µs relative to the trace's base)
    and one arrow: from rank 1's fwd to rank 0's all_reduce, an ``s``/``f`` pair with one id,
    each inside its slice, the ``f`` bound to the enclosing slice (``bp: "e"``)."""
    out = tmp_path / "out"
    assert main(["export", str(run_dir), str(out)]) == 0
    capsys.readouterr()
    for rank in (0, 1):
        doc = json.loads(gzip.decompress((out / f"rank{rank}.trace.json.gz").read_bytes()))
        mine = [e for e in doc["traceEvents"] if e.get("pid") == "fsobs critical path"]
        slices = [(e["tid"], e["name"], e["ts"], e["dur"]) for e in mine if e["ph"] == "X"]
        assert slices == [
            ("rank 1", "kernel fwd", 10.0, 50.0),
            ("rank 0", "collective all_reduce", 60.0, 20.0),
            ("rank 0", "kernel bwd", 80.0, 20.0),
        ]
        flows = [e for e in mine if e["ph"] in ("s", "f")]
        assert [(e["ph"], e["id"], e["tid"], e["ts"]) for e in flows] == [
            ("s", 0, "rank 1", 10.0),
            ("f", 0, "rank 0", 60.0),
        ]
        assert flows[1]["bp"] == "e" and "bp" not in flows[0]
        for flow in flows:  # inside a slice of its own track
            assert any(
                tid == flow["tid"] and ts <= flow["ts"] < ts + dur for tid, _, ts, dur in slices
            )
