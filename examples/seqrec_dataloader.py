"""A SASRec-style sequential recommender on torchrec, trained by the loop most users have.

    torchrun --standalone --nproc-per-node=2 examples/seqrec_dataloader.py --out DIR \\
        --steps N --seed S [--balance [--balance-method kk|lpt|random]
        [--balance-counts equal|unequal] [--balance-window K]] [--priority-overlap]
    fsobs analyze DIR

The loop is the common shape: a map-style dataset of user histories, a per-rank
``DataLoader``, torchrec's ``EmbeddingCollection`` (row-wise sharded) at the model's input,
``TrainPipelineSparseDist``, and a per-token mean loss (next-item prediction at every position
of a history, against one sampled negative, BPR). The dense part is causal softmax attention
over each history on its own length (no padding), so a sample costs about ``a·L + b·L²``, and
the histories' lengths are heavy-tailed: a random split gives some ranks several times the
others' compute.

The lines marked ``# FreeScale`` are all that FreeScale takes; ``--plain`` runs the loop
without them (``DistributedSampler``, each rank's own token mean, torchrec's pipeline). With
FreeScale the sampler deals each global batch by cost (``--balance``) and the batch carries its
loss weight, so every step's averaged gradient is the global batch's token mean whatever the
split (with ``--balance-counts unequal`` the ranks' counts differ too; with ``--balance-window
K`` the sampler deals ``K`` global batches into ``K`` steps and each step's weight is for its
own samples and tokens); ``--priority-overlap`` is torchrec's PEC on the item table. The
lines marked ``# fsobs`` write the run (``fsobs.collect.RunRecorder``: a trace, a step
sidecar, ``run.json``) for ``fsobs analyze`` / ``compare``; ``--out`` is required.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler
from torchrec import EmbeddingCollection, EmbeddingConfig, JaggedTensor, KeyedJaggedTensor
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.streamable import Pipelineable

import optim  # FreeScale
from fsobs.collect import ProfilerConfig, RunRecorder  # fsobs: writes the run

NUM_ITEMS, DIM, HEADS, BLOCKS = 20_000, 32, 2, 2
FEATURES = ("history", "target", "negative")
COST = optim.CostModel(c0=1.0, a=0.002, b=1.8e-5)
"""ms of forward and backward for a history of ``L`` events on one core (measured here: the
per-sample launch overhead, then the attention's ``L²`` term from a few hundred events on)."""


class Histories:
    """``num_users`` histories of item ids (Zipf popularity), lognormal lengths; a sample is
    ``(items [L + 1], negatives [L])``: each event predicts the next (the last one the
    ``L + 1``-th item) against one uniform negative."""

    def __init__(self, num_users: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.seed = seed
        self.lengths = np.clip(rng.lognormal(math.log(40), 1.2, num_users), 2, 800).astype(int)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng((self.seed, int(index)))
        n = int(self.lengths[index])
        items = (rng.zipf(1.1, n + 1) - 1) % NUM_ITEMS
        return items, rng.integers(NUM_ITEMS, size=n)


@dataclass
class Batch(Pipelineable):  # type: ignore[misc]  # torchrec: untyped
    """One rank's batch: the three id features (jagged by history length), the lengths and the
    factor on the batch's sum of per-token losses."""

    features: KeyedJaggedTensor
    lengths: torch.Tensor
    ids: torch.Tensor
    """The histories' item ids (the ``history`` feature's values)."""
    weight: float

    def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
        return Batch(
            self.features.to(device, non_blocking=non_blocking),
            self.lengths.to(device, non_blocking=non_blocking),
            self.ids.to(device, non_blocking=non_blocking),
            self.weight,
        )

    def record_stream(self, stream: torch.Stream) -> None:
        self.features.record_stream(stream)
        self.lengths.record_stream(stream)
        self.ids.record_stream(stream)

    def pin_memory(self) -> Batch:
        pinned = (self.features.pin_memory(), self.lengths.pin_memory(), self.ids.pin_memory())
        return Batch(*pinned, self.weight)


def collate(samples: list[tuple[np.ndarray, np.ndarray]], share: Any = None) -> Batch:
    """The batch of ``samples``, weighted for a token-mean loss: this rank's own token mean (a
    plain loop), or with FreeScale's sampler the weight of the batch's ``share`` of the global
    batch, which makes the ranks' averaged gradient the global batch's token mean."""
    lengths = np.array([len(neg) for _, neg in samples], np.int64)
    values = [items[:-1] for items, _ in samples]
    values += [items[1:] for items, _ in samples] + [neg for _, neg in samples]
    features = KeyedJaggedTensor.from_lengths_sync(
        keys=list(FEATURES),
        values=torch.from_numpy(np.concatenate(values).astype(np.int64)),
        lengths=torch.from_numpy(np.tile(lengths, len(FEATURES))),
    )
    own = 1.0 / max(1, int(lengths.sum()))
    weight = own if share is None else share.loss_weight("token_mean")
    history = torch.from_numpy(np.concatenate(values[: len(samples)]).astype(np.int64))
    return Batch(features, torch.from_numpy(lengths), history, weight)


class Tower(nn.Module):
    """Causal softmax attention blocks over each history, BPR loss per event. A module of its
    own: torchrec's pipeline tracer keeps it as one leaf (its per-sample loop is not fx code)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(DIM, HEADS, 2 * DIM, dropout=0.0, batch_first=True)
            for _ in range(BLOCKS)
        )

    def forward(
        self, emb: dict[str, JaggedTensor], weight: float, ids: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(the weighted sum of the per-event losses, the step's numbers for the loop: the
        unweighted sum, the histories' lengths and item ids)."""
        lengths = emb["history"].lengths()
        sizes = lengths.tolist()
        h = torch.cat(
            [
                self._attend(x, n)
                for x, n in zip(emb["history"].values().split(sizes), sizes, strict=True)
            ]
        )
        pos = (h * emb["target"].values()).sum(-1)
        neg = (h * emb["negative"].values()).sum(-1)
        losses = F.softplus(neg - pos)  # per event
        loss = losses.sum() * weight
        return loss, {"loss_sum": losses.sum().detach(), "lengths": lengths, "ids": ids}

    def _attend(self, x: torch.Tensor, n: int) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(n)
        x = x[None]
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return x[0]


class SeqRec(nn.Module):
    """The item table at the input (an ``EmbeddingCollection``), the attention tower on top."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        table = EmbeddingConfig(
            name="t_items",
            embedding_dim=DIM,
            num_embeddings=NUM_ITEMS,
            feature_names=list(FEATURES),
        )
        self.ec = EmbeddingCollection(tables=[table], device=device)
        self.tower = Tower()

    def forward(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self.tower(self.ec(batch.features), batch.weight, batch.ids)


def build(
    model: nn.Module, sharders: list[Any], dmp_kwargs: dict[str, Any]
) -> tuple[DistributedModelParallel, CombinedOptimizer]:
    """Row-wise sharded item table with a fused row-wise Adagrad, Adagrad on the tower."""
    world = dist.get_world_size()
    planner = EmbeddingShardingPlanner(
        topology=TopologyFactory.create_topology(
            trainer_config=TrainerConfig(world_size=world, local_world_size=world),
            kernel_config=KernelConfig(compute_device="cpu"),
        ),
        constraints=CONSTRAINTS,
    )
    env = dmp_kwargs.get("env")
    plan = planner.collective_plan(model, sharders, env.process_group if env else None)
    dmp = DistributedModelParallel(
        model, device=torch.device("cpu"), plan=plan, sharders=sharders, **dmp_kwargs
    )
    fused = set(dmp.fused_optimizer.params)
    dense = {k: v for k, v in dmp.named_parameters() if k not in fused}
    tower = KeyedOptimizerWrapper(dense, lambda ps: torch.optim.Adagrad(ps, lr=0.05))
    return dmp, CombinedOptimizer([dmp.fused_optimizer, tower])


CONSTRAINTS = {"t_items": ParameterConstraints(sharding_types=["row_wise"])}


def ec_sharder() -> EmbeddingCollectionSharder:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.05}
    return EmbeddingCollectionSharder(fused_params=fused)


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    books = dist.new_group()  # the loop's own bookkeeping, apart from the training's groups
    torch.manual_seed(0)
    data = Histories(50_000, args.seed)
    model = SeqRec(torch.device("meta"))
    device = torch.device("cpu")
    batch, seed = args.batch_size, args.seed
    if args.plain:
        fs = None
        sampler = DistributedSampler(data, seed=seed, drop_last=True)
        loader = DataLoader(data, batch_size=batch, sampler=sampler, collate_fn=collate)
        dmp, optimizer = build(model, [ec_sharder()], {})
        pipeline = TrainPipelineSparseDist(dmp, optimizer, device)
    else:
        fs = optim.FreeScale(toggles(args), cost_model=COST)  # FreeScale
        fs.setup()  # FreeScale
        sampler = fs.sampler(data, data.lengths, batch_size=batch, seed=seed)  # FreeScale
        weighted = optim.ShareCollate(collate)  # FreeScale: the share's weight in the batch
        dataset = optim.ShareDataset(data)  # FreeScale: the share travels with its batch
        loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=weighted)  # FreeScale
        model = fs.prepare(model, CONSTRAINTS)  # FreeScale: PEC on the item table
        dmp, optimizer = build(model, fs.sharders([ec_sharder()]), fs.dmp_kwargs())  # FreeScale
        pipeline = fs.pipeline(dmp, optimizer, device)  # FreeScale
    recorder = RunRecorder(  # fsobs
        args.out, freescale=fs, cost_model=COST, profiler=ProfilerConfig.every_step(args.steps)
    )
    batches, losses = iter(loader), []
    for step in range(args.steps):
        with recorder.step(step) as record:  # fsobs
            out = pipeline.progress(batches)
            record.lengths = out["lengths"].numpy()  # fsobs
            record.ids = recorder.global_ids({"t_items": out["ids"]})  # fsobs: PEC's what-if
            record.loss = float(out["loss_sum"]) / max(1, int(out["lengths"].sum()))  # fsobs
        if fs is not None:
            fs.after_step(step)  # FreeScale
        losses.append(_global_mean(out, books))
    recorder.close()  # fsobs
    if fs is not None:
        fs.close()  # FreeScale
    if dist.get_rank() == 0 and args.losses_out:
        status = fs.status() if fs is not None else {}
        summary = {"losses": losses, "toggles": status}
        Path(args.losses_out).write_text(json.dumps(summary))
    # free the model (its DDP reducer holds the process groups) before the groups go
    del pipeline, dmp, optimizer
    gc.collect()
    dist.destroy_process_group()


def _global_mean(out: dict[str, torch.Tensor], group: dist.ProcessGroup) -> float:
    """The step's global token mean loss (every rank's losses over every rank's events)."""
    total = torch.stack([out["loss_sum"].double(), out["lengths"].sum().double()])
    dist.all_reduce(total, group=group)
    return float(total[0] / total[1])


def toggles(args: argparse.Namespace) -> optim.FreeScaleConfig:
    """FreeScale's toggles from the command line (the rest at their defaults)."""
    return optim.FreeScaleConfig(
        balance=optim.BalanceConfig(
            enabled=args.balance,
            method=args.balance_method,
            counts=args.balance_counts,
            window=args.balance_window,
        ),
        priority_overlap=optim.PriorityConfig(
            enabled=args.priority_overlap, dense_order=args.dense_order
        ),
    )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="write the run here (traces, sidecars, run.json)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank and step")
    p.add_argument("--balance", action="store_true")
    p.add_argument("--balance-method", default="kk", choices=optim.balance.METHODS)
    p.add_argument("--balance-counts", choices=optim.plan.COUNTS, help="default: the method's")
    p.add_argument("--balance-window", type=int, default=1, help="global batches planned together")
    p.add_argument("--priority-overlap", action="store_true")
    p.add_argument("--dense-order", default="auto", choices=optim.config.DENSE_ORDERS)
    p.add_argument("--plain", action="store_true", help="plain torchrec: no FreeScale")
    p.add_argument("--losses-out", help="rank 0 writes the global token-mean loss per step here")
    return p.parse_args()


if __name__ == "__main__":
    main()
