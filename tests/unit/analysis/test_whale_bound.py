"""The split bound (fsobs.analysis.whatif.bounds) on the real 4-rank gloo straggler trace
with hand-written step sidecars: per step, in ``analyze``'s findings and JSON, in ``whatif``."""

from __future__ import annotations

import io
import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

import fsobs
from fsobs.analysis import analyze, whatif
from fsobs.analysis.whatif.bounds import run_bounds, split_bounds
from fsobs.report import findings, render_whatif, to_json, whatif_json
from optim.balance import CostModel
from tests.support.kineto import REFERENCE

STEPS = (2, 3, 4, 5)
MODEL = CostModel(c0=100.0, a=1.0, b=0.0)
"""The job's cost model: the sidecars' est_cost is its sum over each rank's samples."""


def _lengths(rank: int, step: int) -> list[int]:
    """Rank 2 (the rank that sleeps in the trace) trains a whale of length 3000 in steps 2-4;
    in step 5 rank 0 trains one of length 2000 instead. Rank 3's samples are 12 long, the
    others' 10 (so that the est_cost rows pin c0, a and b)."""
    whale = {2: 3000, 3: 3000, 4: 3000, 5: 2000}[step]
    small = 12 if rank == 3 else 10
    if rank == (2 if step < 5 else 0):
        return [whale] + [small] * 7
    return [small] * 8


