"""What-if: the segment-graph replay on hand-built graphs, the balance re-split on lengths whose
partition is known, the oracle, predictions against simulated runs whose truth is known, CLI."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from fsobs.analysis import analyze_path
from fsobs.analysis.costfit import CostFit
from fsobs.analysis.whatif.calibration import Calibration, partition_model
from fsobs.analysis.whatif.predict import (
    TOGGLES,
    _oracle,
    _oracle_batch,
    _per_step,
    _Setup,
    whatif,
)
from fsobs.analysis.whatif.priority import embedding_blocked_ms, pec_overlap, prioritize
from fsobs.analysis.whatif.replay import (
    BUSY,
    EXPOSED,
    KINDS,
    LOCAL,
    WAIT,
    Changes,
    Piece,
    SegmentGraph,
    build_graph,
    replay,
    replay_batch,
    replay_error,
)
from fsobs.analysis.whatif.splits import resplit
from fsobs.cli import main
from fsobs.errors import RunError
from fsobs.report import render_whatif, whatif_json
from fsobs.simulate.simulator import SimConfig, simulate, truth_frame, write_run
from optim.balance import CostModel

MS = 1_000_000


def _local(step: int, busy_ms: float, arrivals: list[int] = ()) -> Piece:
    lengths = np.zeros(len(KINDS), np.int64)
    lengths[BUSY] = int(busy_ms * MS)
    at_end = lengths.copy()
    return Piece(
        step,
        LOCAL,
        lengths=lengths,
        parts=[(BUSY, int(busy_ms * MS))],
        arrivals=[(k, at_end) for k in arrivals],
        first_of_step=False,
    )


def _two_ranks(compute: dict[int, tuple[float, float]], transfer_ms: float) -> SegmentGraph:
    """One step, two ranks: ``busy_1 | arrive at k=0 | wait | exposed | busy_2``, measured with
    the compute given per rank (ms)."""
    last = max(c[0] for c in compute.values())
    pieces = {}
    for rank, (before, after) in compute.items():
        chain = [_local(0, before, [0])]
        chain[0].first_of_step = True
        if before < last:
            chain.append(Piece(0, WAIT, length=int((last - before) * MS), owner=0))
        chain.append(Piece(0, EXPOSED, length=int(transfer_ms * MS), owner=0))
        chain.append(_local(0, after))
        pieces[rank] = chain
    end = int((last + transfer_ms) * MS)
    return SegmentGraph(
        ranks=[0, 1],
        steps=[0],
        start_ns={0: 0, 1: 0},
        pieces=pieces,
        transfer_ns={0: int(transfer_ms * MS)},
        end_delta_ns={(0, 0): 0, (0, 1): 0},
        members={0: 2},
        instances=pd.DataFrame(
            {
                "instance": [0],
                "role": ["embedding"],
                "group": ["0"],
                "coll": ["all_to_all"],
                "step": [0],
                "last_arrival_ns": [int(last * MS)],
                "end_ns": [end],
            }
        ),
        spans=pd.DataFrame(
            {"instance": [0, 0], "rank": [0, 1], "start_ns": [0, 0], "end_ns": [end, end]}
        ),
    )


def test_replay_of_two_ranks_gives_the_waits_by_hand() -> None:
    # rank 0 computes 10 ms, rank 1 4 ms, then a 2 ms transfer, then 5 ms each
    graph = _two_ranks({0: (10.0, 5.0), 1: (4.0, 5.0)}, transfer_ms=2.0)
    table = replay(graph).set_index("rank")
    assert table.loc[1, "straggler_wait_ms"] == pytest.approx(6.0)
    assert table.loc[0, "straggler_wait_ms"] == pytest.approx(0.0)
    assert table.loc[0, "exposed_comm_ms"] == pytest.approx(2.0)
    assert table.loc[1, "window_ms"] == pytest.approx(10 + 2 + 5)
    assert table.loc[1, "bubble_ms"] == pytest.approx(8.0)
    # rank 0's compute halved: it now arrives at 5 ms (before: 10), rank 1 at 4 ms
    scale = np.ones((2, 1, len(KINDS)))
    scale[0, 0, BUSY] = 0.5
    faster = replay(graph, Changes(scale=scale)).set_index("rank")
    assert faster.loc[1, "straggler_wait_ms"] == pytest.approx(1.0)
    assert faster.loc[0, "straggler_wait_ms"] == pytest.approx(0.0)
    assert faster.loc[0, "window_ms"] == pytest.approx(5 + 2 + 2.5)
    assert faster.loc[1, "window_ms"] == pytest.approx(4 + 1 + 2 + 5)
    # extra host time at the step's start delays the arrival too
    extra = replay(graph, Changes(extra_idle_ns=np.array([[0.0], [3 * MS]]))).set_index("rank")
    assert extra.loc[1, "host_idle_ms"] == pytest.approx(3.0)
    assert extra.loc[1, "straggler_wait_ms"] == pytest.approx(3.0)


def test_replay_error_is_zero_for_an_identical_run() -> None:
    graph = _two_ranks({0: (3.0, 1.0), 1: (7.0, 2.0)}, transfer_ms=1.0)
    measured = replay(graph)
    err = replay_error(measured, replay(graph))
    assert err["step_time_median"] == 0 and err["classes_p90"] == 0


def calibration(
    lengths: dict[tuple[int, int], list[int]], model: CostModel, steps: list[int] | None = None
) -> Calibration:
    """Two ranks of speed 1 and no residual over ``steps`` (default ``[0]``): the predicted busy
    time of each (rank, step) is ``model`` on its ``lengths``."""
    ranks, steps = [0, 1], steps or [0]
    predicted = np.array(
        [[float(model(np.array(lengths[(r, s)])).sum()) for s in steps] for r in ranks]
    )
    fit = CostFit(model=model, r2=1.0, rmse_ms=0.0, n_points=len(lengths), points=pd.DataFrame())
    return Calibration(
        ranks=ranks,
        steps=steps,
        busy_ns=predicted.copy(),
        predicted_ns=predicted,
        speed=np.ones(2),
        eta=np.ones((2, len(steps))),
        contention_ns=np.zeros((2, len(steps))),
        fit=fit,
        lengths={k: np.array(v) for k, v in lengths.items()},
        run_path=Path("run"),
    )


def test_balance_resplits_with_the_jobs_planner() -> None:
    # cost L²: rank 0 has 10, 10 (cost 200), rank 1 has 1, 1 (cost 2); equal counts: KK gives
    # each rank one 10 and one 1 (cost 101 each)
    model = CostModel(c0=0.0, a=0.0, b=1.0)
    cal = calibration({(0, 0): [10, 10], (1, 0): [1, 1]}, model)
    split = resplit(cal, model, planner_ns=0.0)
    assert split.predicted_ns[:, 0].tolist() == [101.0, 101.0]
    assert split.imbalance_before[0] == pytest.approx(200 / 101)
    assert split.imbalance_after[0] == pytest.approx(1.0)


def test_balance_needs_lengths_of_every_rank() -> None:
    model = CostModel(c0=0.0, a=0.0, b=1.0)
    cal = calibration({(0, 0): [10, 10], (1, 0): [1, 1]}, model)
    del cal.lengths[(1, 0)]
    with pytest.raises(RunError, match="per-sample lengths") as caught:
        resplit(cal, model)
    assert caught.value.path == str(Path("run") / "steps.rank1.jsonl")


def test_partition_model_is_the_one_behind_est_cost() -> None:
    job = CostModel(c0=3.0, a=2.0, b=0.5)
    rows = []
    for rank, lengths in enumerate(([1, 2, 3], [4, 5], [10, 1, 1, 7])):
        arr = np.array(lengths)
        rows.append(
            {
                "rank": rank,
                "step": 0,
                "num_samples": len(arr),
                "len_sum": arr.sum(),
                "len_sq_sum": (arr**2).sum(),
                "est_cost": float(job(arr).sum()),
            }
        )
    found, source = partition_model(pd.DataFrame(rows), CostModel(c0=1.0, a=0.0, b=0.0))
    assert (found.c0, found.a, found.b) == pytest.approx((3.0, 2.0, 0.5))
    assert "est_cost" in source
    rows[0]["est_cost"] *= 1.5  # not a cost model any more: the fallback
    assert partition_model(pd.DataFrame(rows), job)[1].startswith("fitted")


QUIET = dict(
    noise_sigma=0.0,
    speed_sigma=0.0,
    host_sigma=0.0,
    chunk_ns=1_000,
    optimizer_ns=1_000,
    memcpy_ns=1_000,
    batch_per_rank=16,
)


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A noise-free 4-rank job written under each policy (same seed: same batches)."""
    root = tmp_path_factory.mktemp("whatif_sims")
    cfg = SimConfig(world_size=4, steps=6, seed=3, **QUIET)
    out = {}
    for name, toggles in (
        ("base", ()),
        ("balance", ("balance",)),
        ("priority", ("priority_overlap",)),
        ("both", ("balance", "priority_overlap")),
    ):
        sched = simulate(cfg, toggles)
        write_run(sched, root / name, workers=1)
        out[name] = root / name
        out[f"{name}_truth"] = truth_frame(sched)
    return out


