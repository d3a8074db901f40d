"""Figures and the data behind them, checked against fsobs's own numbers (no Streamlit)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dashboard import figures
from dashboard.balance_plan import balance_plan, default_model
from dashboard.numbers import ms, pct, plain, points, ratio, tidy
from dashboard.ops import bar_names, lane_places, rank_ops, top_ops
from dashboard.tables import (
    BUBBLE_CLASSES,
    all_to_all_frame,
    degenerate_terms,
    imbalance_steps,
    lateness_frame,
    merge_close,
    oracle_split,
    timeline_frame,
)
from dashboard.tracediff import FSOBS_SOURCE, HTA_SOURCE, change_counts, fsobs_table, op_diff
from fsobs import analyze_path, load_rank
from fsobs.analysis.comparison.ab import compare
from fsobs.analysis.costfit import fit_cost
from fsobs.export import export_rank, export_run
from fsobs.runformat import read_step_lengths
from optim.balance import CostModel, imbalance
from tests.support.kineto import BASE_NS, GLOO_TID, MAIN_TID, cpu_doc, cpu_op, gloo, write
from tests.support.stores import FIRST_STEP, global_batches


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


LANE_COLUMNS = {  # lane -> (the class, its column of the bubble table), by fsobs's names
    "busy": ("busy", "busy_ms"),
    "exposed_comm": ("exposed_comm", "exposed_comm_ms"),
    "straggler_wait": ("straggler_wait", "straggler_wait_ms"),
    "host_idle": ("host_idle", "host_idle_ms"),
    "other": ("other", "other_ms"),
}
SHOWN = {lane: lane.replace("_", " ") for lane in LANE_COLUMNS}
"""The legend's name of each lane: the class's one name on screen."""


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
    assert set(lanes) <= set(SHOWN.values())
    labels = dict(zip(fig.layout.yaxis.tickvals, fig.layout.yaxis.ticktext, strict=True))
    row_rank = {
        start + offset: labels[start + (len(lanes) - 1) / 2]
        for start in range(0, len(lanes) * len(analysis.run.rank_ids), len(lanes))
        for offset in range(len(lanes))
    }
    table = analysis.steps[analysis.steps["step"].isin(window)].groupby("rank").sum()
    chosen = [b for b in analysis.bubbles if b.step in window]
    origin = min(b.window[0] - offsets.get(b.rank, 0) for b in chosen)
    by_name = {shown: lane for lane, shown in SHOWN.items()}
    for trace in fig.data:
        cls, column = LANE_COLUMNS[by_name[trace.name]]
        data = np.asarray(trace.customdata, dtype=float)  # rank, class ms, intervals, fill %
        base, width = np.asarray(trace.base, dtype=float), np.asarray(trace.x, dtype=float)
        np.testing.assert_allclose(base + width, bars.loc[bars["lane"] == cls, "end_ms"])
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
    fig = figures.balance_bars(plan.per_rank, "relative units")
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


# ------------------------------------------------------------------ issue 26 points 3 and 4


def _nested_cpu_rank(tmp_path):
    """One gloo rank, step 1 = [0, 100) µs: aten::linear [10, 50) calls aten::addmm [15, 35),
    which calls aten::mm [20, 32); a gloo all_reduce [50, 80) on its worker thread. Self time
    (µs): linear 40 - 20 = 20, addmm 20 - 12 = 8, mm 12, the all_reduce 30."""
    ops = [
        cpu_op("aten::linear", 10, 40),
        cpu_op("aten::addmm", 15, 20),
        cpu_op("aten::mm", 20, 12),
    ]
    doc = cpu_doc(0, [*ops, gloo("all_reduce", 50, 30)], world_size=1)
    return load_rank(write(tmp_path / "rank0.json", doc))


def test_rank_ops_take_self_time_and_name_the_bars(tmp_path):
    ops = rank_ops(_nested_cpu_rank(tmp_path), "cpu")
    self_us = dict(zip(ops["name"], ops["self_ns"] / 1e3, strict=True))
    assert self_us == {"aten::linear": 20, "aten::addmm": 8, "aten::mm": 12, "gloo:all_reduce": 30}
    table = top_ops(ops, [1])
    assert table["name"].tolist() == ["gloo:all_reduce", "aten::linear", "aten::mm", "aten::addmm"]
    np.testing.assert_allclose(table["self_ms"], [0.030, 0.020, 0.012, 0.008])
    np.testing.assert_allclose(table["total_ms"], [0.030, 0.040, 0.012, 0.020])
    np.testing.assert_allclose(table["self_share"], np.array([30, 20, 12, 8]) / 70)
    assert table["where"].tolist() == [f"thread {GLOO_TID}"] + [f"thread {MAIN_TID}"] * 3
    # a busy bar from 26 µs on holds 24/40 of linear, 6/12 of mm, 9/20 of addmm: times their
    # self time, 12, 6 and 3.6 µs
    bars = pd.DataFrame(
        {
            "rank": [0, 0],
            "lane": ["busy", "exposed_comm"],
            "start_ms": [0.026, 0.0],
            "end_ms": [0.1, 0.1],
        }
    )
    names = bar_names(bars, ops, {0: BASE_NS})
    main, worker = f"thread {MAIN_TID}", f"thread {GLOO_TID}"
    assert names == [
        f"aten::linear ×1 (0.012 ms, {main}); aten::mm ×1 (0.006 ms, {main}); "
        f"aten::addmm ×1 (0.004 ms, {main})",
        f"gloo:all_reduce ×1 (0.030 ms, {worker})",
    ]
    assert lane_places(bars, ops) == {(0, "busy"): main, (0, "exposed_comm"): worker}


def test_timeline_labels_its_lanes_and_names_its_ops(runs):
    analysis = runs["sim/control"]
    window = analysis.run.steps[:2]
    bars = timeline_frame(analysis.bubbles, window, analysis.collectives.offsets_ns)
    names = [f"op {i}" for i in range(len(bars))]
    places = {(r, lane): f"stream {r}" for r in analysis.run.rank_ids for lane in LANE_COLUMNS}
    fig = figures.step_timeline(bars, window, names=names, places=places)
    lanes = [lane for lane in LANE_COLUMNS if lane in set(bars["lane"])]
    for trace, lane in zip(fig.data, lanes, strict=True):
        assert trace.name == SHOWN[lane]
        assert list(trace.hovertext) == [names[i] for i in bars.index[bars["lane"] == lane]]
        assert "%{hovertext}" in trace.hovertemplate
    texts = {(a.y, a.text) for a in fig.layout.annotations}
    assert texts == {
        (number * len(lanes) + offset, f"{SHOWN[lane]} · stream {rank}")
        for number, rank in enumerate(analysis.run.rank_ids)
        for offset, lane in enumerate(lanes)
    }
    plain_fig = figures.step_timeline(bars, window)
    assert plain_fig.data[0].hovertext is None
    assert plain_fig.layout.annotations[0].text == SHOWN[lanes[0]]


def test_classes_over_steps_stack_to_the_mean_window(runs):
    steps = runs["sim/control"].steps
    fig = figures.classes_over_steps(steps)
    assert [t.name for t in fig.data] == ["busy", *(c.replace("_", " ") for c in BUBBLE_CLASSES)]
    stacked = np.sum([np.asarray(t.y, dtype=float) for t in fig.data], axis=0)
    np.testing.assert_allclose(stacked, steps.groupby("step")["window_ms"].mean().to_numpy())
    some = figures.classes_over_steps(steps, [1])
    np.testing.assert_allclose(some.data[0].y, steps.loc[steps["rank"] == 1, "busy_ms"])
    assert "1 ranks" in _title(some)


def test_zero_wait_heatmap_is_drawn_as_zero():
    steps = pd.DataFrame({"rank": [0, 1, 0, 1], "step": [1, 1, 2, 2], "straggler_wait_ms": 0.0})
    fig = figures.straggler_wait_heatmap(steps)
    heat = fig.data[0]
    assert (heat.zmin, heat.zmax) == (0.0, 1.0) and _title(fig).endswith("no rank waited")
    steps["straggler_wait_ms"] = [0.0, 2.0, 0.5, 0.0]
    assert figures.straggler_wait_heatmap(steps).data[0].zmax == 2.0


def test_straggler_ticks_name_every_rank_only_over_32_ranks():
    """A tick per rank while the stragglers span 32 ranks (here 10..41); over 33 (10..42)
    Plotly's own ticks, still whole ranks."""

    def axis(last: int):  # the stragglers of steps 1..3: ranks 10, last, 20
        per_step = pd.DataFrame({"step": [1, 2, 3], "rank": [10, last, 20]})
        return figures.straggler_steps(per_step.assign(wait_caused_ms=1.0)).layout.yaxis

    assert (axis(41).tickmode, axis(41).dtick, axis(41).tickformat) == ("linear", 1, "d")
    assert (axis(42).tickmode, axis(42).dtick, axis(42).tickformat) == (None, None, "d")


