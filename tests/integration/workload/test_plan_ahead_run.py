"""The balance plan made ahead in the real job (torchrun, 2 gloo ranks, torchrec DMP, profiled):
``## fsobs:balance ##`` on the planner thread, not the training thread, every sample of each
global batch trained exactly once, and the same training as with the plans made on the training
thread (``FSOBS_PLAN_AHEAD=0``): the same samples on each rank in the same order, so the same
losses and parameters, bit for bit. And the analyzer: a range on another thread is no part of
the training thread's step (a hand-built trace)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from fsobs.cli import build_parser  # noqa: E402
from fsobs.cli.run import job_config  # noqa: E402
from fsobs.runformat import read_sidecars  # noqa: E402
from fsobs.trace import load_run  # noqa: E402
from fsobs.workload.config import ModelConfig, data_config_for  # noqa: E402
from fsobs.workload.data import SyntheticHistories, global_batches  # noqa: E402
from fsobs.workload.launch import LaunchConfig, launch  # noqa: E402
from fsobs.workload.train import PLAN_AHEAD_ENV  # noqa: E402
from optim.markers import BALANCE_MARKER, BALANCE_WAIT_MARKER, DATA_MARKER  # noqa: E402
from optim.plan import batch_digest  # noqa: E402
from tests.support.bubble_rows import checked_table, expect_row, load_docs  # noqa: E402
from tests.support.kineto import cpu_doc, cpu_op, x  # noqa: E402

STEPS, BATCH, WORLD = 10, 8, 2
PLANNER_TID = 400


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("plan_ahead")
    out = {}
    for name, env in (("ahead", "1"), ("in_place", "0")):
        argv = ["run", f"--world-size={WORLD}", f"--out={root / name}", f"--steps={STEPS}"]
        argv += ["--model-size=tiny", f"--batch-size={BATCH}", "--balance"]
        job = job_config(build_parser().parse_args(argv))  # as `fsobs run` builds it
        job = dataclasses.replace(job, save_params=True, optimizer="sgd")  # test-only knobs
        config = LaunchConfig(world_size=WORLD, out=root / name, job=job, env={PLAN_AHEAD_ENV: env})
        assert launch(config, progress=False) == 0, name
        out[name] = root / name
    return out


def _ranges(run: Path, rank: int) -> tuple[pd.DataFrame, object]:
    """The rank's events and its training thread (the one with the ProfilerSteps)."""
    events = load_run(run).ranks[rank].events
    (main,) = set(events.loc[events["kind"] == "step", "tid"])
    return events, main


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("rank", range(WORLD))
def test_the_balance_range_is_on_the_planner_thread(runs, rank):
    """Steps 2-9 are recorded. torchrec's pipeline takes batch s + 2 in step s, so in place the
    plans of batches 4-9 are made in steps 2-7 (6 ranges), and made ahead the planner makes
    the plan of batch s + 3 once batch s + 2 is taken: batches 5-9 in steps 2-6 (5 ranges, the
    last may end after the recording). Made ahead: every ``## fsobs:balance ##`` range is on
    one thread that is not the training thread, and the training thread takes its plans under
    ``balance_wait`` inside its data ranges. In place: the ranges are on the training thread
    (the control)."""
    events, main = _ranges(runs["ahead"], rank)
    balance = events[events["name"] == BALANCE_MARKER]
    assert len(balance) >= 4
    assert main not in set(balance["tid"]) and len(set(balance["tid"])) == 1
    waits = events[events["name"] == BALANCE_WAIT_MARKER]
    assert set(waits["tid"]) == {main} and len(waits) >= 6
    data = events[(events["name"] == DATA_MARKER) & (events["tid"] == main)]
    starts, ends = data["ts_ns"].to_numpy(), (data["ts_ns"] + data["dur_ns"]).to_numpy()
    for ts in waits["ts_ns"]:
        assert ((starts <= ts) & (ts < ends)).any()

    events, main = _ranges(runs["in_place"], rank)
    balance = events[events["name"] == BALANCE_MARKER]
    assert len(balance) == 6 and set(balance["tid"]) == {main}
    assert not (events["name"] == BALANCE_WAIT_MARKER).any()


def _sidecar(run: Path) -> pd.DataFrame:
    return read_sidecars(run).sort_values(["step", "rank"]).reset_index(drop=True)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_every_sample_once_and_the_same_training_as_in_place(runs):
    """Per step, the ranks' samples together are the global batch (count, length sums, the
    batch digest); each rank trains the samples it trains in place, in the same order (the
    sidecar's per-sample lengths), so its losses and final parameters are the same bits."""
    data = SyntheticHistories(data_config_for(ModelConfig.preset("tiny"), num_samples=100_000))
    batches = global_batches(len(data), WORLD * BATCH, STEPS, 0)
    ahead, in_place = _sidecar(runs["ahead"]), _sidecar(runs["in_place"])
    for step, batch in enumerate(batches):
        rows = ahead[ahead["step"] == step]
        assert rows["num_samples"].sum() == len(batch)
        want = data.lengths[batch].astype(np.int64)
        assert rows["len_sum"].sum() == want.sum()
        assert rows["len_sq_sum"].sum() == (want**2).sum()
        assert set(rows["batch_digest"]) == {batch_digest(batch)}
    assert set(ahead["num_samples"]) == {BATCH}  # kk: equal counts
    columns = ["step", "rank", "imbalance_before", "imbalance_after", "loss"]
    assert ahead[columns].to_dict("records") == in_place[columns].to_dict("records")
    for got, want_lengths in zip(ahead["seq_lengths"], in_place["seq_lengths"], strict=True):
        assert list(got) == list(want_lengths)
    assert (ahead["imbalance_after"] < ahead["imbalance_before"]).any()
    for rank in range(WORLD):
        got = torch.load(runs["ahead"] / f"params.rank{rank}.pt")
        want_params = torch.load(runs["in_place"] / f"params.rank{rank}.pt")
        assert got.keys() == want_params.keys()
        for name, value in got.items():
            assert torch.equal(value, want_params[name]), (rank, name)


def test_a_range_on_the_planner_thread_is_no_part_of_the_training_threads_step(tmp_path):
    """Both ranks run the same training thread; rank 0 also has a planner thread whose balance
    range (with an aten op inside) overlaps the data range. The training thread decides alone.

    ::

        t (µs)      0        40  42 44        60                  100
        main        |mm======|d|ww|dddddddddd|mm==================|   d: data, w: balance_wait
        planner (r0)     |## fsobs:balance ####|                         [10, 56)
                                      |sort|                             aten::sort [45, 55)

    Each rank: compute = [0, 40) + [60, 100) = 80 µs busy; the data range [40, 60) has no
    compute op and nothing in flight: host_idle 20 µs (the balance_wait inside it too). Were
    the planner's sort the training thread's, [45, 55) would be busy: 90 and 10.
    """

    def main_thread() -> list[dict]:
        return [
            cpu_op("aten::mm", 0, 40),
            x(DATA_MARKER, "user_annotation", 40, 20),
            x(BALANCE_WAIT_MARKER, "user_annotation", 42, 2),
            cpu_op("aten::mm", 60, 40),
        ]

    planner = [
        x(BALANCE_MARKER, "user_annotation", 10, 46, tid=PLANNER_TID),
        x("aten::sort", "cpu_op", 45, 10, tid=PLANNER_TID),
    ]
    docs = [cpu_doc(0, [*main_thread(), *planner]), cpu_doc(1, main_thread())]
    table = checked_table(load_docs(tmp_path, docs))
    for rank in (0, 1):
        expect_row(table, rank, 1, window=100, busy=80, host_idle=20)
