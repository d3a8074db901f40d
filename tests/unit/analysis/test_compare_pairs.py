"""Several control / test pairs (:mod:`fsobs.analysis.comparison.pairs`) and
``fsobs compare --control ... --test ...``: the mean of the pairs' reductions and its Student t
interval, computed here from the formula with t taken from a printed table."""

from __future__ import annotations

import json
import math

import pytest

from fsobs.analysis import compare
from fsobs.analysis.comparison.pairs import summarize_pairs, t_cdf, t_quantile
from fsobs.cli import main
from tests.support.kineto import write_allreduce_run
from tests.unit.analysis.test_compare import WORKLOAD, _analysis, _sidecar, _steps, _uniform

# Student's t quantiles as printed in tables (3 decimals): (p, degrees of freedom) -> t
T_TABLE = {(0.975, 1): 12.706, (0.975, 2): 4.303, (0.975, 9): 2.262, (0.95, 4): 2.132}


@pytest.mark.parametrize(("p", "dof"), sorted(T_TABLE))
def test_t_quantile_matches_the_table(p, dof):
    assert t_quantile(p, dof) == pytest.approx(T_TABLE[p, dof], abs=5e-4)


@pytest.mark.parametrize("x", [0.0, 0.3, 1.0, 4.0, 25.0])
def test_t_cdf_closed_forms(x):
    """dof 1 is Cauchy's ``1/2 + atan(x)/π``; dof 2 is ``1/2 + x / (2·sqrt(2 + x²))``; both
    symmetric about 0."""
    assert t_cdf(x, 1) == pytest.approx(0.5 + math.atan(x) / math.pi, abs=1e-12)
    assert t_cdf(x, 2) == pytest.approx(0.5 + x / (2 * math.sqrt(2 + x * x)), abs=1e-12)
    for dof in (1, 2, 5, 8):
        assert t_cdf(-x, dof) == pytest.approx(1 - t_cdf(x, dof), abs=1e-12)


def test_bad_quantile_arguments():
    with pytest.raises(ValueError, match="^p: "):
        t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="^dof: "):
        t_quantile(0.975, 0)
    with pytest.raises(ValueError, match="^pairs: "):
        summarize_pairs([])


def _bubble_of(bubble_ms: float) -> list:
    """One rank, 4 steps of 100 ms with ``bubble_ms`` of straggler wait each."""
    return _uniform([(100, 100 - bubble_ms, bubble_ms, 0, 0)], 4)


def _pairs(test_bubbles: list[float]) -> list:
    """A 40 ms control against each of the tests: reductions 1 - b / 40."""
    control = _analysis(_steps(_bubble_of(40)))
    return [compare(control, _analysis(_steps(_bubble_of(b)))) for b in test_bubbles]


def test_three_pairs_give_a_t_interval_over_pairs():
    """Per-pair reductions 1 - 20/40, 1 - 16/40, 1 - 8/40 = 0.5, 0.6, 0.8: the mean 19/30 and
    mean ± t(2, 0.975) · sd / sqrt(3), sd over the three with 2 degrees of freedom."""
    summary = summarize_pairs(_pairs([20, 16, 8]))
    values = [0.5, 0.6, 0.8]
    mean = sum(values) / 3
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
    half = T_TABLE[0.975, 2] * sd / math.sqrt(3)  # 4.303 · 0.1528 / 1.732 = 0.3795
    assert summary.bubble_reduction == pytest.approx(19 / 30)
    assert summary.bubble_reduction_ci == pytest.approx((mean - half, mean + half), abs=1e-4)
    # all of the bubble is straggler wait: the same numbers; exposed comm is 0 in the controls
    assert summary.by_class["straggler_wait"] == pytest.approx(19 / 30)
    assert summary.by_class_ci["straggler_wait"] == pytest.approx(summary.bubble_reduction_ci)
    assert math.isnan(summary.by_class["exposed_comm"])
    assert all(math.isnan(v) for v in summary.by_class_ci["exposed_comm"])
    assert summary.warnings == []
    # each pair's own interval (over its identical steps) is a point: the pairs' spread is not
    assert [p.bubble_reduction_ci for p in summary.pairs] == [pytest.approx((v, v)) for v in values]


def test_two_pairs_give_no_interval():
    summary = summarize_pairs(_pairs([20, 8]))
    assert summary.bubble_reduction == pytest.approx((0.5 + 0.8) / 2)
    assert all(math.isnan(v) for v in summary.bubble_reduction_ci)
    assert summary.warnings == [
        "2 pair(s): no interval over pairs (it needs at least 3; each pair's own interval "
        "covers its steps, not run-to-run variation)"
    ]


