"""The critical path on the multi-rank traces of other projects (``traces/other_projects``):
the segments tile each step's window, each lies inside what its rank really did, and the path
crosses ranks only where a collective's last member arrived."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import fsobs
from fsobs.analysis import Analysis, analyze_path
from tests.unit.analysis.test_critical_path import assert_tiles

OTHER = Path(__file__).resolve().parents[3] / "traces" / "other_projects"


@pytest.fixture(scope="module", params=["param_dlrm_8rank", "astrasim_megatron_tp8_8rank"])
def analyzed(request: pytest.FixtureRequest) -> tuple[Analysis, fsobs.Run]:
    source = OTHER / request.param
    return analyze_path(source), fsobs.load_run(source)


def test_segments_tile_every_step(analyzed: tuple[Analysis, fsobs.Run]) -> None:
    analysis, _ = analyzed
    path = analysis.critical_path
    assert len(path.steps) == len(analysis.run.steps)
    assert_tiles(path)


@pytest.mark.parametrize("kind", ["kernel", "op"])
def test_kernel_and_op_segments_lie_inside_an_event_of_that_name_on_that_rank(
    analyzed: tuple[Analysis, fsobs.Run], kind: str
) -> None:
    """Kernels inside a GPU event, ops (the host where the GPU idles) inside a CPU op."""
    analysis, run = analyzed
    segments = analysis.critical_path.segments
    chosen = segments[segments["kind"] == kind].reset_index()
    assert len(chosen)
    for rank, mine in chosen.groupby("rank"):
        ev = run[rank].events
        real = ev[ev["stream"] >= 0] if kind == "kernel" else ev[ev["cat"] == "cpu_op"]
        shift = analysis.collectives.offsets_ns[rank]
        spans = pd.DataFrame(
            {
                "name": real["name"].astype(str).to_numpy(),
                "lo": real["ts_ns"].to_numpy() - shift,
                "hi": (real["ts_ns"] + real["dur_ns"]).to_numpy() - shift,
            }
        )
        pairs = mine.merge(spans, on="name")
        inside = pairs[(pairs["lo"] <= pairs["start_ns"]) & (pairs["end_ns"] <= pairs["hi"])]
        assert set(inside["index"]) == set(mine["index"])


def test_collective_segments_lie_after_the_last_arrival_and_jumps_follow_the_last_rank(
    analyzed: tuple[Analysis, fsobs.Run],
) -> None:
    """A collective segment on rank r runs from the last arrival A (or later) to r's end of
    that collective at most; where the path comes from another rank, it comes from the last
    arriver, and the collective segment starts at A exactly."""
    analysis, _ = analyzed
    inst = analysis.collectives.instances.set_index(["instance", "rank"])
    for _, rows in analysis.critical_path.segments.groupby("step"):
        rows = rows.reset_index(drop=True)
        for k in rows.index[rows["kind"] == "collective"]:
            seg = rows.loc[k]
            member = inst.loc[(seg["instance"], seg["rank"])]
            assert member["arrival_last_ns"] <= seg["start_ns"] < seg["end_ns"] <= member["end_ns"]
            if k > 0 and rows.loc[k - 1, "rank"] != seg["rank"]:
                assert rows.loc[k - 1, "rank"] == member["last_rank"]
                assert seg["start_ns"] == member["arrival_last_ns"]


def test_the_root_rank_arrived_last_at_a_collective_of_the_path(
    analyzed: tuple[Analysis, fsobs.Run],
) -> None:
    """The root rank is the rank with the most time outside collectives on the path (checked
    here from the segments), and one whose late arrival the path followed."""
    analysis, _ = analyzed
    path = analysis.critical_path
    inst = analysis.collectives.instances.drop_duplicates("instance").set_index("instance")
    for step, root in path.steps[["step", "root_rank"]].itertuples(index=False):
        rows = path.segments[path.segments["step"] == step]
        outside = rows[rows["kind"] != "collective"]
        time = (outside["end_ns"] - outside["start_ns"]).groupby(outside["rank"]).sum()
        assert root == time[time == time.max()].index.min()
        followed = inst.loc[rows.loc[rows["kind"] == "collective", "instance"], "last_rank"]
        assert root in set(followed)
