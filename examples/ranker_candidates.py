"""An HSTU-style ranker on torchrec, trained by a loop that calls the model itself.

    torchrun --standalone --nproc-per-node=2 examples/ranker_candidates.py --out DIR \\
        --steps N --seed S [--balance [--balance-method kk|lpt|random]
        [--balance-counts equal|unequal]] [--priority-overlap] [--sync-gc] [--sgd]
    fsobs analyze DIR

The loop is the shape of generative rankers (HSTU's, BERT4Rec's): no train pipeline, the item
table's optimizer applied in backward (torchrec's ``apply_optimizer_in_backward`` before DMP),
a batch class whose ``.to(device)`` moves every attribute, and a loss over a variable number of
loss terms per sample. Each user's history (heavy-tailed lengths) is embedded by a row-wise
sharded ``EmbeddingCollection`` and encoded by causal attention padded to the longest history
of the rank's batch, so a rank's cost grows with ``B·max(L)²`` plus per-event work; each user
then comes with 1 to 8 candidate items (fixed per sample index), each scored against the
user's encoding, and the loss is the mean binary cross-entropy over the batch's candidates.

The lines marked ``# FreeScale`` are all that FreeScale takes; ``--plain`` runs the loop
without them (``DistributedSampler``, each rank's own mean over its candidates, which weighs
the ranks' candidates unequally when their counts differ; ``--plain --global-mean`` makes it
the global batch's mean by an all-reduce of the candidate counts every step: the reference of
``tests/integration/optim/test_ranker_example.py``). With FreeScale the loader deals each global
batch by
cost (``--balance``) and each batch carries its share of the global batch, whose
``loss_weight("token_mean")`` over the loss terms given to ``fs.loader`` (``loss_counts``: the
candidates, while the histories' lengths drive the cost) makes every step's averaged gradient
the global batch's mean over candidates, whatever the split. ``--priority-overlap`` orders the
dense all-reduce behind the embedding all-to-all; PEC takes the item table (``fs.prepare``) but
acts only under torchrec's pipeline, which this loop has not: the table trains as a plain one
and the toggle's status says so. The lines marked ``# fsobs`` write the run
(``fsobs.collect.RunRecorder``: a trace, a step sidecar, ``run.json``) for ``fsobs analyze``;
``--out`` is required.
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
from torchrec.distributed.embedding import EmbeddingCollectionSharder as ECSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

import optim  # FreeScale
from fsobs.collect import ProfilerConfig, RunRecorder  # fsobs: writes the run

NUM_ITEMS, DIM, HEADS, BLOCKS, MAX_CANDIDATES = 20_000, 32, 2, 2, 8
FEATURES = ("history", "candidates")
COST = optim.CostModel(c0=0.1, a=0.002, b=3.3e-5)
"""ms of the dense forward and backward of one user in a batch of 16 histories all of ``L``
events, on one core (timed here, roughly: 0.13 ms at 8 events, 0.9 at 128, 10 at 512). Padding
makes a rank's real cost that of ``B`` histories as long as its longest, which the sum of its
samples' costs only approximates."""
CONSTRAINTS = {"t_items": ParameterConstraints(sharding_types=["row_wise"])}