def test_data_attribution_is_a_density_above_1000_points():
    """256 ranks x 4 steps (1024 points): their density, every point counted once in its
    cell; x 3 steps (768): every point, in SVG. The points: cost = rank (0..255), lateness =
    step ms, so each of the 40 cost bins holds 6 or 7 ranks and each step its own row."""

    def frame(num_steps: int) -> pd.DataFrame:
        rank, step = np.divmod(np.arange(256 * num_steps), num_steps)
        return pd.DataFrame({"rank": rank, "step": step, "cost": rank * 1.0, "lateness_ms": step})

    (trace,) = figures.data_attribution(frame(3), "est_cost").data
    assert (trace.type, len(trace.x)) == ("scatter", 256 * 3)
    fig = figures.data_attribution(frame(4), "est_cost")
    (density,) = fig.data
    z = np.nan_to_num(np.asarray(density.z, dtype=float))
    assert density.type == "heatmap" and z.shape == (30, 40)  # lateness rows x cost columns
    assert z.sum() == 256 * 4
    # ranks 0..255 over 40 bins of width 255/40: bin k holds the ranks r with k <= r*40/255 < k+1
    per_bin = np.bincount(np.minimum((np.arange(256) * 40 / 255).astype(int), 39), minlength=40)
    assert z.sum(axis=0).tolist() == (per_bin * 4).tolist()
    # steps 0..3 over 30 bins of width 3/30: the rows 0, 10, 20 and 29 (the last edge closed)
    assert np.flatnonzero(z.sum(axis=1)).tolist() == [0, 10, 20, 29]
    assert "density of the 1,024 (rank, step) points" in fig.layout.title.text