def _truth_bubble(truth: pd.DataFrame) -> float:
    return float((truth["window_ms"] - truth["busy_ms"]).mean())


def test_replay_reproduces_a_simulated_run(sims: dict) -> None:
    analysis = analyze_path(sims["base"])
    err = replay_error(analysis.steps, replay(build_graph(analysis)))
    assert err["step_time_max"] < 1e-6 and err["classes_max"] < 1e-6


def test_whatif_predicts_the_simulated_balance_and_priority(sims: dict) -> None:
    w = whatif(analyze_path(sims["base"]), draws=20, planner_ns=0.0)
    by = {p.toggles: p for p in w.predictions}
    assert len(by) == 7 and w.replay.passed
    truth = _truth_bubble(sims["base_truth"])
    for toggle, key in (("balance", "balance_truth"), ("priority_overlap", "priority_truth")):
        expected = 1 - _truth_bubble(sims[key]) / truth
        assert by[(toggle,)].bubble_reduction == pytest.approx(expected, abs=0.02), toggle
    lo, hi = by[("balance",)].bubble_reduction_interval
    assert lo <= by[("balance",)].bubble_reduction <= hi
    # noise-free: the oracle leaves (almost) no straggler wait, all of it came from the data
    # (left: the fixed kernels, 7 µs per step, scaled with the rest of the busy time)
    wait = w.baseline["straggler_wait_ms_per_step"]
    assert w.oracle.by_class["straggler_wait"] < 1e-3 * wait
    assert w.oracle.data_share == pytest.approx(1.0, abs=1e-3)
    assert w.oracle.wait_from_noise_ms_per_step < 1e-3 * wait


