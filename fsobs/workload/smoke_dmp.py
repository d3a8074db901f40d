"""Smoke run: train ``SeqRecModel`` for a few steps under torchrec DMP, one process per rank.

    .venv/bin/python -m torch.distributed.run --standalone --nproc_per_node=2 \\
        -m fsobs.workload.smoke_dmp --model small --steps 3

Every rank builds the same dataset and global batches, takes its random-split share, and
trains with ``TrainPipelineSparseDist`` (or a plain loop). Each rank prints its step times and
the total history length it got per step; the times are indicative only on shared CPU cores.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

from fsobs.workload.batch import Batch
from fsobs.workload.config import ModelConfig, data_config_for
from fsobs.workload.data import SyntheticHistories, global_batches, random_split
from fsobs.workload.lengths import PRESETS
from fsobs.workload.model import SeqRecModel
from fsobs.workload.sharding import build_optimizer, wrap_model


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["tiny", "small", "medium"], default="tiny")
    p.add_argument("--lengths", choices=list(PRESETS), default="lognormal")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--num-samples", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pipeline", choices=["sparse_dist", "none"], default="sparse_dist")
    return p.parse_args()


def rank_batches(args: argparse.Namespace, ds: SyntheticHistories) -> list[Batch]:
    """This rank's random-split share of each step's global batch."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    steps = global_batches(len(ds), args.batch_size * world_size, args.steps, args.seed)
    return [ds.batch(random_split(g, world_size, rank)) for g in steps]


def run_steps(
    dmp: DistributedModelParallel,
    optimizer: torch.optim.Optimizer,
    batches: list[Batch],
    pipeline: str,
) -> tuple[list[float], list[float]]:
    """Train on ``batches``: the wall time (ms) and the loss of each step."""
    times: list[float] = []
    logits: list[torch.Tensor] = []
    if pipeline == "sparse_dist":
        pipe = TrainPipelineSparseDist(dmp, optimizer, torch.device("cpu"))
        it: Iterator[Batch] = iter(batches)
        while len(times) < len(batches):
            start = time.perf_counter()
            logits.append(pipe.progress(it))  # fwd/bwd/step of batch i, input dist of i + 1
            times.append((time.perf_counter() - start) * 1e3)
    else:
        for batch in batches:
            start = time.perf_counter()
            loss, out = dmp(batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            logits.append(out)
            times.append((time.perf_counter() - start) * 1e3)
    losses = [
        F.binary_cross_entropy_with_logits(out, batch.labels).item()
        for out, batch in zip(logits, batches, strict=True)
    ]
    return times, losses


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    model_cfg = ModelConfig.preset(args.model)
    ds = SyntheticHistories(
        data_config_for(
            model_cfg, preset=args.lengths, num_samples=args.num_samples, seed=args.seed
        )
    )
    batches = rank_batches(args, ds)
    dmp = wrap_model(
        SeqRecModel(model_cfg, device="meta"), dist.GroupMember.WORLD, torch.device("cpu")
    )
    optimizer = build_optimizer(dmp)
    times, losses = run_steps(dmp, optimizer, batches, args.pipeline)
    sum_len = [int(b.lengths.sum()) for b in batches]
    print(
        f"rank {rank} model={args.model} lengths={args.lengths} B={args.batch_size} "
        f"pipeline={args.pipeline}: step ms {[round(t, 1) for t in times]} "
        f"sum L {sum_len} loss {[round(v, 4) for v in losses]}",
        flush=True,
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