class Users:
    """``num_users`` histories of item ids (Zipf popularity), lognormal lengths, and 1 to
    ``MAX_CANDIDATES`` candidates per user: a sample is ``(history [L], candidates [k],
    labels [k])``, a candidate's label 1 for an item of the user's next events, 0 for a
    uniform draw."""

    def __init__(self, num_users: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.seed = seed
        self.lengths = np.clip(rng.lognormal(math.log(40), 1.2, num_users), 2, 600).astype(int)
        self.counts = rng.integers(1, MAX_CANDIDATES + 1, num_users)
        """Candidates per user: the loss terms of each sample."""

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rng = np.random.default_rng((self.seed, int(index)))
        n, k = int(self.lengths[index]), int(self.counts[index])
        items = (rng.zipf(1.1, n + k) - 1) % NUM_ITEMS
        labels = rng.integers(2, size=k)
        candidates = np.where(labels == 1, items[n:], rng.integers(NUM_ITEMS, size=k))
        return items[:n], candidates, labels


@dataclass
class Batch:
    """One rank's batch: the history and candidate ids (jagged), per user its history length
    and candidate count, per candidate its label, and the batch's share of the global batch
    (FreeScale's loader; None in the plain loop)."""

    features: KeyedJaggedTensor
    lengths: torch.Tensor
    counts: torch.Tensor
    labels: torch.Tensor
    share: Any = None  # FreeScale: its optim.BatchShare (fs.loader); None in the plain loop

    def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
        """The batch with every attribute that can move on ``device``."""
        moved = {
            k: v.to(device, non_blocking=non_blocking) if hasattr(v, "to") else v
            for k, v in vars(self).items()
        }
        return type(self)(**moved)

    @property
    def weight(self) -> float:
        """The factor on the batch's sum of per-candidate losses: this rank's own mean over its
        candidates, or with a share the weight that makes the ranks' averaged gradient the
        global batch's mean over candidates."""
        if self.share is None:
            return 1.0 / max(1, int(self.counts.sum()))
        return float(self.share.loss_weight("token_mean"))  # FreeScale


def collate(samples: list[tuple[np.ndarray, ...]], share: Any = None) -> Batch:  # FreeScale
    """The batch of ``samples`` (with FreeScale's loader, ``share`` is their ``BatchShare``)."""
    histories, candidates, labels = zip(*samples, strict=True)
    lengths = torch.tensor([len(h) for h in histories])
    counts = torch.tensor([len(c) for c in candidates])
    features = KeyedJaggedTensor.from_lengths_sync(
        keys=list(FEATURES),
        values=torch.from_numpy(np.concatenate(histories + candidates).astype(np.int64)),
        lengths=torch.cat([lengths, counts]),
    )
    targets = torch.from_numpy(np.concatenate(labels).astype(np.float32))
    return Batch(features, lengths, counts, targets, share)  # FreeScale


class Tower(nn.Module):
    """Causal attention over each history padded to the batch's longest, and an MLP scoring
    each candidate against its user's encoding. A module of its own: torchrec's tracer keeps it
    as one leaf (its padding is not fx code), so PEC can take the table in front of it."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(DIM, HEADS, 2 * DIM, dropout=0.0, batch_first=True)
            for _ in range(BLOCKS)
        )
        self.score = nn.Sequential(nn.Linear(3 * DIM, 2 * DIM), nn.ReLU(), nn.Linear(2 * DIM, 1))

    def forward(
        self, emb: dict[str, JaggedTensor], counts: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        """The binary cross-entropy of every candidate (unreduced)."""
        users = self._encode(emb["history"])
        items = emb["candidates"].values()
        mine = users.repeat_interleave(counts, dim=0)
        logits = self.score(torch.cat([mine, items, mine * items], dim=-1)).squeeze(-1)
        return F.binary_cross_entropy_with_logits(logits, labels, reduction="none")

    def _encode(self, history: JaggedTensor) -> torch.Tensor:
        """Each user's encoding: the attention output at the last event of the history."""
        lengths = history.lengths()
        x = nn.utils.rnn.pad_sequence(list(history.values().split(lengths.tolist())), True)
        longest = x.shape[1]
        causal = torch.ones(longest, longest, dtype=torch.bool).triu(1)
        padding = torch.arange(longest)[None] >= lengths[:, None]
        for block in self.blocks:
            x = block(x, src_mask=causal, src_key_padding_mask=padding)
        return x[torch.arange(len(lengths)), lengths - 1]


class Ranker(nn.Module):
    """The item table (an ``EmbeddingCollection``) at the input, the tower on top."""

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

    def forward(self, batch: Batch) -> torch.Tensor:
        """The binary cross-entropy of every candidate of the batch (unreduced)."""
        return self.tower(self.ec(batch.features), batch.counts, batch.labels)


def build(
    model: Ranker, sharders: list[Any], dmp_kwargs: dict[str, Any], sgd: bool
) -> tuple[DistributedModelParallel, torch.optim.Optimizer]:
    """The item table's optimizer applied in backward (row-wise Adagrad, or SGD), the table
    row-wise sharded; Adam (or SGD) on the dense part."""
    table_optimizer = torch.optim.SGD if sgd else RowWiseAdagrad
    apply_optimizer_in_backward(table_optimizer, model.ec.parameters(), {"lr": 0.05})
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
    dense = [p for k, p in dmp.named_parameters() if k not in fused]
    optimizer = torch.optim.SGD(dense, lr=0.05) if sgd else torch.optim.Adam(dense, lr=1e-3)
    return dmp, optimizer


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    books = dist.new_group()  # the loop's own bookkeeping, apart from the training's groups
    torch.manual_seed(0)
    data = Users(50_000, args.seed)
    # the loss terms of each sample: its candidates (--weigh-by-events: its history's events,
    # the wrong count that the tests show failing)
    terms = data.lengths if args.weigh_by_events else data.counts
    model = Ranker(torch.device("meta"))
    device, batch, seed, sgd = torch.device("cpu"), args.batch_size, args.seed, args.sgd
    cost = COST if args.cost_model is None else optim.CostModel.from_json(args.cost_model)
    if args.plain:
        fs = None
        sampler = DistributedSampler(data, seed=seed, drop_last=True)
        loader = DataLoader(data, batch_size=batch, sampler=sampler, collate_fn=collate)
        dmp, optimizer = build(model, [ECSharder()], {}, sgd)
    else:
        fs = optim.FreeScale(toggles(args), cost_model=cost)  # FreeScale
        fs.setup()  # FreeScale
        loader = fs.loader(  # FreeScale: balanced shares, each batch with its BatchShare
            data, data.lengths, batch_size=batch, collate_fn=collate, loss_counts=terms, seed=seed
        )  # FreeScale
        model = fs.prepare(model, CONSTRAINTS)  # FreeScale: PEC's tables (no pipeline: plain)
        dmp, optimizer = build(model, fs.sharders([ECSharder()]), fs.dmp_kwargs(), sgd)  # FreeScale
        fs.attach(dmp)  # FreeScale: no pipeline, the DMP itself
    recorder = RunRecorder(  # fsobs
        args.out, freescale=fs, cost_model=cost, profiler=ProfilerConfig.every_step(args.steps)
    )
    initial = _parameters(dmp, books) if args.params_out else None
    batches, losses = iter(loader), []
    for step in range(args.steps):
        with recorder.step(step) as record:  # fsobs
            mine = next(batches).to(device)
            weight = _global_weight(mine, books) if args.global_mean else mine.weight
            per_candidate = dmp(mine)
            (per_candidate.sum() * weight).backward()  # the table's optimizer steps in here
            optimizer.step()
            optimizer.zero_grad()
            record.lengths = mine.lengths.numpy()  # fsobs
            ids = {"t_items": mine.features["history"].values()}  # fsobs: for PEC's what-if
            record.ids = recorder.global_ids(ids)  # fsobs: the global batch's, every rank's
            record.loss = float(per_candidate.detach().mean())  # fsobs
        if fs is not None:
            fs.after_step(step)  # FreeScale
        losses.append(_global_mean(per_candidate.detach(), books))
    recorder.close()  # fsobs
    if fs is not None:
        fs.close()  # FreeScale
    final = _parameters(dmp, books) if args.params_out else None
    if dist.get_rank() == 0 and args.losses_out:
        status = fs.status() if fs is not None else {}
        Path(args.losses_out).write_text(json.dumps({"losses": losses, "toggles": status}))
    if dist.get_rank() == 0 and args.params_out:
        torch.save({"initial": initial, "final": final}, args.params_out)
    # free the model (its DDP reducer holds the process groups) before the groups go
    del loader, batches, dmp, optimizer
    gc.collect()
    dist.destroy_process_group()


def _global_weight(batch: Batch, group: dist.ProcessGroup) -> float:
    """The plain loop's exact weight: world size over the global batch's candidates (one
    all-reduce), the factor that makes the averaged gradient their mean."""
    total = batch.counts.sum().reshape(1)
    dist.all_reduce(total, group=group)
    return dist.get_world_size() / int(total)


def _global_mean(losses: torch.Tensor, group: dist.ProcessGroup) -> float:
    """The step's mean loss over every rank's candidates."""
    total = torch.stack([losses.double().sum(), torch.tensor(float(losses.numel()))])
    dist.all_reduce(total, group=group)
    return float(total[0] / total[1])


def _parameters(dmp: DistributedModelParallel, group: dist.ProcessGroup) -> dict[str, Any]:
    """Every parameter, whole (the table's row shards gathered over the ranks; collective)."""
    out: dict[str, Any] = {}
    for key, value in dmp.state_dict().items():
        if not hasattr(value, "local_shards"):
            out[key] = value.detach().clone()
            continue
        mine = [(s.metadata.shard_offsets[0], s.tensor.detach()) for s in value.local_shards()]
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine, group=group)
        shards = sorted((o, t) for rank in everyone for o, t in rank)
        out[key] = torch.cat([t for _, t in shards])
    return out