def _offsetting_setup() -> _Setup:
    """Two ranks whose data and noise offset each other: the measured busy times are 15 and 9
    ms (rank 0: 10 before the collective, 5 after; rank 1: 4 and 5), while the data predicts
    10 and 14 (the cost model's ns), so ``eta`` is 15/10 and 9/14 (speeds 1)."""
    graph = _two_ranks({0: (10.0, 5.0), 1: (4.0, 5.0)}, transfer_ms=2.0)
    busy = np.array([[15.0 * MS], [9.0 * MS]])
    model = CostModel(c0=1.0, a=0.0, b=0.0)
    fit = CostFit(model=model, r2=1.0, rmse_ms=0.0, n_points=2, points=pd.DataFrame())
    cal = Calibration(
        ranks=[0, 1],
        steps=[0],
        busy_ns=busy,
        predicted_ns=np.array([[10.0], [14.0]]),
        speed=np.ones(2),
        eta=np.array([[15 / 10], [9 / 14]]),
        contention_ns=np.zeros((2, 1)),
        fit=fit,
        lengths={},
        run_path=Path("run"),
    )
    return _Setup(graph, replay(graph), cal, None, busy, np.zeros((2, 1)))


def test_the_noise_part_is_never_above_the_wait_it_is_part_of(sims: dict) -> None:
    """The run: rank 1 waits 10 - 4 = 6 ms, 3 ms per rank and step.

    Only the data differing: busy 10 and 14 (the mean 12 kept), rank 0 arrives at
    10 x 10/15 = 6.67, rank 1 at 4 x 14/9 = 6.22: 4/9 ms of wait, 2/9 per rank. Only the noise
    differing: 1.5 and 9/14 scaled to the mean 12, busy 16.8 and 7.2, arrivals 10 x 16.8/15 =
    11.2 and 4 x 7.2/9 = 3.2: 8 ms of wait, 4 per rank, above the run's 3 (the noise alone
    spreads the ranks further than data and noise together). Data share (2/9) / (2/9 + 4) =
    1/19; the parts 3/19 and 3 x 18/19."""
    setup = _offsetting_setup()
    replayed = replay_batch(setup.graph, [Changes(), *_oracle_batch(setup)])
    o = _oracle(setup, [_per_step(t) for t in replayed], 0.95, np.random.default_rng(0))
    assert o.straggler_wait_ms_per_step == pytest.approx(3.0)
    assert o.wait_from_data_ms_per_step == pytest.approx(2 / 9)
    assert o.wait_from_noise_ms_per_step == pytest.approx(4.0)  # a counterfactual
    assert o.data_share == pytest.approx(1 / 19)
    assert o.data_part_ms_per_step == pytest.approx(3 / 19)
    assert o.noise_part_ms_per_step == pytest.approx(3 * 18 / 19)
    # the report: the figure it gives for the noise, beside the wait, is a part of the wait
    console = Console(record=True, width=400)
    render_whatif(replace(whatif(analyze_path(sims["base"]), ("sm_free",), draws=2), oracle=o),
                  console)  # fmt: skip
    (line,) = [ln for ln in console.export_text().splitlines() if ln.startswith("straggler wait")]
    total = float(re.match(r"straggler wait (\d+\.\d+) ms per step", line)[1])
    noise = re.search(r"noise alone (\d+\.\d+)|(\d+\.\d+) from the noise", line)
    assert total == 3.0 and float(noise[1] or noise[2]) <= total, line
    assert line == (
        "straggler wait 3.00 ms per step: 0.16 of it from the data, 2.84 from the noise (data "
        "share 5.3% of the waits with only the data or only the noise differing between the "
        "ranks, 0.22 and 4.00: those do not add up)"
    )


