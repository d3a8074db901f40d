"""Fitting ``c(L) = c0 + a·L + b·L²`` (ns of busy time per sample) and ``fsobs fit-cost``."""

from __future__ import annotations

import json
from itertools import product

import numpy as np
import pandas as pd
import pytest

import fsobs
from fsobs.analysis import analyze_path, fit_cost, fit_points
from fsobs.analysis.costfit import LOW_R2, nonnegative_lstsq
from fsobs.cli import main
from optim.balance import CostModel
from tests.support.kineto import REFERENCE, write_allreduce_run


def _points(lengths: list[list[int]], c0: float, a: float, b: float) -> tuple:
    """(steps, sidecar) with one (rank 0, step i) point per entry of ``lengths`` whose busy
    time is exactly ``Σ c(L)`` ns."""
    side = pd.DataFrame(
        {
            "rank": 0,
            "step": range(len(lengths)),
            "num_samples": [len(ls) for ls in lengths],
            "len_sum": [sum(ls) for ls in lengths],
            "len_sq_sum": [sum(v * v for v in ls) for ls in lengths],
        }
    )
    busy_ns = c0 * side["num_samples"] + a * side["len_sum"] + b * side["len_sq_sum"]
    steps = pd.DataFrame({"rank": 0, "step": side["step"], "busy_ms": busy_ns / 1e6})
    return steps, side


BATCHES = [[10, 20, 30], [500], [40, 40], [7, 300, 2, 90], [1000, 1], [64] * 8, [3, 5]]


def test_exact_recovery():
    steps, side = _points(BATCHES, c0=600_000.0, a=7_250.0, b=43.5)
    fit = fit_points(steps, side)
    assert fit.model.c0 == pytest.approx(600_000.0, rel=1e-6)
    assert fit.model.a == pytest.approx(7_250.0, rel=1e-6)
    assert fit.model.b == pytest.approx(43.5, rel=1e-6)
    assert fit.model.ids == 0.0
    assert fit.r2 == pytest.approx(1.0, abs=1e-12)
    assert fit.rmse_ms == pytest.approx(0.0, abs=1e-9)
    assert fit.n_points == len(BATCHES)
    assert list(fit.points.columns) == [
        "rank",
        "step",
        "num_samples",
        "len_sum",
        "len_sq_sum",
        "measured_ms",
        "predicted_ms",
    ]
    # the third point: 2 samples of 40 -> 2 * 0.6 ms + 80 * 7.25 µs + 3200 * 43.5 ns
    assert fit.points.loc[2, "measured_ms"] == pytest.approx(1.2 + 0.58 + 0.1392)
    np.testing.assert_allclose(fit.points["predicted_ms"], fit.points["measured_ms"], rtol=1e-9)


def test_a_negative_coefficient_is_clipped_to_zero():
    """Busy = 5·ΣL - 2·n (ns) wants c0 < 0; the fit keeps c0 = 0 and is the best
    non-negative one: every candidate with c0 = 0 fits at least as badly."""
    steps, side = _points(BATCHES, c0=-2.0, a=5.0, b=0.0)
    assert (steps["busy_ms"] > 0).all()
    fit = fit_points(steps, side)
    assert fit.model.c0 == 0.0 and fit.model.a > 0
    x = side[["len_sum", "len_sq_sum"]].to_numpy(float)
    y = steps["busy_ms"].to_numpy() * 1e6
    unconstrained = np.linalg.lstsq(x, y, rcond=None)[0]
    assert (unconstrained >= 0).all()  # so it is the constrained optimum with c0 = 0
    assert [fit.model.a, fit.model.b] == pytest.approx(unconstrained, rel=1e-6)
    assert 0 < fit.r2 < 1


def test_nonnegative_lstsq_beats_every_feasible_grid_point():
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, size=(20, 3))
    y = x @ np.array([2.0, -1.0, 0.5]) + rng.normal(0, 0.01, 20)
    coef = nonnegative_lstsq(x, y)
    assert (coef >= 0).all() and coef[1] == 0
    best = float(((x @ coef - y) ** 2).sum())
    grid = np.linspace(0, 3, 31)
    assert all(((x @ np.array(c) - y) ** 2).sum() >= best - 1e-12 for c in product(grid, repeat=3))