def toggles(args: argparse.Namespace) -> optim.FreeScaleConfig:
    """FreeScale's toggles from the command line (the rest at their defaults)."""
    return optim.FreeScaleConfig(
        balance=optim.BalanceConfig(
            enabled=args.balance, method=args.balance_method, counts=args.balance_counts
        ),
        priority_overlap=optim.PriorityConfig(
            enabled=args.priority_overlap, dense_order=args.dense_order
        ),
        sync_gc=optim.SyncGCConfig(enabled=args.sync_gc),
    )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="write the run here (traces, sidecars, run.json)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=16, help="users per rank and step")
    p.add_argument("--balance", action="store_true")
    p.add_argument("--balance-method", default="kk", choices=optim.balance.METHODS)
    p.add_argument("--balance-counts", choices=optim.plan.COUNTS, help="default: the method's")
    p.add_argument("--priority-overlap", action="store_true")
    p.add_argument("--dense-order", default="auto", choices=optim.config.DENSE_ORDERS)
    p.add_argument("--sync-gc", action="store_true")
    p.add_argument("--sgd", action="store_true", help="SGD on the table and the dense part")
    p.add_argument("--cost-model", help="a cost_model.json (fsobs fit-cost) instead of COST")
    p.add_argument("--plain", action="store_true", help="plain torchrec: no FreeScale")
    p.add_argument(
        "--global-mean", action="store_true", help="plain: all-reduce the candidate counts"
    )
    p.add_argument("--losses-out", help="rank 0 writes the global candidate-mean loss per step")
    p.add_argument("--params-out", help="rank 0 saves every parameter before and after training")
    p.add_argument("--weigh-by-events", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.global_mean and not args.plain:
        p.error("--global-mean: a flag of the plain loop (--plain)")
    return args


if __name__ == "__main__":
    main()
