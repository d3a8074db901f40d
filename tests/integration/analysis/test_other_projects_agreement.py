"""Real multi-rank Kineto traces from projects other than HTA (``traces/other_projects``).

HTA 0.5.0, run live, gives the same temporal breakdown, comm/comp overlap and idle-time breakdown
as fsobs on every set. The collective matching and the bubble classes are checked against the
rule worked out here from the raw JSON, without fsobs: the k-th NCCL kernel of every rank is one
collective instance (each set's ranks launch the same kernels in the same order), it arrives on a
rank when its kernel starts, the wait of a rank is its kernel time before the last rank's
arrival and the exposed communication its kernel time after it, less what compute kernels cover
(docs/design.md §5).
"""

from __future__ import annotations

import functools
import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from fsobs.analysis import Analysis, analyze_path
from tests.support.hta_check import assert_equal_to_hta, hta_breakdown, hta_trace_analysis

OTHER = Path(__file__).resolve().parents[3] / "traces" / "other_projects"
SETS = {
    # folder: collectives per rank, by name, counted in the files: the 5
    # ncclKernel_SendRecv launch inside nccl:all_to_all (TorchRec's KJT and pooled-embedding
    # all-to-alls), the 3 ncclKernel_AllReduce inside nccl:all_reduce (DDP)
    "param_dlrm_8rank": {"all_to_all": 5, "all_reduce": 3},
    # 84 ncclDevKernel_AllReduce (81 f16, 3 f32), each inside nccl:all_reduce (tensor parallel)
    "astrasim_megatron_tp8_8rank": {"all_reduce": 84},
}
WORLD = list(range(8))
MS = 1e6


@dataclass(frozen=True)
class RawRank:
    """One rank as read here with plain ``json``: times in ns (these traces are in integer µs
    with no ``baseTimeNanoseconds``, so ns = µs x 1000)."""

    comm: list[tuple[int, int, str]]
    """The NCCL kernels (start, end, name), in start order."""
    compute: list[tuple[int, int]]
    """Every other kernel (start, end)."""


@functools.cache
def _raw(folder: str) -> dict[int, RawRank]:
    ranks: dict[int, RawRank] = {}
    for path in sorted((OTHER / folder).glob("*.json.gz")):
        with gzip.open(path) as f:
            doc = json.load(f)
        kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
        spans = [
            (round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000), e["name"]) for e in kernels
        ]
        comm = sorted(s for s in spans if s[2].startswith("nccl"))
        compute = [(s, e) for s, e, name in spans if not name.startswith("nccl")]
        ranks[doc["distributedInfo"]["rank"]] = RawRank(comm, compute)
    return ranks


@functools.cache
def _ours(folder: str) -> Analysis:
    return analyze_path(OTHER / folder)


def _uncovered(start: int, end: int, covered: list[tuple[int, int]]) -> int:
    """Length of ``[start, end)`` outside the union of ``covered``."""
    points = sorted((max(s, start), min(e, end)) for s, e in covered if s < end and e > start)
    inside, reach = 0, start
    for s, e in points:
        inside += max(0, e - max(s, reach))
        reach = max(reach, e)
    return end - start - inside


def _by_hand(folder: str) -> tuple[dict[int, int], dict[int, int], list[set[int]]]:
    """Per rank straggler_wait and exposed_comm in ns, and per instance its last ranks."""
    raw = _raw(folder)
    wait, exposed, last = dict.fromkeys(raw, 0), dict.fromkeys(raw, 0), []
    for k in range(len(raw[0].comm)):
        arrivals = {r: raw[r].comm[k][0] for r in raw}
        latest = max(arrivals.values())
        last.append({r for r, a in arrivals.items() if a == latest})
        for r, rank in raw.items():
            start, end, _ = rank.comm[k]
            cut = min(max(latest, start), end)
            wait[r] += _uncovered(start, cut, rank.compute)
            exposed[r] += _uncovered(cut, end, rank.compute)
    return wait, exposed, last


@pytest.fixture(scope="module")
def trace_analysis() -> Any:
    return hta_trace_analysis()


@functools.cache
def _hta_breakdown(folder: str, trace_analysis: Any) -> pd.DataFrame:
    return hta_breakdown(trace_analysis(trace_dir=str(OTHER / folder)))


def test_every_folder_is_covered() -> None:
    """Each set is one whole 8-rank job: ranks 0..7, each saying world_size 8."""
    folders = sorted({str(p.parent.relative_to(OTHER)) for p in OTHER.rglob("*.json.gz")})
    assert folders == sorted(SETS)
    for folder in SETS:
        infos = []
        for path in sorted((OTHER / folder).glob("*.json.gz")):
            with gzip.open(path) as f:
                infos.append(json.load(f)["distributedInfo"])
        assert sorted(i["rank"] for i in infos) == WORLD
        assert {i["world_size"] for i in infos} == {8}


