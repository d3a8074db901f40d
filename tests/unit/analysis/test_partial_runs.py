"""Partial runs analyze (issue 25 point 5): a sidecar lacking steps, a missing sidecar, lines
written twice or contradicting, a second sidecar file for one rank, a trace without events or
steps. Each gap is said with its rank, the rest is analyzed, and nothing is concluded from
what is missing.

The runs are :func:`tests.support.kineto.write_allreduce_run`'s: two GPU ranks, four steps, rank 0
computes 100 µs and rank 1 300 µs in every step, so rank 1 is the straggler of every step and
rank 0 waits 200 µs for it. The sidecars (written with :mod:`fsobs.runformat`) give rank 0 four
samples of length ``L0`` and rank 1 four of length 20 per step: costs (``len_sq_sum``, no
``est_cost``) ``4·L0²`` and ``4·20² = 1600``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import fsobs
from fsobs.analysis import analyze, compare, fit_cost
from fsobs.analysis.whatif.predict import whatif
from fsobs.cli import main
from fsobs.errors import RunError
from fsobs.report import findings, to_json
from fsobs.runformat.steps import StepRecord, write_sidecar
from tests.support.bubble_rows import expect_row
from tests.support.kineto import gemm, trace, write, write_allreduce_run

STEPS = (1, 2, 3, 4)
COSTS = [(100, 300)] * len(STEPS)


def _record(step: int, length: int) -> StepRecord:
    return StepRecord.of(step, [length] * 4, None, 1_000 * step, 1_000 * step + 500)


def _run(tmp_path: Path, sidecars: dict[int, list[StepRecord]]) -> Path:
    run_dir = write_allreduce_run(tmp_path / "run", COSTS)
    for rank, records in sidecars.items():
        write_sidecar(run_dir, rank, records)
    return run_dir


def _rank0(length: int = 10, steps: tuple[int, ...] = STEPS) -> list[StepRecord]:
    return [_record(s, length) for s in steps]


def _rank1(steps: tuple[int, ...] = STEPS) -> list[StepRecord]:
    return [_record(s, 20) for s in steps]


def test_a_sidecar_lacking_a_step_names_the_rank_and_judges_the_rest(tmp_path):
    """Rank 1's sidecar stops at step 3: step 4 has a straggler but not every rank's data, so
    the attribution judges steps 1-3 (rank 1 alone costliest: 1600 against 4·10² = 400, 1.6x
    the mean of 1000) and says step 4 was left out; the fit lacks the point (1, 4)."""
    run_dir = _run(tmp_path, {0: _rank0(), 1: _rank1((1, 2, 3))})
    result = analyze(fsobs.load_run(run_dir))
    assert (
        "rank 1: its step sidecar lacks step(s) 4 of its trace; its input data for those steps "
        "is unknown"
    ) in result.run.warnings
    attr = result.attribution
    assert attr is not None and attr.cost_source == "len_sq_sum"
    assert attr.per_step["step"].tolist() == [1, 2, 3]
    assert attr.per_step["cost_ratio"].tolist() == pytest.approx([1600 / 1000] * 3)
    assert attr.steps_without_data == [4]
    assert attr.verdict == "explains"
    assert result.gaps.sidecar is not None and result.gaps.sidecar.full_steps == [1, 2, 3]
    assert result.gaps.sidecar.missing == {1: [4]}
    assert any(
        line.startswith("the input data explains it")
        and line.endswith(
            "; 1 step(s) with a straggler (steps 4) left out: some rank has no step sidecar "
            "line for them"
        )
        for line in findings(result)
    )
    fit = fit_cost(result)
    assert fit.n_points == 7
    assert fit.coverage == (
        "fitted on 7 of the 8 analyzed (rank, step) points: the other 1 (rank(s) 1) have no "
        "usable step sidecar line"
    )
    comparison = compare(result, result)
    assert (
        "the control run: rank 1: its step sidecar lacks step(s) 4 of its trace; its input "
        "data for those steps is unknown"
    ) in comparison.warnings
    with pytest.raises(RunError) as info:
        whatif(result, ("balance",), draws=2)
    assert info.value.rank == 1 and "has none for step 4" in str(info.value)
    predicted = whatif(result, ("sm_free",), draws=2)
    assert predicted.notes[0].startswith("rank 1: its step sidecar lacks step(s) 4")


def test_a_missing_sidecar_concludes_nothing(tmp_path):
    """Only rank 0 has a sidecar: no step has every rank's data, so whether the data explains
    the wait is unknown (not "balanced" from rank 0's costs alone), and the fit says it has
    half the points."""
    run_dir = _run(tmp_path, {0: _rank0()})
    result = analyze(fsobs.load_run(run_dir))
    assert (
        "rank 1 has no step sidecar (steps.rank1.jsonl): its input data is unknown"
        in result.run.warnings
    )
    attr = result.attribution
    assert attr is not None and attr.verdict == "unknown" and attr.per_step.empty
    assert attr.steps_without_data == list(STEPS)
    lines = findings(result)
    assert not any(line.startswith("the input data") for line in lines)
    assert (
        "whether the input data explains it is unknown: the 4 step(s) with a straggler (steps "
        "1, 2, 3, 4) lack some rank's step sidecar line (see the warnings)"
    ) in lines
    assert fit_cost(result).coverage == (
        "fitted on 4 of the 8 analyzed (rank, step) points: the other 4 (rank(s) 1) have no "
        "usable step sidecar line"
    )


def test_a_repeated_line_counts_once(tmp_path):
    """Rank 0's lines written twice: summed they would cost 2·4·15² = 1800 > 1600 and the
    attribution would flip to "does not explain"; counted once rank 1 alone is costliest
    (1600 against 900: 1600 / 1250 = 1.28x the mean) and it explains the wait."""
    run_dir = _run(tmp_path, {0: _rank0(15) * 2, 1: _rank1()})
    result = analyze(fsobs.load_run(run_dir))
    assert (
        "rank 0: its step sidecar repeats the line of step(s) 1, 2, 3, 4; counted once"
        in result.run.warnings
    )
    attr = result.attribution
    assert attr is not None and attr.verdict == "explains"
    assert attr.per_step["cost_ratio"].tolist() == pytest.approx([1600 / 1250] * 4)
    assert len(result.run.sidecar) == 8  # one row per (rank, step)


def test_a_second_sidecar_file_for_one_rank_is_named(tmp_path):
    """``steps.rank00.jsonl`` also claims rank 0 (the same lines): both files are named, the
    lines count once, and the attribution is that of the single file."""
    run_dir = _run(tmp_path, {0: _rank0(15), 1: _rank1()})
    shutil.copy(run_dir / "steps.rank0.jsonl", run_dir / "steps.rank00.jsonl")
    result = analyze(fsobs.load_run(run_dir))
    assert (
        "rank 0 has 2 step sidecars (steps.rank0.jsonl, steps.rank00.jsonl): their lines for "
        "the same step count once when identical, and not at all when they differ"
    ) in result.run.warnings
    assert result.attribution is not None and result.attribution.verdict == "explains"
    assert to_json(result)["sidecar"]["files"] == {"0": ["steps.rank0.jsonl", "steps.rank00.jsonl"]}


def test_contradicting_lines_leave_the_step_without_data(tmp_path):
    """Rank 0 logs step 2 twice, with lengths 10 and 30: nothing says which is true, so step 2
    has no data for rank 0 and the attribution judges steps 1, 3, 4 only."""
    records = [_record(1, 10), _record(2, 10), _record(2, 30), _record(3, 10), _record(4, 10)]
    run_dir = _run(tmp_path, {0: records, 1: _rank1()})
    result = analyze(fsobs.load_run(run_dir))
    assert (
        "rank 0: its step sidecar has differing lines for step(s) 2; its data for those steps "
        "is unknown"
    ) in result.run.warnings
    check = result.gaps.sidecar
    assert check is not None and check.conflicting == {0: [2]} and check.missing == {}
    assert check.full_steps == [1, 3, 4]
    side = result.run.sidecar
    assert side is not None and sorted(side.loc[side["rank"] == 0, "step"]) == [1, 3, 4]
    attr = result.attribution
    assert attr is not None and attr.per_step["step"].tolist() == [1, 3, 4]
    assert attr.steps_without_data == [2]


@pytest.mark.parametrize(
    ("events", "why"),
    [
        ([], "its trace has no events"),
        (
            [gemm(10, 300, corr=-1)],
            "its trace has no steps (ProfilerStep) while other ranks' traces have them",
        ),
    ],
)
def test_a_rank_that_cannot_be_split_into_steps_is_left_out(tmp_path, events, why):
    """Rank 1's trace has no events, or no ProfilerStep: it is left out as if missing, and rank
    0 is analyzed alone. Its all_reduce group misses rank 1, which may be the rank it waited
    for, so the all_reduce (300 - 100 + 20 = 220 µs) is unattributed, not a wait."""
    run_dir = _run(tmp_path, {0: _rank0(), 1: _rank1()})
    write(run_dir / "rank1.trace.json", trace(events, rank=1, world_size=2))
    result = analyze(fsobs.load_run(run_dir))
    assert result.gaps.left_out == {1: why}
    assert f"rank 1: {why}; left out of the analysis" in result.run.warnings
    assert result.run.rank_ids == [0]
    assert result.overview["rank"].tolist() == [0, 1]
    table = result.steps.set_index(["rank", "step"])
    for n in STEPS:
        idle = 30 if n < len(STEPS) else 0
        expect_row(table, 0, n, window=320 + idle, busy=100, unattributed=220, host_idle=idle)
    assert any(line.startswith("process group 0 misses ranks 1") for line in findings(result))
    assert to_json(result)["run"]["left_out_ranks"] == {"1": why}


def test_cli_exit_codes_on_a_partial_run(tmp_path, capsys):
    """analyze, compare and fit-cost run (exit 0) and say what is missing; whatif's balance
    cannot re-split a step without every rank's lengths: one line naming the rank, exit 2."""
    run_dir = str(_run(tmp_path, {0: _rank0(), 1: _rank1((1, 2, 3))}))
    assert main(["analyze", run_dir, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sidecar"]["missing_steps"] == {"1": [4]}
    assert report["data_attribution"]["steps_without_data"] == [4]
    assert main(["compare", run_dir, run_dir]) == 0
    assert "rank 1: its step sidecar lacks step(s) 4" in capsys.readouterr().out
    assert main(["fit-cost", run_dir, "--out", str(tmp_path / "cost.json")]) == 0
    assert "warning: fitted on 7 of the 8 analyzed (rank, step) points" in capsys.readouterr().out
    assert main(["whatif", run_dir, "--draws", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rank 1" in err[0] and "step 4" in err[0]
    assert main(["whatif", run_dir, "--draws", "2", "--toggles", "sm_free"]) == 0