def test_points_need_both_a_sidecar_row_and_a_trace_row():
    steps, side = _points(BATCHES[:5], c0=1.0, a=1.0, b=1.0)
    fit = fit_points(steps, side.assign(rank=[0, 0, 0, 0, 1]))  # the last point is another rank
    assert fit.n_points == 4
    with pytest.raises(fsobs.RunError, match=r"^/r: not enough steps with both a sidecar and a"):
        fit_points(steps.iloc[:3], side, path="/r")


def test_constant_zero_busy_time_is_refused():
    """Busy 0 everywhere: the zero vector fits exactly and nothing fits better, so NNLS
    returns c0 = a = b = 0: a model that explains nothing is an error, naming the run."""
    steps, side = _points(BATCHES, c0=0.0, a=0.0, b=0.0)
    assert (steps["busy_ms"] == 0).all()
    with pytest.raises(fsobs.RunError, match=r"^/r: the fitted cost model is all zero") as info:
        fit_points(steps, side, path="/r")
    assert "explains nothing" in str(info.value) and "7 (rank, step) points" in str(info.value)


def test_busy_time_only_without_samples_is_refused():
    """Busy only in the steps that trained no sample (x = 0 there) and 0 where samples were
    trained: Xᵀy = 0, so for any c >= 0, ||Xc - y||² = ||Xc||² + ||y||² >= ||y||², the value
    at c = 0: the fit is all zero and refused."""
    steps, side = _points([[], [], [10, 20], [500], [], [7, 300]], c0=0.0, a=0.0, b=0.0)
    steps.loc[side["num_samples"] == 0, "busy_ms"] = 3.0
    x = side[["num_samples", "len_sum", "len_sq_sum"]].to_numpy(float)
    assert not (x.T @ steps["busy_ms"].to_numpy()).any()
    with pytest.raises(fsobs.RunError, match="all zero"):
        fit_points(steps, side, path="/r")


# Two samples on every rank and step, of lengths A = (10, 20) or B = (100, 200), with a busy
# time of 100 or 104 µs that does not follow them: at each length, half the points are 100 and
# half 104 (rank 0 then rank 1 per step), as a padded model's noise would be.
FLAT_LENGTHS = [([10, 20], [10, 20]), ([100, 200], [100, 200])] * 2
FLAT_COMPUTE = [(100.0, 104.0), (100.0, 104.0), (104.0, 100.0), (104.0, 100.0)]


def test_busy_time_independent_of_length_explains_nothing():
    """The busy time, centered, is orthogonal to ΣL and ΣL² centered (each length pattern sees
    100 and 104 equally often) and n is constant: least squares is the mean, 102 µs for two
    samples, c0 = 51 µs per sample, a = b = 0, and R² = 0, below LOW_R2."""
    lengths = [ls for pair in FLAT_LENGTHS for ls in pair]
    steps, side = _points(lengths, c0=0.0, a=0.0, b=0.0)
    steps["busy_ms"] = [c / 1e3 for pair in FLAT_COMPUTE for c in pair]
    fit = fit_points(steps, side)
    assert fit.model.c0 == pytest.approx(51_000.0, rel=1e-9)
    assert fit.model.a == pytest.approx(0.0, abs=1e-6) and fit.model.b == pytest.approx(0, abs=1e-8)
    assert fit.r2 == pytest.approx(0.0, abs=1e-9)
    assert fit.r2 < LOW_R2 == 0.3
    assert fit.warning is not None
    assert "is below 0.3" in fit.warning and "does not grow with sequence length" in fit.warning
    assert fit.warning.endswith("balancing by it will not help")


def test_a_fit_that_explains_the_busy_time_has_no_warning():
    steps, side = _points(BATCHES, c0=600_000.0, a=7_250.0, b=43.5)
    assert fit_points(steps, side).warning is None