@pytest.mark.slow
@pytest.mark.parametrize("folder", sorted(SETS))
def test_equal_to_hta(folder: str, trace_analysis: Any) -> None:
    ours = _ours(folder).hta
    assert_equal_to_hta(OTHER / folder, ours, trace_analysis)
    assert ours is not None
    assert sorted(set(ours.idle_time_breakdown["rank"])) == WORLD


@pytest.mark.parametrize("folder", sorted(SETS))
def test_every_rank_collective_matched(folder: str) -> None:
    """All of every rank's collectives pair up, instance k being every rank's k-th kernel."""
    raw = _raw(folder)
    names = [[name for _, _, name in raw[r].comm] for r in WORLD]
    assert all(n == names[0] for n in names)  # same kernels in the same order on every rank
    collectives = _ours(folder).collectives
    assert collectives.problems.empty and collectives.partial.empty
    assert set(collectives.offsets_ns.values()) == {0}  # one host, one clock

    instances = collectives.instances.sort_values(["instance", "rank"])
    assert len(instances) == len(WORLD) * sum(SETS[folder].values())
    per_instance = instances.groupby("instance", sort=True)
    assert per_instance["coll"].first().value_counts().to_dict() == SETS[folder]
    ordered = sorted(per_instance, key=lambda item: item[1]["start_ns"].min())
    _, _, last = _by_hand(folder)
    for k, (_, rows) in enumerate(ordered):
        assert rows["rank"].tolist() == WORLD
        assert rows["start_ns"].tolist() == [raw[r].comm[k][0] for r in WORLD]
        assert rows["end_ns"].tolist() == [raw[r].comm[k][1] for r in WORLD]
        assert rows["last_rank"].iloc[0] in last[k]


@pytest.mark.parametrize("folder", sorted(SETS))
def test_waits_follow_the_rule(folder: str) -> None:
    """straggler_wait and exposed_comm of every rank, to the ns, as worked out by hand; the waits
    charged to the ranks that caused them add up to the waits."""
    analysis = _ours(folder)
    steps = analysis.steps.set_index("rank")
    wait, exposed, _ = _by_hand(folder)
    assert steps.index.tolist() == WORLD  # one window per rank (one ProfilerStep in each file)
    for r in WORLD:
        assert steps.loc[r, "straggler_wait_ms"] == pytest.approx(wait[r] / MS, abs=1e-9)
        assert steps.loc[r, "exposed_comm_ms"] == pytest.approx(exposed[r] / MS, abs=1e-9)
    assert analysis.caused["wait_ns"].sum() == sum(wait.values())


@pytest.mark.parametrize("folder", sorted(SETS))
def test_classes_sum_to_the_window(folder: str) -> None:
    steps = _ours(folder).steps
    classes = ["straggler_wait", "exposed_comm", "unattributed_comm", "host_idle", "other"]
    bubble = steps[[f"{c}_ms" for c in classes]].sum(axis=1)
    np.testing.assert_allclose(bubble, steps["bubble_ms"], atol=1e-9)
    np.testing.assert_allclose(steps["busy_ms"] + bubble, steps["window_ms"], atol=1e-9)
    assert (steps["unattributed_comm_ms"] == 0).all()  # every rank of the group is present
    assert (steps["other_ms"] < 0.01 * steps["window_ms"]).all()  # "near zero" (docs/design.md §5)


@pytest.mark.slow
@pytest.mark.parametrize("folder", sorted(SETS))
def test_classes_equal_hta_breakdown(folder: str, trace_analysis: Any) -> None:
    """Where a rank's window holds all of its GPU work, it is HTA's kernel span: busy is HTA's
    compute, host_idle HTA's idle, and the communication classes with other its non-compute.
    Param's ranks 1 and 3 begin with 64 kernels (~0.2 ms) whose launch is not in the trace; the
    window starts at the first kernel the step launched and leaves 61 of them out, HTA counts
    them. The other 14 ranks of the two sets have no such kernel."""
    analysis = _ours(folder)
    windows = analysis.windows.set_index("rank")
    whole = windows.index[(windows["outside_events"] == 0) & (windows["unlaunched_events"] == 0)]
    expected_whole = [0, 2, 4, 5, 6, 7] if folder == "param_dlrm_8rank" else WORLD
    assert whole.tolist() == expected_whole
    steps = analysis.steps.set_index("rank").loc[whole]
    theirs = _hta_breakdown(folder, trace_analysis).set_index("rank").loc[whole]
    rest = steps[["straggler_wait_ms", "exposed_comm_ms", "unattributed_comm_ms", "other_ms"]]
    np.testing.assert_allclose(steps["window_ms"], theirs["kernel_time_us"] / 1000, atol=1e-9)
    np.testing.assert_allclose(steps["busy_ms"], theirs["compute_time_us"] / 1000, atol=1e-9)
    np.testing.assert_allclose(steps["host_idle_ms"], theirs["idle_time_us"] / 1000, atol=1e-9)
    np.testing.assert_allclose(rest.sum(axis=1), theirs["non_compute_time_us"] / 1000, atol=1e-9)