@pytest.fixture
def run_dir(tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(REFERENCE / "synthetic_gloo_a2a_straggler_4rank", run_dir)
    for rank in range(4):
        with open(run_dir / f"steps.rank{rank}.jsonl", "w") as f:
            for step in STEPS:
                lengths = _lengths(rank, step)
                cost = float(sum(100 + length for length in lengths))
                record = {
                    "step": step,
                    "num_samples": len(lengths),
                    "seq_lengths": lengths,
                    "est_cost": cost,
                }
                f.write(json.dumps(record) + "\n")
    return run_dir


# By hand, steps 2-4: rank 2 costs 3100 + 7·110 = 3870, ranks 0, 1 8·110 = 880, rank 3 8·112 =
# 896: total 6526, mean rank load 1631.5. The whale (3100) alone is 3100 / 1631.5 = 1.90x the
# mean. With 8 samples per rank its rank takes 7 more, at best 7 of cost 110: 3870, which is
# the split trained on: no equal-count split does better.
# Step 5: rank 0 costs 2100 + 770 = 2870, ranks 1, 2 880, rank 3 896: total 5526, mean 1381.5.
MEAN = {2: 1631.5, 3: 1631.5, 4: 1631.5, 5: 1381.5}
WHALE = {2: 3100.0, 3: 3100.0, 4: 3100.0, 5: 2100.0}
HEAVIEST = {2: 3870.0, 3: 3870.0, 4: 3870.0, 5: 2870.0}


def test_every_step_bound_by_hand(run_dir):
    analysis = analyze(fsobs.load_run(run_dir))
    assert analysis.stragglers.per_step["rank"].tolist() == [2, 2, 2, 2]
    bounds = run_bounds(analysis)
    assert bounds is not None and bounds.cost_source == "the run's own (est_cost)"
    assert bounds.missing_steps == []
    ps = bounds.per_step.set_index("step")
    assert ps.index.tolist() == list(STEPS)
    for step in STEPS:
        row = ps.loc[step]
        assert row["num_samples"] == 32
        assert row["mean_load"] == pytest.approx(MEAN[step])
        assert row["max_cost"] == pytest.approx(WHALE[step])
        assert row["whale_bound"] == pytest.approx(WHALE[step] / MEAN[step])
        assert row["equal_bound"] == pytest.approx(HEAVIEST[step] / MEAN[step])
        assert row["imbalance"] == pytest.approx(HEAVIEST[step] / MEAN[step])
    assert ps["whale_rank"].tolist() == [2, 2, 2, 0]
    assert ps["straggler_has_whale"].tolist() == [True, True, True, False]


def test_findings_name_the_whale_and_the_bound(run_dir):
    lines = findings(analyze(fsobs.load_run(run_dir)))
    assert (
        "step 2's straggler is a whale: its costliest sample alone is "
        f"{3100 / 1631.5:.2f}x the mean rank load; no split can balance it "
        "(3 steps have such a straggler)"
    ) in lines
    (bound,) = [line for line in lines if line.startswith("split bound over 4 step(s)")]
    mean_equal = (3 * 3870 / 1631.5 + 2870 / 1381.5) / 4
    mean_any = (3 * 3100 / 1631.5 + 2100 / 1381.5) / 4
    assert f"below {mean_equal:.2f} with equal counts, {mean_any:.2f} with any counts" in bound
    assert f"the split trained on had {mean_equal:.2f}" in bound  # it is at the bound
    assert "4 step(s) have a whale" in bound and f"up to {3100 / 1631.5:.2f}x" in bound
    assert bound.endswith("a better split of the same steps cannot help, only moving samples "
                          "across steps")  # fmt: skip


def test_json_split_bound(run_dir):
    got = to_json(analyze(fsobs.load_run(run_dir)))["split_bound"]
    assert got["num_steps"] == 4 and got["num_whale_steps"] == 4
    assert got["num_whale_stragglers"] == 3
    assert got["max_whale_bound"] == pytest.approx(3100 / 1631.5)
    assert got["per_step"][3]["whale_bound"] == pytest.approx(2100 / 1381.5)
    assert got["per_step"][3]["straggler"] == 2.0
    assert got["missing_steps"] == []


def test_no_sidecar_no_bound():
    analysis = analyze(fsobs.load_run(REFERENCE / "synthetic_gloo_a2a_straggler_4rank"))
    assert run_bounds(analysis) is None
    assert to_json(analysis)["split_bound"] is None


def test_whatif_shows_the_bound_beside_the_oracle(run_dir):
    result = whatif(analyze(fsobs.load_run(run_dir)), ("sm_free",), draws=4, seed=0)
    assert result.split_bound is not None
    assert result.split_bound.num_whale_steps == 4
    assert result.split_bound.equal_bound == pytest.approx((3 * 3870 / 1631.5 + 2870 / 1381.5) / 4)
    assert whatif_json(result)["split_bound"]["num_whale_stragglers"] == 3
    out = io.StringIO()
    render_whatif(result, Console(file=out, width=400))
    text = out.getvalue()
    assert "oracle: equal compute" in text
    assert "the oracle's equal compute is out of reach in 4 of 4 step(s)" in text


def _stragglers(rows: list[tuple[int, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["step", "rank"])


def test_unequal_counts_missing_lengths_and_no_straggler():
    # step 0: 3 samples on 2 ranks (rank 0 two, rank 1 one): no equal-count split. Costs L²
    # (b = 1): 1, 1 and 9: total 11, mean 5.5, the 9 alone 9 / 5.5. Step 1: rank 1 lists nothing.
    lengths = {(0, 0): np.array([1, 1]), (1, 0): np.array([3]), (0, 1): np.array([2])}
    bounds = split_bounds(
        lengths,
        CostModel(c0=0.0, a=0.0, b=1.0),
        ranks=[0, 1],
        steps=[0, 1],
        stragglers=_stragglers([(0, math.nan), (1, 1.0)]),
        cost_source="test",
    )
    assert bounds.missing_steps == [1]
    (row,) = bounds.per_step.to_dict("records")
    assert row["whale_bound"] == pytest.approx(9 / 5.5)
    assert row["imbalance"] == pytest.approx(9 / 5.5)
    assert math.isnan(row["equal_bound"])
    assert row["whale_rank"] == 1
    assert math.isnan(row["straggler"]) and not row["straggler_has_whale"]
    summary = bounds.summary()
    assert summary.num_whale_steps == 1 and summary.num_whale_stragglers == 0
    assert math.isnan(summary.equal_bound)


def test_a_straggler_without_a_whale_is_the_split():
    # 2 ranks of 2: costs (L) 4, 4 | 1, 1 on the split trained on: total 10, mean 5, the
    # costliest (4) below the mean: no whale; with equal counts 4 + 1 = 5 is possible
    bounds = split_bounds(
        {(0, 7): np.array([4, 4]), (1, 7): np.array([1, 1])},
        CostModel(c0=0.0, a=1.0, b=0.0),
        ranks=[0, 1],
        steps=[7],
        stragglers=_stragglers([(7, 0.0)]),
        cost_source="test",
    )
    (row,) = bounds.per_step.to_dict("records")
    assert row["whale_bound"] == 1.0 and row["equal_bound"] == 1.0
    assert row["imbalance"] == pytest.approx(8 / 5)
    assert not row["straggler_has_whale"]


def test_equal_costs_are_no_whale_despite_rounding():
    # ten samples of 0.1 on ten ranks: T / N rounds to just below 0.1, yet nothing is a whale
    bounds = split_bounds(
        {(r, 0): np.array([1]) for r in range(10)},
        CostModel(c0=0.1, a=0.0, b=0.0),
        ranks=list(range(10)),
        steps=[0],
        stragglers=_stragglers([]),
        cost_source="test",
    )
    assert bounds.summary().num_whale_steps == 0
