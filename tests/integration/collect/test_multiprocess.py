"""Two gloo ranks (spawned processes) write a run that fsobs.load_run reads back whole."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

import fsobs  # noqa: E402
from fsobs.collect import ProfilerConfig, StepProfiler  # noqa: E402
from fsobs.runformat import RunMeta, SidecarWriter, StepRecord, write_run_json  # noqa: E402
from tests.support.dist import run_ranks  # noqa: E402

WORLD_SIZE = 2
CONFIG = ProfilerConfig(wait=1, warmup=1, active=2)


def _rank_main(rank: int, world_size: int, run_dir: str) -> None:
    try:  # the rank given must be the process's rank
        StepProfiler(run_dir, world_size - 1 - rank, CONFIG).__enter__()
    except ValueError as error:
        assert "torch.distributed says" in str(error)
    else:
        raise AssertionError("a wrong rank was accepted")
    with StepProfiler(run_dir, rank, CONFIG) as prof, SidecarWriter(run_dir, rank) as sidecar:
        for step in range(CONFIG.num_steps):
            start = time.time_ns()
            x = torch.full((256,), float(rank + 1))
            dist.all_reduce(x)
            lengths = [10 * (rank + 1)] * (step + 1)
            sidecar.write(StepRecord.of(step, lengths, float(x[0]), start, time.time_ns()))
            prof.step()


@pytest.mark.multiprocess
def test_two_gloo_ranks_write_a_loadable_run(tmp_path):
    run_dir = tmp_path / "run"
    run_ranks(_rank_main, WORLD_SIZE, str(run_dir))
    names = sorted(p.name for p in run_dir.iterdir())
    assert names == [
        "rank0.trace.json.gz",
        "rank1.trace.json.gz",
        "steps.rank0.jsonl",
        "steps.rank1.jsonl",
    ]
    for rank in range(WORLD_SIZE):
        info = _distributed_info(run_dir / f"rank{rank}.trace.json.gz")
        assert (info["rank"], info["world_size"], info["backend"]) == (rank, WORLD_SIZE, "gloo")
        assert info["pg_config"][0]["ranks"] == [0, 1]

    meta = RunMeta.now(
        name="gloo-2rank",
        world_size=WORLD_SIZE,
        backend="gloo",
        device="cpu",
        hosts=("localhost",),
        workload={"kind": "all_reduce"},
        ranks_present=(0, 1),
        status="complete",
    )
    write_run_json(run_dir, meta)
    run = fsobs.load_run(run_dir)
    assert run.world_size == WORLD_SIZE and run.rank_ids == [0, 1]
    assert run.warnings == []
    assert all(run.ranks[r].steps == [2, 3] for r in run.rank_ids)
    assert run.ranks[0].backend == "gloo"
    sidecar = run.sidecar
    assert len(sidecar) == WORLD_SIZE * CONFIG.num_steps
    assert sidecar.loc[sidecar["rank"] == 1, "len_sum"].tolist() == [20, 40, 60, 80]
    assert set(sidecar["est_cost"]) == {3.0}  # the all_reduce ran: 1 + 2


def _distributed_info(path: Path) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)["distributedInfo"]