def test_straggler_axis_is_whole_ranks_and_costs_have_units(runs):
    per_step = runs["reference/gloo_straggler_4rank"].stragglers.per_step
    axis = figures.straggler_steps(per_step).layout.yaxis
    assert (axis.dtick, axis.tickformat) == (1, "d")
    analysis = runs["sim/control"]
    fig = figures.data_attribution(lateness_frame(analysis), "est_cost")
    assert fig.layout.xaxis.title.text.endswith("(est_cost: the job's cost-model units)")
    assert fig.layout.xaxis.exponentformat == "power"  # not Plotly's "3.5B"
    assert "3.5B" not in fig.data[0].hovertemplate and ",.4~r" in fig.data[0].hovertemplate


def test_all_to_all_table_orders_by_imbalance_and_draws_the_matrix(runs):
    analysis = runs["sim/control"]
    per = analysis.collectives.all_to_all.per_instance
    worst = per[["send_imbalance", "recv_imbalance"]].astype(float).max(axis=1)
    expected = per.assign(w=worst).sort_values("w", ascending=False)["instance"].tolist()
    frame = all_to_all_frame(analysis)
    assert frame["instance"].tolist() == expected and frame["rank x rank matrix"].all()
    np.testing.assert_allclose(
        frame["MB sent"], per.set_index("instance").loc[expected, "send_bytes_total"] / 1e6
    )
    ranks, matrix = analysis.collectives.all_to_all.matrices[expected[0]]
    fig = figures.all_to_all_matrix(ranks, matrix, expected[0], 12)
    np.testing.assert_allclose(np.asarray(fig.data[0].z, dtype=float), matrix / 1e6)
    assert fig.data[0].zmin == 0.0
    assert _title(fig).startswith(f"all_to_all(v) instance {expected[0]}")
    gloo = all_to_all_frame(runs["reference/gloo_straggler_4rank"])
    assert len(gloo) == 4 and not gloo["rank x rank matrix"].any()  # no split sizes recorded