def test_fit_cost_on_an_analyzed_gpu_run(tmp_path):
    """Each rank's compute time (µs) is exactly 2·n + ΣL / 100 + ΣL² / 1000, i.e. in ns per
    sample c(L) = 2000 + 10·L + L²."""
    lengths = [
        ([100, 200], [300]),
        ([100] * 3, [200, 200, 100, 300]),
        ([300, 300], [100]),
        ([200], [100, 100, 100, 100, 100]),
    ]

    def busy_us(ls: list[int]) -> float:
        return 2 * len(ls) + sum(ls) / 100 + sum(v * v for v in ls) / 1000

    compute = [(busy_us(a), busy_us(b)) for a, b in lengths]
    run_dir = write_allreduce_run(tmp_path / "run", compute, lengths=lengths)
    fit = fit_cost(analyze_path(run_dir))
    assert fit.n_points == 8
    assert [fit.model.c0, fit.model.a, fit.model.b] == pytest.approx([2000, 10, 1], rel=1e-6)
    assert fit.points["measured_ms"].tolist() == pytest.approx(
        [busy_us(ls[r]) / 1e3 for r in range(2) for ls in lengths]
    )


def test_fit_cost_without_sidecars_names_the_run():
    with pytest.raises(fsobs.RunError, match="synthetic_gloo_a2a_straggler_4rank: the run has no"):
        fit_cost(analyze_path(REFERENCE / "synthetic_gloo_a2a_straggler_4rank"))


# ----------------------------------------------------------------------------- fsobs fit-cost


@pytest.fixture
def fit_run(tmp_path):
    lengths = [([10, 20], [30]), ([40], [5, 5, 5]), ([50, 60], [70]), ([1], [2, 300])]
    # c(L) = 1000 + 100·L + 1·L² ns per sample, i.e. µs below
    compute = [
        tuple(sum(1 + 0.1 * v + v * v / 1000 for v in ls) for ls in pair) for pair in lengths
    ]
    return write_allreduce_run(tmp_path / "run", compute, lengths=lengths)


def test_cli_fit_cost_writes_the_model(fit_run, capsys):
    assert main(["fit-cost", str(fit_run)]) == 0
    out = capsys.readouterr().out
    path = fit_run / "cost_model.json"
    model = CostModel.from_json(path)
    assert [model.c0, model.a, model.b] == pytest.approx([1000, 100, 1], rel=1e-6)
    assert "8 (rank, step) points" in out and "R^2 1.0000" in out
    assert "warning" not in out
    assert f"wrote {path}\n" in out
    # the closing hint: the flag for the reference job, the loader for one's own loop
    assert out.endswith(
        f"use it with: fsobs run --balance --cost-model {path}  (the reference job)\n"
        f"  or in your own loop: optim.CostModel.from_json('{path}'), passed as cost_model= "
        "to optim.FreeScale and fsobs.collect.RunRecorder\n"
    )
    assert set(json.loads(path.read_text())) == {"c0", "a", "b", "ids"}


def test_cli_fit_cost_out(fit_run, tmp_path, capsys):
    target = tmp_path / "model.json"
    assert main(["fit-cost", str(fit_run), "--out", str(target)]) == 0
    assert CostModel.from_json(target).b == pytest.approx(1.0, rel=1e-6)
    assert not (fit_run / "cost_model.json").exists()


