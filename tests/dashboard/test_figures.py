"""Figures and the data behind them, checked against fsobs's own numbers (no Streamlit)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dashboard import figures
from dashboard.balance_plan import balance_plan, default_model
from dashboard.tables import (
    BUBBLE_CLASSES,
    coarsen,
    imbalance_steps,
    lateness_frame,
    timeline_frame,
)
from dashboard.tracediff import FSOBS_SOURCE, HTA_SOURCE, change_counts, fsobs_table, op_diff
from fsobs import analyze_path
from fsobs.analysis.compare import compare
from fsobs.analysis.costfit import fit_cost
from fsobs.trace.sidecar import read_step_lengths
from optim.balance import CostModel, imbalance
from tests.dashboard.conftest import FIRST_STEP, global_batches


@pytest.fixture(scope="module")
def runs(shared_store):
    """Analyses of the test store's good runs, by id."""
    ids = ("sim/control", "sim/test", "reference/gloo_straggler_4rank")
    return {run_id: analyze_path(shared_store / run_id) for run_id in ids}


def _title(fig) -> str:
    return fig.layout.title.text


def test_bubble_classes_are_the_per_rank_class_means(runs):
    steps = runs["sim/control"].steps
    fig = figures.bubble_classes_by_rank(steps)
    assert fig.layout.barmode == "stack" and _title(fig)
    assert [t.name for t in fig.data] == [c.replace("_", " ") for c in BUBBLE_CLASSES]
    for trace, cls in zip(fig.data, BUBBLE_CLASSES, strict=True):
        expected = steps.groupby("rank")[f"{cls}_ms"].mean()
        assert list(trace.x) == [str(r) for r in expected.index]
        np.testing.assert_allclose(trace.y, expected.to_numpy())


def test_heatmap_is_the_straggler_wait_matrix(runs):
    steps = runs["reference/gloo_straggler_4rank"].steps
    fig = figures.straggler_wait_heatmap(steps)
    expected = steps.pivot(index="rank", columns="step", values="straggler_wait_ms")
    heat = fig.data[0]
    assert heat.type == "heatmap" and _title(fig)
    np.testing.assert_allclose(np.asarray(heat.z, dtype=float), expected.to_numpy())
    assert list(heat.y) == [str(r) for r in expected.index]
    assert list(heat.x) == [str(s) for s in expected.columns]


@pytest.mark.parametrize("run_id", ["sim/control", "reference/gloo_straggler_4rank"])
def test_timeline_lanes_add_up_to_the_bubble_table(runs, run_id):
    analysis = runs[run_id]
    step = analysis.run.steps[1]
    frame = timeline_frame(analysis.bubbles, step, analysis.collectives.offsets_ns)
    fig = figures.step_timeline(frame, step)
    assert str(step) in _title(fig)
    lanes = {t.name: t for t in fig.data}
    table = analysis.steps.set_index(["rank", "step"])
    columns = {"compute": "busy_ms", "wait": "straggler_wait_ms", "idle": "host_idle_ms"}
    for lane, column in columns.items():
        trace = lanes[lane]
        widths = pd.Series(np.asarray(trace.x, dtype=float), index=list(trace.y))
        for rank in analysis.run.rank_ids:
            total = widths.get(f"rank {rank}", pd.Series(dtype=float)).sum()
            assert total == pytest.approx(table.loc[(rank, step), column], abs=1e-6)
    assert min(np.min(t.base) for t in fig.data if len(t.base)) == pytest.approx(0.0, abs=1e-9)


def test_timeline_merges_the_closest_intervals_beyond_max_bars(runs):
    analysis = runs["sim/control"]
    full = timeline_frame(analysis.bubbles, 11, analysis.collectives.offsets_ns)
    coarse = timeline_frame(analysis.bubbles, 11, analysis.collectives.offsets_ns, max_bars=3)
    assert not full.attrs["coarsened"] and coarse.attrs["coarsened"]
    assert coarse.groupby(["rank", "lane"]).size().max() == 3
    for (rank, lane), part in full.groupby(["rank", "lane"]):
        merged = coarse[(coarse["rank"] == rank) & (coarse["lane"] == lane)]
        assert merged["start_ms"].min() == part["start_ms"].min()
        assert merged["end_ms"].max() == part["end_ms"].max()
    starts, ends = coarsen(np.array([0, 10, 20, 30, 100]), np.array([5, 12, 25, 40, 110]), 3)
    assert starts.tolist() == [0, 20, 100] and ends.tolist() == [12, 40, 110]


def test_straggler_steps_follow_the_analysis(runs):
    per_step = runs["reference/gloo_straggler_4rank"].stragglers.per_step
    fig = figures.straggler_steps(per_step)
    assert list(fig.data[0].x) == list(per_step["step"])
    assert list(fig.data[0].y) == [2] * len(per_step)  # rank 2 sleeps before its collectives


def test_data_attribution_has_one_point_per_rank_and_step(runs):
    analysis = runs["sim/control"]
    frame = lateness_frame(analysis)
    assert frame is not None and len(frame) == 16
    sidecar = analysis.run.sidecar.set_index(["rank", "step"])
    merged = frame.set_index(["rank", "step"]).join(sidecar["est_cost"])
    np.testing.assert_allclose(merged["cost"], merged["est_cost"])
    fig = figures.data_attribution(frame, analysis.attribution.cost_source)
    assert len(fig.data) == 4 and sum(len(t.x) for t in fig.data) == 16
    assert lateness_frame(runs["reference/gloo_straggler_4rank"]) is None


