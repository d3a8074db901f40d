"""Figures and the data behind them, checked against fsobs's own numbers (no Streamlit)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dashboard import figures
from dashboard.balance_plan import balance_plan, default_model
from dashboard.tables import (
    BUBBLE_CLASSES,
    imbalance_steps,
    lateness_frame,
    merge_close,
    timeline_frame,
)
from dashboard.tracediff import FSOBS_SOURCE, HTA_SOURCE, change_counts, fsobs_table, op_diff
from fsobs import analyze_path
from fsobs.analysis.ab import compare
from fsobs.analysis.costfit import fit_cost
from fsobs.runformat import read_step_lengths
from optim.balance import CostModel, imbalance
from tests.dashboard.stores import FIRST_STEP, global_batches


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


LANE_COLUMNS = {
    "compute": ("busy", "busy_ms"),
    "comm": ("exposed_comm", "exposed_comm_ms"),
    "wait": ("straggler_wait", "straggler_wait_ms"),
    "idle": ("host_idle", "host_idle_ms"),
    "other": ("other", "other_ms"),
}


def _window_intervals(analysis, rank: int, window: list[int], cls: str, origin: int):
    """One rank's intervals of a class over the window's steps, clock-aligned, in ms."""
    shift = origin + analysis.collectives.offsets_ns.get(rank, 0)
    chosen = [b for b in analysis.bubbles if b.rank == rank and b.step in window]
    starts = np.concatenate([b.classes[cls][0] for b in chosen])
    ends = np.concatenate([b.classes[cls][1] for b in chosen])
    return (starts - shift) / 1e6, (ends - shift) / 1e6


@pytest.mark.parametrize("run_id", ["sim/control", "reference/gloo_straggler_4rank"])
def test_timeline_window_shows_the_exact_intervals(runs, run_id):
    """Without merging (pixels=0) every bar is one interval of the window, clock-aligned."""
    analysis = runs[run_id]
    window = analysis.run.steps[1:3]
    offsets = analysis.collectives.offsets_ns
    bars = timeline_frame(analysis.bubbles, window, offsets, pixels=0)
    chosen = [b for b in analysis.bubbles if b.step in window]
    origin = min(b.window[0] - offsets.get(b.rank, 0) for b in chosen)
    assert not bars.attrs["merged"] and (bars["intervals"] == 1).all()
    assert bars.attrs["num_intervals"] == len(bars)
    for rank in analysis.run.rank_ids:
        for lane, (cls, _) in LANE_COLUMNS.items():
            part = bars[(bars["rank"] == rank) & (bars["lane"] == lane)]
            starts, ends = _window_intervals(analysis, rank, window, cls, origin)
            np.testing.assert_allclose(part["start_ms"], starts, atol=1e-9)
            np.testing.assert_allclose(part["end_ms"], ends, atol=1e-9)
            np.testing.assert_allclose(part["class_ms"], ends - starts, atol=1e-9)
    assert bars["start_ms"].min() == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("run_id", ["sim/control", "reference/gloo_straggler_4rank"])
@pytest.mark.parametrize("max_bars", [2000, 10])
def test_timeline_lanes_add_up_to_the_bubble_table(runs, run_id, max_bars):
    """Merged or not, the class time in a lane's bars is the bubble table's total over the
    window, and every interval lies inside one of its lane's bars."""
    analysis = runs[run_id]
    window = analysis.run.steps[1:3]
    offsets = analysis.collectives.offsets_ns
    bars = timeline_frame(analysis.bubbles, window, offsets, max_bars=max_bars)
    fig = figures.step_timeline(bars, window)
    assert _title(fig).startswith(f"Steps {window[0]}–{window[1]} across ranks")
    lanes = [trace.name for trace in fig.data]
    labels = dict(zip(fig.layout.yaxis.tickvals, fig.layout.yaxis.ticktext, strict=True))
    row_rank = {
        start + offset: labels[start + (len(lanes) - 1) / 2]
        for start in range(0, len(lanes) * len(analysis.run.rank_ids), len(lanes))
        for offset in range(len(lanes))
    }
    table = analysis.steps[analysis.steps["step"].isin(window)].groupby("rank").sum()
    chosen = [b for b in analysis.bubbles if b.step in window]
    origin = min(b.window[0] - offsets.get(b.rank, 0) for b in chosen)
    for trace in fig.data:
        cls, column = LANE_COLUMNS[trace.name]
        data = np.asarray(trace.customdata, dtype=float)  # rank, class ms, intervals, fill %
        base, width = np.asarray(trace.base, dtype=float), np.asarray(trace.x, dtype=float)
        np.testing.assert_allclose(base + width, bars.loc[bars["lane"] == trace.name, "end_ms"])
        for rank in analysis.run.rank_ids:
            mine = data[:, 0] == rank
            rows = np.asarray(trace.y)[mine]
            assert {row_rank[y] for y in rows} == {f"rank {rank}"}
            assert set(rows % len(lanes)) == {lanes.index(trace.name)}
            assert data[mine, 1].sum() == pytest.approx(table.loc[rank, column], abs=1e-6)
            starts, ends = _window_intervals(analysis, rank, window, cls, origin)
            lo, hi = base[mine], base[mine] + width[mine]
            inside = np.searchsorted(lo, starts + 1e-9, side="right") - 1
            assert (inside >= 0).all() and (ends <= hi[inside] + 1e-9).all()
            assert data[mine, 2].sum() == len(starts)
    if max_bars == 10:
        assert bars.attrs["capped"] and bars.attrs["merged"]
        assert bars.groupby(["rank", "lane"]).size().max() <= bars.attrs["lane_bars"]


def test_merge_close_closes_narrow_gaps_then_the_narrowest():
    starts, ends = np.array([0, 10, 20, 30, 100]), np.array([5, 12, 25, 40, 110])
    lo, hi, covered, count = merge_close(starts, ends, min_gap=6, max_bars=10)
    assert (lo.tolist(), hi.tolist()) == ([0, 20, 100], [12, 40, 110])
    assert (covered.tolist(), count.tolist()) == ([7, 15, 10], [2, 2, 1])
    lo, hi, covered, count = merge_close(starts, ends, min_gap=0, max_bars=2)
    assert (lo.tolist(), hi.tolist(), covered.tolist()) == ([0, 100], [40, 110], [22, 10])
    assert [len(a) for a in merge_close(starts[:0], ends[:0], 1, 5)] == [0, 0, 0, 0]


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
    fig = figures.bubble_reduction(
        comp.bubble_reduction, comp.bubble_reduction_ci, comp.by_class, comp.by_class_ci
    )
    bars = fig.data[0]
    np.testing.assert_allclose(bars.y[0], 100 * comp.bubble_reduction)
    lo, hi = comp.bubble_reduction_ci
    assert bars.error_y.arrayminus[0] == pytest.approx(100 * (comp.bubble_reduction - lo))
    assert bars.error_y.array[0] == pytest.approx(100 * (hi - comp.bubble_reduction))
    wait = 1 + list(comp.by_class).index("straggler_wait")
    lo, hi = comp.by_class_ci["straggler_wait"]
    point = comp.by_class["straggler_wait"]
    assert bars.error_y.arrayminus[wait] == pytest.approx(100 * (point - lo))
    assert bars.error_y.array[wait] == pytest.approx(100 * (hi - point))
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