def test_a_pair_on_other_batches_is_named():
    side = _sidecar({(0, s): [10, 20] for s in range(4)})
    other = _sidecar({(0, s): [10, 21] for s in range(4)})

    def analysis(bubble: float, sidecar):
        return _analysis(_steps(_bubble_of(bubble)), sidecar=sidecar)

    pairs = [compare(analysis(40, side), analysis(b, s)) for b, s in ((20, side), (8, other))]
    pairs.append(compare(analysis(40, side), analysis(16, side)))
    summary = summarize_pairs(pairs)
    assert [p.same_batches for p in summary.pairs] == [True, False, True]
    assert summary.warnings == ["pair(s) 2 did not see the same global batches"]


# ----------------------------------------------------------------- fsobs compare --control --test

CONTROL_US = (100.0, 300.0)
TESTS_US = ((200.0, 200.0), (150.0, 250.0), (120.0, 280.0))


def _bubble_us(compute: tuple[float, float]) -> float:
    """Mean bubble per rank and step of :func:`write_allreduce_run` with this compute in each
    of 4 steps: M + 50 - c_r in three steps, M + 20 - c_r in the last."""
    m, mean_c = max(compute), sum(compute) / 2
    return (3 * (m + 50 - mean_c) + (m + 20 - mean_c)) / 4


@pytest.fixture
def pair_dirs(tmp_path):
    batch = [([10, 20], [30, 40])] * 4
    meta = {"world_size": 2, "status": "complete", "workload": WORKLOAD}
    controls, tests = [], []
    for i, compute in enumerate(TESTS_US):
        run = tmp_path / f"control{i}"
        controls.append(write_allreduce_run(run, [CONTROL_US] * 4, lengths=batch, meta=meta))
        run = tmp_path / f"test{i}"
        tests.append(write_allreduce_run(run, [compute] * 4, lengths=batch, meta=meta))
    return [str(p) for p in controls], [str(p) for p in tests]


def test_cli_compare_pairs_json(pair_dirs, capsys):
    """Reductions 1 - 42.5/142.5, 1 - 92.5/142.5, 1 - 122.5/142.5 (µs of bubble per rank and
    step), their mean and t interval."""
    controls, tests = pair_dirs
    assert main(["compare", "--control", *controls, "--test", *tests, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    values = [1 - _bubble_us(t) / _bubble_us(CONTROL_US) for t in TESTS_US]
    assert values == pytest.approx([1 - 42.5 / 142.5, 1 - 92.5 / 142.5, 1 - 122.5 / 142.5])
    assert [p["bubble_reduction"] for p in out["pairs"]] == pytest.approx(values)
    mean = sum(values) / 3
    half = T_TABLE[0.975, 2] * math.sqrt(sum((v - mean) ** 2 for v in values) / 2) / math.sqrt(3)
    over = out["over_pairs"]
    assert over["num_pairs"] == 3 and over["ci_over"] == "pairs"
    assert over["bubble_reduction"] == pytest.approx(mean)
    assert over["bubble_reduction_ci"] == pytest.approx([mean - half, mean + half], abs=1e-4)
    assert over["same_batches"] == [True, True, True]
    assert over["same_batches_basis"] == ["totals"] * 3
    checks = [p["same_batches_check"] for p in out["pairs"]]
    assert [(c["basis"], c["checked"], c["differing"]) for c in checks] == [("totals", 4, 0)] * 3
    assert over["by_class"]["other"] is None and over["warnings"] == []
    assert all(p["ci_over"] == "steps" for p in out["pairs"])


def test_cli_compare_pairs_text(pair_dirs, capsys):
    controls, tests = pair_dirs
    assert main(["compare", "--control", *controls[:2], "--test", *tests[:2]]) == 0
    out = capsys.readouterr().out
    assert "pair 1\n" in out and "pair 2\n" in out and "pair 3" not in out
    assert "over 2 pairs (control and test matched by position)" in out
    mean = (1 - 42.5 / 142.5 + 1 - 92.5 / 142.5) / 2
    assert f"bubble reduction: {mean:.1%} (mean of 2 pair(s); no CI: fewer than 3 pairs)" in out
    assert f"  per pair: {1 - 42.5 / 142.5:.1%}, {1 - 92.5 / 142.5:.1%}\n" in out
    # each pair's basis: the sidecars list lengths only (no digests, no sample ids)
    assert "same global batches: pair 1 yes (by totals only), pair 2 yes (by totals only)" in out
    assert (
        out.count(
            "same global batches: yes, by totals only (samples, sum of lengths, sum of squared "
            "lengths) on all 4 common steps: neither run has batch digests; neither run has sample "
            "ids\n"
        )
        == 2
    )
    assert "warning: 2 pair(s): no interval over pairs" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--control", "a", "b", "--test", "c"], "2 --control run(s) but 1 --test run(s)"),
        (["a", "--control", "b", "--test", "c"], "not both"),
        (["--control", "a"], "--control and --test go together"),
        (["a"], "give CONTROL TEST"),
    ],
)
def test_cli_compare_pairs_bad_usage(args, message, capsys):
    assert main(["compare", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fsobs: error: compare: ") and err.count("\n") == 1
    assert message in err
