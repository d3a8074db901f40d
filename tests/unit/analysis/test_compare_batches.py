"""How ``fsobs compare`` tells whether two runs trained on the same global batches, and says by
what: batch digests, sample ids, batch totals, run.json, or nothing. The runs' step sidecars are
written with :mod:`fsobs.runformat` and read back, as ``fsobs compare`` reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fsobs.analysis import compare
from fsobs.analysis.comparison.ab import batch_check
from fsobs.report import compare_json
from fsobs.report.comparison import batch_line
from fsobs.runformat import StepRecord, read_sidecars, write_sidecar
from tests.unit.analysis.test_compare import CONTROL, TEST, WORKLOAD, _analysis, _steps

# (rank, step) -> the samples trained, as (sample id, length); two ranks, steps 0 and 1
BASE = {
    (0, 0): [(1, 100), (2, 10)],
    (1, 0): [(3, 50), (4, 60)],
    (0, 1): [(5, 7), (6, 8)],
    (1, 1): [(7, 9), (8, 300)],
}
# the same samples, moved between the ranks (what balancing does)
MOVED = {
    (0, 0): [(1, 100), (4, 60)],
    (1, 0): [(3, 50), (2, 10)],
    (0, 1): [(5, 7), (8, 300)],
    (1, 1): [(7, 9), (6, 8)],
}
# step 1 trains sample 9 instead of sample 6: the same length (8), so the same totals
SWAPPED = MOVED | {(1, 1): [(7, 9), (9, 8)]}

TOTALS = "totals only (samples, sum of lengths, sum of squared lengths)"


def _write(
    root: Path,
    samples: dict[tuple[int, int], list[tuple[int, int]]],
    *,
    ids: bool = True,
    digests: dict[int, str] | None = None,
) -> Any:
    """Write the sidecars of ``samples`` into ``root`` (with ``sample_ids`` unless ``ids`` is
    false; ``digests``: step -> batch digest) and read them back as one frame."""
    root.mkdir(exist_ok=True)
    for rank in sorted({r for r, _ in samples}):
        records = []
        for (r, step), listed in sorted(samples.items()):
            if r != rank:
                continue
            extra: dict[str, Any] = {"sample_ids": [i for i, _ in listed]} if ids else {}
            if digests is not None:
                extra["batch_digest"] = digests[step]
            lengths = [n for _, n in listed]
            records.append(StepRecord.of(step, lengths, None, 0, 1, **extra))
        write_sidecar(root, rank, records)
    return read_sidecars(root)


def _pair(tmp_path: Path, control: Any, test: Any, metas: tuple[Any, Any] = (None, None)):
    return (
        _analysis(_steps(CONTROL), sidecar=control, meta=metas[0]),
        _analysis(_steps(TEST), sidecar=test, meta=metas[1]),
    )


def test_digests_decide_first_and_the_line_says_so(tmp_path):
    digests = {0: "aa", 1: "bb"}
    a = _write(tmp_path / "a", BASE, digests=digests)
    b = _write(tmp_path / "b", MOVED, digests=digests)
    c = compare(*_pair(tmp_path, a, b))
    check = c.batch_check
    assert (check.same, check.basis, check.checked, check.skipped) == (True, "digest", [0, 1], [])
    assert batch_line(check) == "yes, by batch digest on all 2 common steps"
    assert compare_json(c)["same_batches_check"] == {
        "same": True,
        "basis": "digest",
        "unit": "step",
        "window_steps": 1,
        "checked": 2,
        "differing": 0,
        "first_differing": None,
        "weaker_because": [],
    }


def test_sample_ids_when_there_are_no_digests(tmp_path):
    a = _write(tmp_path / "a", BASE)
    b = _write(tmp_path / "b", MOVED)
    check = compare(*_pair(tmp_path, a, b)).batch_check
    assert (check.same, check.basis, check.checked) == (True, "sample_ids", [0, 1])
    assert batch_line(check) == (
        "yes, by sample ids on all 2 common steps: neither run has batch digests"
    )


def test_sample_ids_find_a_mismatch_that_the_totals_miss(tmp_path):
    """SWAPPED trains sample 9 for sample 6 in step 1, both of length 8: per step the totals
    (samples 4 and 4, lengths 315 and 315 in step 1, squares 81+90000+49+64 both) agree."""
    a = _write(tmp_path / "a", BASE)
    b = _write(tmp_path / "b", SWAPPED)
    c = compare(*_pair(tmp_path, a, b))
    check = c.batch_check
    assert c.same_batches is False
    assert (check.basis, check.checked, check.differing) == ("sample_ids", [0, 1], [1])
    assert batch_line(check) == (
        "no, by sample ids: 1 of 2 common steps differ (first: step 1): neither run has batch "
        "digests"
    )
    assert (
        "the runs did not see the same global batches: sample ids differ in 1 of 2 common steps "
        "(first: step 1)"
    ) in c.warnings
    out = compare_json(c)["same_batches_check"]
    assert (out["same"], out["differing"], out["first_differing"]) == (False, 1, 1)
    # the same sidecars without their ids: the totals cannot tell the swap
    a = _write(tmp_path / "a2", BASE, ids=False)
    b = _write(tmp_path / "b2", SWAPPED, ids=False)
    check = batch_check(a_run(a), a_run(b))
    assert (check.same, check.warnings) == (True, [])


def a_run(sidecar: Any) -> Any:
    return _analysis(_steps(CONTROL), sidecar=sidecar).run


def test_totals_only_say_why_and_which_run_lacks_the_ids(tmp_path):
    a = _write(tmp_path / "a", BASE, ids=False)
    b = _write(tmp_path / "b", MOVED, ids=False)
    check = batch_check(a_run(a), a_run(b))
    assert (check.same, check.basis, check.checked) == (True, "totals", [0, 1])
    assert batch_line(check) == (
        f"yes, by {TOTALS} on all 2 common steps: neither run has batch digests; neither run "
        "has sample ids"
    )
    with_ids = _write(tmp_path / "c", BASE)
    check = batch_check(a_run(with_ids), a_run(b))
    assert check.basis == "totals"
    assert check.skipped == ["neither run has batch digests", "the test run has no sample ids"]
    # rank 1 lacks step 1: only step 0 is every rank's in both runs
    partial = _write(tmp_path / "d", {k: v for k, v in MOVED.items() if k != (1, 1)}, ids=False)
    check = batch_check(a_run(a), a_run(partial))
    assert batch_line(check).startswith(f"yes, by {TOTALS} on the 1 common step: ")


def test_ids_of_some_ranks_only_fall_back_to_the_totals(tmp_path):
    # rank 0 of the test lists its ids, rank 1 does not: no step has the ids of every rank
    (tmp_path / "b").mkdir()
    _write(tmp_path / "b", {k: v for k, v in MOVED.items() if k[0] == 0})
    rank1 = [StepRecord.of(s, [n for _, n in MOVED[1, s]], None, 0, 1) for s in (0, 1)]
    write_sidecar(tmp_path / "b", 1, rank1)
    a = _write(tmp_path / "a", BASE)
    check = batch_check(a_run(a), a_run(read_sidecars(tmp_path / "b")))
    assert (check.same, check.basis) == (True, "totals")
    assert check.skipped[-1] == "no step has sample ids of every rank in both runs"


def _meta(**workload: Any) -> dict[str, Any]:
    return {"name": "r", "world_size": 2, "workload": WORKLOAD | workload}


def test_run_json_only_and_cannot_tell(tmp_path):
    c = compare(*_pair(tmp_path, None, None, metas=(_meta(), _meta())))
    assert (c.batch_check.basis, c.same_batches) == ("run_json", True)
    assert batch_line(c.batch_check) == (
        "yes, by run.json workload only: neither run has step sidecars"
    )
    c = compare(*_pair(tmp_path, None, None))
    assert (c.batch_check.basis, c.same_batches) == ("none", None)
    assert batch_line(c.batch_check) == (
        "cannot tell (no basis: neither run has step sidecars; no workload in both run.json)"
    )


# a window of 2 steps: samples moved between the ranks and the steps of the window
WINDOWED = {
    (0, 0): [(1, 100), (8, 300), (5, 7)],
    (1, 0): [(3, 50)],
    (0, 1): [(2, 10), (6, 8)],
    (1, 1): [(4, 60), (7, 9)],
}


@pytest.mark.parametrize("ids", [True, False])
def test_a_window_run_compares_each_window(tmp_path, ids):
    """Over the window of steps 0-1 both runs train samples 1-8 (8 samples, 544 tokens)."""
    metas = (_meta(), _meta(balance_window=2))
    a = _write(tmp_path / "a", BASE, ids=ids)
    b = _write(tmp_path / "b", WINDOWED, ids=ids)
    check = compare(*_pair(tmp_path, a, b, metas=metas)).batch_check
    basis = "sample_ids" if ids else "totals"
    assert (check.same, check.basis, check.window, check.checked) == (True, basis, 2, [0])
    name = "sample ids" if ids else TOTALS
    reason = "" if ids else ": neither run has sample ids"
    assert (
        batch_line(check)
        == f"yes, by {name} over each window of 2 steps on the 1 common window{reason}"
    )


def test_a_window_run_ids_find_a_swap_of_equal_length(tmp_path):
    metas = (_meta(), _meta(balance_window=2))
    swapped = WINDOWED | {(0, 1): [(2, 10), (9, 8)]}  # sample 9 for sample 6, both length 8
    a = _write(tmp_path / "a", BASE)
    c = compare(*_pair(tmp_path, a, _write(tmp_path / "b", swapped), metas=metas))
    assert c.same_batches is False
    assert (c.batch_check.basis, c.batch_check.differing) == ("sample_ids", [0])
    assert (
        "the runs did not see the same global batches: sample ids over each window of 2 steps "
        "differ in 1 of 1 common windows (first: window 0)"
    ) in c.warnings