def test_cli_fit_cost_bad_input(tmp_path, capsys):
    run = REFERENCE / "synthetic_gloo_a2a_straggler_4rank"
    assert main(["fit-cost", str(run), "--out", str(tmp_path / "m.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no step sidecars" in err
    assert not (tmp_path / "m.json").exists()


def test_cli_fit_cost_refuses_a_zero_model(tmp_path, capsys):
    """Rank 0 computes 100 µs per step but trains no sample; rank 1 trains samples in 0 µs: the
    busy time is orthogonal to every feature, the fit is all zero and refused (exit 2)."""
    lengths = [([], [10, 20]), ([], [30]), ([], [5, 5, 5]), ([], [40, 1])]
    run = write_allreduce_run(tmp_path / "run", [(100.0, 0.0)] * 4, lengths=lengths)
    assert main(["fit-cost", str(run)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith(f"fsobs: error: {run}: the fitted cost model is all zero")
    assert "8 (rank, step) points" in captured.err
    assert not (run / "cost_model.json").exists()


def test_cli_fit_cost_unwritable_out(fit_run, tmp_path, capsys):
    target = tmp_path / "missing-dir" / "m.json"
    assert main(["fit-cost", str(fit_run), "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fsobs: error: {target}: cannot write the cost model")


def test_cli_fit_cost_warns_when_busy_time_does_not_follow_length(tmp_path, capsys):
    run = write_allreduce_run(tmp_path / "run", FLAT_COMPUTE, lengths=FLAT_LENGTHS)
    assert main(["fit-cost", str(run)]) == 0
    out = capsys.readouterr().out
    (warning,) = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert warning.startswith("warning: R^2 ") and "is below 0.3" in warning
    assert "balancing by it will not help" in warning
    assert (run / "cost_model.json").exists()  # a warning, not a refusal


def test_cli_fit_cost_min_r2_fails_and_writes_nothing(tmp_path, capsys):
    run = write_allreduce_run(tmp_path / "run", FLAT_COMPUTE, lengths=FLAT_LENGTHS)
    target = tmp_path / "m.json"
    assert main(["fit-cost", str(run), "--out", str(target), "--min-r2", "0.3"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"fsobs: error: {run}: R^2 ")
    assert "is below --min-r2 0.3" in captured.err and "nothing written" in captured.err
    assert not target.exists() and not (run / "cost_model.json").exists()


def test_cli_fit_cost_min_r2_passes_a_good_fit(fit_run, capsys):
    assert main(["fit-cost", str(fit_run), "--min-r2", "0.99"]) == 0
    assert CostModel.from_json(fit_run / "cost_model.json").b == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("value", ["x", "1.5", "nan"])
def test_cli_fit_cost_bad_min_r2(fit_run, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fit-cost", str(fit_run), "--min-r2", value])
    assert exit_.value.code == 2
    assert "--min-r2" in capsys.readouterr().err


# ----------------------------------------------------------------------------- padded shape


def _padded_points(lengths: list[list[int]], batch: float, c0: float, a: float, p: float):
    """(steps, sidecar) with one (rank 0, step i) point per entry of ``lengths``, busy exactly
    ``batch + c0·n + a·ΣL + p·n·max(L)²`` ns."""
    steps, side = _points(lengths, c0=0.0, a=0.0, b=0.0)
    side["len_max"] = [max(ls, default=0) for ls in lengths]
    n, total, longest = side["num_samples"], side["len_sum"], side["len_max"]
    steps["busy_ms"] = (batch + c0 * n + a * total + p * n * longest**2) / 1e6
    return steps, side


def test_padded_exact_recovery():
    steps, side = _padded_points(BATCHES, batch=2e6, c0=300_000.0, a=4_000.0, p=25.0)
    fit = fit_points(steps, side, shape="padded")
    m = fit.model
    assert [m.batch, m.c0, m.a, m.padded] == pytest.approx([2e6, 300_000.0, 4_000.0, 25.0])
    assert m.b == 0.0 and m.shape == "padded" and fit.shape == "padded"
    assert fit.r2 == pytest.approx(1.0, abs=1e-12) and fit.warning is None
    assert list(fit.points.columns) == [
        "rank",
        "step",
        "num_samples",
        "len_sum",
        "len_max",
        "measured_ms",
        "predicted_ms",
    ]
    # the fifth point: 1000 and 1 -> 2 ms + 2 · 0.3 ms + 1001 · 4 µs + 25 ns · 2 · 1000²
    assert fit.points.loc[4, "measured_ms"] == pytest.approx(2 + 0.6 + 4.004 + 50)


# {1, 5, 6} and {2, 3, 7} have the same n = 3, ΣL = 12 and ΣL² = 62 but max(L) 6 and 7: the
# additive features cannot tell them apart, a padded model costs them n·max² = 108 and 147.
SAME_SUMS = [([1, 5, 6], [2, 3, 7]), ([2, 3, 7], [1, 5, 6])] * 2
PADDED_US = [tuple(3 * max(ls) ** 2 for ls in pair) for pair in SAME_SUMS]  # 1 µs · n · max²


def test_padded_busy_time_that_the_additive_shape_cannot_explain():
    """Every point has the same additive features, so the additive fit predicts one value for
    all: their mean, (108 + 147) / 2, and R² = 0. The padded fit is exact: 1000 ns · n·max²."""
    lengths = [ls for pair in SAME_SUMS for ls in pair]
    steps, side = _padded_points(lengths, batch=0.0, c0=0.0, a=0.0, p=1000.0)
    additive = fit_points(steps, side)
    assert additive.points["predicted_ms"].tolist() == pytest.approx([0.1275] * 8)
    assert additive.r2 == pytest.approx(0.0, abs=1e-9) and additive.warning is not None
    assert "try --shape padded" in additive.warning
    padded = fit_points(steps, side, shape="padded")
    assert padded.r2 == pytest.approx(1.0, abs=1e-9) and padded.warning is None
    assert padded.points["predicted_ms"].tolist() == pytest.approx(
        [3 * max(ls) ** 2 / 1e3 for ls in lengths]
    )
    auto = fit_points(steps, side, shape="auto")
    assert auto.shape == "padded" and auto.model == padded.model
    assert auto.choice is not None and auto.choice.startswith(
        "additive R^2 0.0000, padded R^2 1.0000"
    )


def test_auto_keeps_the_additive_shape_when_it_explains_more():
    steps, side = _points(BATCHES, c0=600_000.0, a=7_250.0, b=43.5)
    side["len_max"] = [max(ls) for ls in BATCHES]
    fit = fit_points(steps, side, shape="auto")
    assert fit.shape == "additive" and fit.model.shape == "additive"
    assert fit.model.b == pytest.approx(43.5, rel=1e-6)
    assert "the additive shape explains more" in fit.choice


def test_padded_shape_warns_below_low_r2():
    lengths = [ls for pair in FLAT_LENGTHS for ls in pair]
    steps, side = _padded_points(lengths, batch=0.0, c0=0.0, a=0.0, p=0.0)
    steps["busy_ms"] = [c / 1e3 for pair in FLAT_COMPUTE for c in pair]
    fit = fit_points(steps, side, shape="padded")
    assert fit.r2 == pytest.approx(0.0, abs=1e-9)
    assert "under the padded shape either" in fit.warning


def test_unknown_shape_is_refused():
    steps, side = _points(BATCHES, c0=1.0, a=1.0, b=1.0)
    with pytest.raises(ValueError, match="^shape: unknown 'pad'"):
        fit_points(steps, side, shape="pad")


def test_cli_fit_cost_padded(tmp_path, capsys):
    run = write_allreduce_run(tmp_path / "run", PADDED_US, lengths=SAME_SUMS)
    assert main(["fit-cost", str(run), "--shape", "padded"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("cost = ") and "ns * n * max(L)^2" in out
    assert "R^2 1.0000" in out and "warning" not in out
    model = CostModel.from_json(run / "cost_model.json")
    assert model.shape == "padded" and model.padded == pytest.approx(1000.0, rel=1e-6)
    assert model.batch + 3 * model.c0 + 12 * model.a == pytest.approx(0.0, abs=1e-3)
    path = run / "cost_model.json"
    assert out.endswith(
        f"use it with: fsobs run --balance --cost-model {path}  (the reference job)\n"
        f"  or in your own loop: optim.CostModel.from_json('{path}'), passed as cost_model= "
        "to optim.FreeScale and fsobs.collect.RunRecorder\n"
    )


def test_cli_fit_cost_auto_says_which_shape_it_kept(tmp_path, capsys):
    run = write_allreduce_run(tmp_path / "run", PADDED_US, lengths=SAME_SUMS)
    assert main(["fit-cost", str(run), "--shape", "auto"]) == 0
    out = capsys.readouterr().out
    assert "additive R^2 0.0000, padded R^2 1.0000: the padded shape explains more" in out
    assert CostModel.from_json(run / "cost_model.json").shape == "padded"
    assert main(["fit-cost", str(run)]) == 0  # the additive default warns and points at padded
    assert "try --shape padded" in capsys.readouterr().out