def test_combinations_are_replayed_together(sims: dict) -> None:
    w = whatif(analyze_path(sims["base"]), ("balance", "priority_overlap"), draws=5, planner_ns=0.0)
    by = {p.toggles: p for p in w.predictions}
    assert set(by) == {("balance",), ("priority_overlap",), ("balance", "priority_overlap")}
    # together as the simulator runs them together (PEC's extra lookups are balanced too)
    truth = _truth_bubble(sims["base_truth"])
    expected = 1 - _truth_bubble(sims["both_truth"]) / truth
    both = by[("balance", "priority_overlap")].bubble_reduction
    assert both == pytest.approx(expected, abs=0.03)
    assert both != pytest.approx(
        by[("balance",)].bubble_reduction + by[("priority_overlap",)].bubble_reduction, abs=1e-3
    )


def test_whatif_json_shape(sims: dict) -> None:
    data = whatif_json(whatif(analyze_path(sims["base"]), ("sm_free",), draws=3))
    assert set(data) >= {"baseline", "replay", "predictions", "oracle"}
    pred = data["predictions"][0]
    assert pred["predicted"] is True and pred["toggles"] == ["sm_free"]
    assert len(pred["bubble_reduction_interval"]) == 2
    assert data["run"]["simulated"] is True
    json.dumps(data, allow_nan=False)
    # the typed results keep the JSON's keys and their order
    assert list(data) == [
        "run",
        "baseline",
        "replay",
        "calibration",
        "predictions",
        "oracle",
        "split_bound",
        "notes",
        "draws",
        "confidence",
    ]
    assert list(data["run"]) == [
        "path",
        "name",
        "world_size",
        "device",
        "simulated",
        "steps",
        "ranks",
    ]
    assert list(data["replay"])[-4:] == [
        "steps",
        "gate",
        "passed",
        "baseline_resampled_bubble_ms_per_step",
    ]
    assert list(data["calibration"]) == [
        "cost_fit",
        "rank_speed",
        "residual_sigma",
        "partition_model",
    ]
    assert list(data["calibration"]["cost_fit"]) == ["c0_ns", "a_ns", "b_ns", "r2"]
    assert list(data["oracle"])[0] == "predicted"
    assert list(data["oracle"])[-5:] == [
        "wait_from_data_ms_per_step",
        "wait_from_noise_ms_per_step",
        "data_share",
        "data_part_ms_per_step",
        "noise_part_ms_per_step",
    ]
    balanced = whatif_json(whatif(analyze_path(sims["base"]), ("balance",), draws=3))
    assert list(balanced["calibration"])[-4:] == [
        "balance_split",
        "imbalance_before",
        "imbalance_after",
        "planner_ms",
    ]


def test_unknown_toggle_is_refused(sims: dict) -> None:
    with pytest.raises(RunError, match="toggles"):
        whatif(analyze_path(sims["base"]), ("fast",))
    assert TOGGLES == ("balance", "priority_overlap", "sm_free")


def test_cli_whatif(sims: dict, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["whatif", str(sims["base"]), "--toggles", "balance", "--draws", "5", "--json"]) == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert [p["toggles"] for p in data["predictions"]] == [["balance"]]
    assert main(["whatif", str(sims["base"]), "--toggles", "sm_free", "--draws", "3"]) == 0
    out = capsys.readouterr().out
    assert "replay check (ok)" in out and "oracle" in out and "simulated" in out