def test_hta_temporal_breakdown_figure(runs):
    temporal = runs["sim/control"].hta.temporal_breakdown
    fig = figures.hta_temporal_breakdown(temporal)
    np.testing.assert_allclose(fig.data[0].y, temporal["compute_time_us"])
    np.testing.assert_allclose(fig.data[2].y, temporal["idle_time_us"])


def test_compare_figures_show_the_comparison(runs):
    control, test = runs["sim/control"], runs["sim/test"]
    comp = compare(control, test)
    fig = figures.bubble_reduction(comp.bubble_reduction, comp.bubble_reduction_ci, comp.by_class)
    bars = fig.data[0]
    np.testing.assert_allclose(bars.y[0], 100 * comp.bubble_reduction)
    lo, hi = comp.bubble_reduction_ci
    assert bars.error_y.arrayminus[0] == pytest.approx(100 * (comp.bubble_reduction - lo))
    assert bars.error_y.array[0] == pytest.approx(100 * (hi - comp.bubble_reduction))
    fig = figures.per_rank_delta(comp.per_rank)
    for trace, cls in zip(fig.data, BUBBLE_CLASSES, strict=True):
        np.testing.assert_allclose(trace.y, comp.per_rank[f"{cls}_ms_delta"])
    fig = figures.step_time_distribution(comp.step_times)
    assert [t.name for t in fig.data] == ["control", "test"]
    for trace in fig.data:
        expected = comp.step_times.loc[comp.step_times["run"] == trace.name, "step_time_ms"]
        np.testing.assert_allclose(trace.y, expected)
    fig = figures.class_means(control.steps, test.steps)
    np.testing.assert_allclose(fig.data[1].y[0], test.steps["straggler_wait_ms"].mean())
    assert _title(fig)


def test_cost_fit_plots_measured_against_predicted(runs):
    fit = fit_cost(runs["sim/control"])
    fig = figures.cost_fit(fit.points)
    np.testing.assert_allclose(fig.data[0].x, fit.points["predicted_ms"])
    np.testing.assert_allclose(fig.data[0].y, fit.points["measured_ms"])
    assert _title(fig)


def test_balance_plan_costs_each_rank_and_rebalances(shared_store):
    lengths = read_step_lengths(shared_store / "sim" / "control", FIRST_STEP)
    assert np.array_equal(np.concatenate([lengths[r] for r in range(4)]), global_batches()[10])
    model = CostModel(c0=1.0, a=2.0, b=0.5)
    plan = balance_plan(lengths, model, "kk")
    before = [float(model(lengths[r]).sum()) for r in range(4)]
    np.testing.assert_allclose(plan.per_rank["cost_before"], before)
    assert plan.per_rank["cost_after"].sum() == pytest.approx(sum(before))
    assert plan.equal_size and list(plan.per_rank["samples_after"]) == [8, 8, 8, 8]
    assert plan.imbalance_before == pytest.approx(max(before) / np.mean(before))
    assert plan.imbalance_after < plan.imbalance_before
    random = balance_plan(lengths, model, "random")  # contiguous chunks: the job's own split
    np.testing.assert_allclose(random.per_rank["cost_after"], before)
    fig = figures.balance_bars(plan.per_rank)
    np.testing.assert_allclose(fig.data[0].y, plan.per_rank["cost_before"])
    np.testing.assert_allclose(fig.data[1].y, plan.per_rank["cost_after"])
    assert "untrained" in default_model().source


def test_logged_imbalance_per_step(runs):
    assert imbalance_steps(runs["sim/control"].run.sidecar) is None
    frame = imbalance_steps(runs["sim/test"].run.sidecar)
    costs = CostModel(c0=0, a=1, b=1)(global_batches()[FIRST_STEP])
    contiguous = np.array_split(np.arange(len(costs)), 4)
    assert frame["step"].tolist() == [10, 11, 12, 13]
    assert frame["imbalance_before"].iloc[0] == pytest.approx(imbalance(costs, contiguous))
    fig = figures.imbalance_over_steps(frame)
    np.testing.assert_allclose(fig.data[1].y, frame["imbalance_after"])


def test_fsobs_op_diff_equals_hta_trace_diff(shared_store):
    pytest.importorskip("hta.trace_diff")
    control = (shared_store / "sim" / "control" / "rank0.trace.json.gz", 0)
    test = (shared_store / "sim" / "test" / "rank0.trace.json.gz", 0)
    hta = op_diff(control, test, use_hta=True)
    assert hta.source == HTA_SOURCE
    ours = fsobs_table(control, test)
    pd.testing.assert_frame_equal(ours, hta.table, check_dtype=False)
    counts = change_counts(ours)  # every op present in test is in exactly one other class
    assert sum(counts.values()) - counts["deleted"] == int((ours["test_counts"] > 0).sum())
    fig = figures.op_diff_top(ours, top=5)
    top = ours["diff_duration"].abs().nlargest(5)
    assert sorted(np.abs(fig.data[0].x)) == pytest.approx(sorted(top))


def test_op_diff_without_hta_is_computed_by_fsobs(shared_store):
    gloo = shared_store / "reference" / "gloo_straggler_4rank"
    diff = op_diff((gloo / "rank0.json.gz", 0), (gloo / "rank2.json.gz", 2), use_hta=False)
    assert diff.source == FSOBS_SOURCE
    assert diff.table.loc["gloo:all_to_all", "control_counts"] >= 1