def test_numbers_read():
    assert tidy(pd.DataFrame({"v": [-1e-15, 105141495.3504, 0.55440225, 15.3237]}))[
        "v"
    ].tolist() == [0.0, 105141495.0, 0.5544, 15.32]
    assert (ms(2.044512), ms(0.0032), ms(float("nan"))) == ("2.04 ms", "3.2 µs", "n/a")
    assert (pct(0.61038), points(0.012), points(-0.0349)) == ("61.0%", "+1.2 pp", "-3.5 pp")
    assert (ratio(1.30855), plain(3.5e9, "units"), plain(0.000123456)) == (
        "1.309×",
        "3,500,000,000 units",
        "0.0001235",
    )


def test_oracle_split_never_exceeds_the_total_and_fits_flag_one_term():
    assert oracle_split(10.0, 0.3) == pytest.approx((3.0, 7.0))
    assert oracle_split(10.0, 1.2) == (10.0, 0.0)
    assert oracle_split(10.0, None) is None and oracle_split(10.0, float("nan")) is None
    assert degenerate_terms(CostModel(c0=0, a=0, b=2.5)) == "L²"
    assert degenerate_terms(CostModel(c0=1, a=0, b=2.5)) is None
    assert degenerate_terms(CostModel(c0=0, a=0, b=0)) is None


def test_export_rank_is_the_file_export_run_writes(runs, tmp_path):
    analysis = runs["sim/control"]
    written = export_run(analysis.run, analysis.bubbles, tmp_path / "out")
    for rank in (0, 3):
        data = export_rank(analysis.run[rank], analysis.bubbles.of_rank(rank))
        on_disk = next(p for p in written if p.name.startswith(f"rank{rank}."))
        assert gzip.decompress(data) == gzip.decompress(on_disk.read_bytes())


def test_no_page_has_a_bare_string_that_streamlit_would_draw():
    """Streamlit's magic writes a string alone on a line of a page script to the page (an
    attribute docstring once showed at the top of Bubbles, Compare and Runs): none but the
    module docstrings, and the shipped config turns magic off as well."""
    import ast

    import tomllib

    from tests.support.stores import APP

    app = Path(APP)
    pages = sorted((app.parent / "app_pages").glob("*.py")) + [app]
    bare = []
    for path in pages:
        for node in ast.walk(ast.parse(path.read_text())):
            body = getattr(node, "body", [])
            for i, stmt in enumerate(body if isinstance(body, list) else []):
                value = getattr(stmt, "value", None)
                if isinstance(stmt, ast.Expr) and isinstance(value, ast.Constant) and i > 0:
                    bare.append(f"{path.name}:{stmt.lineno}")
    assert bare == []
    config = tomllib.loads((app.parent / ".streamlit" / "config.toml").read_text())
    assert config["runner"]["magicEnabled"] is False


def test_cost_fit_above_1000_points_is_their_density_and_the_line():
    """1200 (rank, step) points on measured = 2 x predicted (predicted 0..1199 ms): every
    point counted once, the y = x line kept, the title says how many points."""
    predicted = np.arange(1200, dtype=float)
    points = pd.DataFrame(
        {"rank": np.arange(1200) % 300, "step": np.arange(1200) // 300}
        | {"predicted_ms": predicted, "measured_ms": 2 * predicted}
    )
    fig = figures.cost_fit(points)
    cells, line = fig.data
    assert cells.type == "heatmap" and np.nansum(np.asarray(cells.z, dtype=float)) == 1200
    assert list(line.x) == [0.0, 2398.0] and list(line.y) == [0.0, 2398.0]
    assert "density of the 1,200 (rank, step) points" in _title(fig)