def test_cli_whatif_errors(tmp_path: Path, sims: dict, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["whatif", str(sims["base"]), "--toggles", "faster"])
    assert exc.value.code == 2
    capsys.readouterr()
    assert main(["whatif", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "rank0.trace.json.gz").write_bytes((sims["base"] / "rank0.trace.json.gz").read_bytes())
    for rank in range(1, 4):
        src = sims["base"] / f"rank{rank}.trace.json.gz"
        (bare / src.name).write_bytes(src.read_bytes())
    assert main(["whatif", str(bare)]) == 2
    err = capsys.readouterr().err
    assert "balance needs step sidecars" in err and err.count("\n") == 1
    assert main(["whatif", str(bare), "--toggles", "sm_free", "--draws", "2"]) == 0
    assert main(["whatif", str(sims["base"]), "--draws", "0"]) == 2


def test_config_replace_keeps_quiet() -> None:
    cfg = replace(SimConfig(**QUIET), world_size=2)
    assert cfg.noise_sigma == 0.0 and cfg.world_size == 2


def _pec_baseline() -> SegmentGraph:
    """One step (step 1), two ranks, torchrec's sparse-dist order: P (the embedding collective
    before the lookup's, async), F (the lookup's output all-to-all, 4 ms), I (the next batch's
    input dist, async), D (the dense all-reduce, async, 1 ms), B (the backward embedding
    all-to-all, 2 ms). Rank 1's backward is 6 ms longer: rank 0 waits for it at B."""
    p, f, i, d, b = range(5)
    transfer = {p: 1, f: 4, i: 1, d: 1, b: 2}
    at = {0: {p: 2, f: 5, i: 19, d: 40, b: 41}, 1: {p: 2, f: 5, i: 19, d: 46, b: 47}}
    pieces = {}
    for rank, bwd in ((0, 20.0), (1, 26.0)):
        chain = [_local(1, 2.0, [p]), _local(1, 3.0, [f]), Piece(1, EXPOSED, owner=f)]
        chain[0].first_of_step = True
        chain += [_local(1, 10.0, [i]), _local(1, bwd, [d]), _local(1, 1.0, [b])]
        if rank == 0:
            chain.append(Piece(1, WAIT, owner=b))
        chain += [Piece(1, EXPOSED, owner=b), _local(1, 2.0)]
        pieces[rank] = chain
    last = {k: max(at[0][k], at[1][k]) for k in transfer}
    return SegmentGraph(
        ranks=[0, 1],
        steps=[1],
        start_ns={0: 0, 1: 0},
        pieces=pieces,
        transfer_ns={k: x * MS for k, x in transfer.items()},
        end_delta_ns={(k, r): 0 for k in transfer for r in (0, 1)},
        members={k: 2 for k in transfer},
        instances=pd.DataFrame(
            {
                "instance": list(transfer),
                "role": ["embedding", "embedding", "embedding", "dense", "embedding"],
                "group": ["0"] * 5,
                "coll": ["all_to_all"] * 3 + ["all_reduce", "all_to_all"],
                "step": [1] * 5,
                "msg_bytes": [0] * 5,  # unknown: F by the longest stretch after it
                "last_arrival_ns": [last[k] * MS for k in transfer],
                "end_ns": [(last[k] + transfer[k]) * MS for k in transfer],
            }
        ),
        spans=pd.DataFrame(
            [
                {
                    "instance": k,
                    "rank": r,
                    "start_ns": at[r][k] * MS,
                    "end_ns": (last[k] + transfer[k]) * MS,
                }
                for k in transfer
                for r in (0, 1)
            ]
        ),
    )


def test_pec_rewrites_a_step_by_hand() -> None:
    graph = _pec_baseline()
    base_table = replay(graph)
    base = {c: base_table.set_index("rank")[c].to_dict() for c in base_table.columns[1:]}
    # baseline: F exposed 4 ms on both; rank 0 waits 40+1 -> 46 for B, then B's 2 ms
    assert base["straggler_wait_ms"][0] == pytest.approx(6.0)
    assert embedding_blocked_ms(graph) == pytest.approx((4 + 6 + 2 + 4 + 2) / 2)
    pec_graph, notes = prioritize(graph, {0: 0.5, 1: 0.5})
    assert notes[0].startswith("PEC: 1 step(s) rewritten with a mean overlapped share of 0.50")
    # X_F' = 0.5 * 4, X_B' = 0.5 * 2; the masks take the step's smallest transfer (1 ms);
    # the extra lookups for step 0's deferred half: 2 * (1 - 0.5) * (5 - 2) = 3 ms of busy
    # time after the masks
    assert pec_graph.transfer_ns[1] == 2 * MS and pec_graph.transfer_ns[4] == 1 * MS
    masks = pec_graph.instances[pec_graph.instances["role"] == "pec_mask"]["instance"].tolist()
    assert [pec_graph.transfer_ns[m] for m in masks] == [MS, MS]
    table = replay(pec_graph)
    out = {c: table.set_index("rank")[c].to_dict() for c in table.columns[1:]}
    # forward: F arrives at 5 (ends 7), M1 5 -> 6, M2 6 -> 7, lookups 7 -> 10, F hidden;
    # backward: rank 0 at B by 41, waits on D until rank 1's 46, D's 1 ms, B' ends at 48
    for rank in (0, 1):
        assert out["busy_ms"][rank] == pytest.approx(base["busy_ms"][rank] + 3.0)
        assert out["window_ms"][rank] == pytest.approx(50.0)
    assert out["straggler_wait_ms"][0] == pytest.approx(5.0)  # moved to the dense one
    assert out["exposed_comm_ms"][0] == pytest.approx(1 + 1 + 1 + 1)  # M1, M2, D, B'
    assert out["exposed_comm_ms"][1] == pytest.approx(1 + 1 + 1)  # M1, M2, B'
    assert embedding_blocked_ms(pec_graph) == pytest.approx((3 + 3) / 2)
    # the original graph is untouched, and without an overlapped share PEC is not modelled
    assert replay(graph).equals(replay(_pec_baseline()))
    alone, _ = prioritize(graph)
    assert replay(alone).equals(base_table)


def test_pec_overlap_from_the_sidecars() -> None:
    sidecar = pd.DataFrame(
        {
            "step": [0, 0, 1, 1],
            "rank": [0, 1, 0, 1],
            "id_overlap": [None, None, *[{"t_user": 0.0, "t_item": 0.6, "t_cat": 1.0}] * 2],
        }
    )
    assert pec_overlap(sidecar) == {0: 0.0, 1: pytest.approx(0.8)}
    assert pec_overlap(sidecar.assign(id_overlap=None)) is None
    assert pec_overlap(None) is None
    # another job's tables (none of the reference job's): every recorded table counts
    other = sidecar.assign(id_overlap=[None, None, *[{"t_items": 0.3, "t_tags": 0.5}] * 2])
    assert pec_overlap(other) == {0: 0.0, 1: pytest.approx(0.4)}


def test_whatif_models_pec_from_recorded_overlap(sims: dict, tmp_path: Path) -> None:
    """A run whose sidecars record ``id_overlap`` gets PEC; the forward lookup (C1) and the
    backward gradient (C3) all-to-alls of the simulated job keep half their transfer."""
    run = tmp_path / "run"
    shutil.copytree(sims["base"], run)
    for side in run.glob("steps.rank*.jsonl"):
        lines = []
        for line in side.read_text().splitlines():
            record = json.loads(line)
            if record["step"] > 0:
                record["id_overlap"] = {"t_user": 0.0, "t_item": 0.4, "t_cat": 0.6}
            lines.append(json.dumps(record))
        side.write_text("\n".join(lines) + "\n")
    analysis = analyze_path(run)
    graph = build_graph(analysis)
    pec_graph, notes = prioritize(graph, pec_overlap(analysis.run.sidecar))
    rewritten = len(graph.steps) - 1  # the first step has no previous batch: share 0
    assert notes[0].startswith(f"PEC: {len(graph.steps)} step(s)")
    masks = pec_graph.instances[pec_graph.instances["role"] == "pec_mask"]
    assert len(masks) == 2 * len(graph.steps)
    halved = pec_graph.instances[pec_graph.instances["role"] == "pec_overlapped"]["instance"]
    shares = [pec_graph.transfer_ns[int(k)] / graph.transfer_ns[int(k)] for k in halved]
    assert sorted(shares)[-rewritten:] == pytest.approx([0.5] * rewritten, abs=1e-3)
    w = whatif(analysis, ("priority_overlap",), draws=3)
    assert any("embedding wait + exposed" in n for n in w.notes)
