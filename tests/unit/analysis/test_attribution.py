"""Data attribution from step sidecars, on the real 4-rank gloo straggler trace."""

from __future__ import annotations

import json
import shutil

import pytest

import fsobs
from fsobs.analysis import analyze
from fsobs.report import findings
from tests.support.kineto import REFERENCE

STEPS = (2, 3, 4, 5)


@pytest.fixture
def gloo_run(tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(REFERENCE / "synthetic_gloo_a2a_straggler_4rank", run_dir)
    return run_dir


def _write_sidecars(run_dir, lengths_of):
    for rank in range(4):
        with open(run_dir / f"steps.rank{rank}.jsonl", "w") as f:
            for step in STEPS:
                lengths = lengths_of(rank, step)
                record = {"step": step, "num_samples": len(lengths), "seq_lengths": lengths}
                f.write(json.dumps(record) + "\n")


def test_costly_data_on_the_straggler_explains_the_wait(gloo_run):
    # rank 2 (the rank that sleeps) gets 4x longer sequences; rank 3 slightly longer than 0, 1
    _write_sidecars(gloo_run, lambda r, s: [400] * 8 if r == 2 else [100 + 10 * (r == 3)] * 8)
    result = analyze(fsobs.load_run(gloo_run))
    attr = result.attribution
    assert attr is not None and attr.cost_source == "len_sq_sum"
    assert attr.per_step["rank"].tolist() == [2, 2, 2, 2]
    assert attr.per_step["culprit_has_max_cost"].all()
    mean = (2 * 8 * 100**2 + 8 * 110**2 + 8 * 400**2) / 4  # ranks 0, 1 equal; 3 and 2 above
    assert attr.per_step["cost_ratio"].tolist() == pytest.approx([8 * 400**2 / mean] * 4)
    assert attr.explained_wait_share == 1.0
    assert attr.rank_correlation > 0.5
    assert attr.verdict == "explains"
    assert any(line.startswith("the input data explains it") for line in findings(result))


def test_data_that_does_not_match_arrivals_explains_nothing(gloo_run):
    _write_sidecars(gloo_run, lambda r, s: [400] * 8 if r == 0 else [100] * 8)
    result = analyze(fsobs.load_run(gloo_run))
    attr = result.attribution
    assert not attr.per_step["culprit_has_max_cost"].any()
    assert attr.explained_wait_share == 0.0
    assert attr.verdict == "not_explained"
    lines = findings(result)
    assert not any("explains it" in line for line in lines)
    assert any(line.startswith("the input data does not explain it") for line in lines)


def test_equal_costs_are_a_tie_that_explains_nothing(gloo_run):
    """Every rank gets the same lengths: every rank has the largest cost, which is a tie, not
    a culprit with the costliest data; the data is balanced and explains no wait."""
    _write_sidecars(gloo_run, lambda r, s: [100] * 8)
    result = analyze(fsobs.load_run(gloo_run))
    attr = result.attribution
    assert attr.per_step["max_cost_tied"].all()
    assert not attr.per_step["culprit_has_max_cost"].any()
    assert attr.per_step["cost_spread"].tolist() == [0.0] * 4
    assert attr.explained_wait_share == 0.0
    assert attr.verdict == "balanced"
    lines = findings(result)
    assert any(line.startswith("the input data is balanced") for line in lines)
    assert any("4 step(s) had tied largest costs" in line for line in lines)


def test_no_sidecar_no_attribution():
    assert (
        analyze(fsobs.load_run(REFERENCE / "synthetic_gloo_a2a_straggler_4rank")).attribution
        is None
    )


def test_bad_sidecar_line_names_file_rank_and_line(gloo_run):
    _write_sidecars(gloo_run, lambda r, s: [100] * 8)
    with open(gloo_run / "steps.rank1.jsonl", "a") as f:
        f.write('{"step": "x"}\n')
    with pytest.raises(fsobs.TraceFormatError) as info:
        fsobs.load_run(gloo_run)
    message = str(info.value)
    assert "steps.rank1.jsonl" in message and "rank 1" in message and "line 5" in message
