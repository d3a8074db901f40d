"""A small DLRM-style model on torchrec, trained by a plain loop that embeds FreeScale.

    torchrun --standalone --nproc-per-node=2 examples/dlrm_freescale.py --steps 20
    torchrun --standalone --nproc-per-node=2 examples/dlrm_freescale.py --balance \\
        --priority-overlap --sm-free --sync-gc --run-dir out/dlrm && fsobs analyze out/dlrm
    torchrun --standalone --nproc-per-node=2 examples/dlrm_freescale.py --balance \\
        --balance-counts unequal --balance-window 2        # unequal counts, windows of 2 steps

The model is torchrec's own ``EmbeddingBagCollection`` over a ``KeyedJaggedTensor`` (a
variable-length ``history`` of item ids and one ``category`` id per sample, sum-pooled), a
bottom MLP over dense features, and a top MLP over both: nothing from fsobs. Every rank sees
the same global batch of sample ids each step; which of them a rank trains is the only data
question, and FreeScale answers it. With ``--balance-window K`` it answers it ``K`` global
batches at a time (``fs.split_window``: their samples dealt into those ``K`` steps, positions
into the window's batches); each rank's loss scale then makes each step's gradient the mean
over that step's own samples.

The lines marked ``# FreeScale`` are all that switching FreeScale on takes (``--plain`` runs
the same loop without them: plain torchrec, each rank its contiguous share). With every toggle
off the losses equal ``--plain``'s bit for bit (``tests/integration/optim/test_example.py``).

``--run-dir`` writes what ``fsobs analyze`` and ``fsobs whatif`` read, through
``fsobs.collect.RunRecorder`` (the lines marked ``# recorder``): a Kineto trace per rank of
every step after the first, a step sidecar per rank (each step's lengths, estimated cost, loss,
wall-clock bounds, GC pauses and CPU time) and ``run.json`` with the toggles' status.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper

from fsobs.collect import ProfilerConfig, RunRecorder, StepState  # recorder
from optim import (  # FreeScale
    BalanceConfig,
    CostModel,
    FreeScale,
    FreeScaleConfig,
    PriorityConfig,
    SMFreeConfig,
    SyncGCConfig,
)
from optim.balance import METHODS  # FreeScale
from optim.config import DENSE_ORDERS  # FreeScale
from optim.plan import COUNTS  # FreeScale

NUM_ITEMS, NUM_CATEGORIES, EMB_DIM, DENSE_IN = 5000, 50, 16, 8


class DLRM(nn.Module):
    """Bottom MLP on dense features + pooled embeddings -> top MLP -> one logit."""

    def __init__(self, device: torch.device, top_width: int) -> None:
        super().__init__()
        tables = [("t_history", "history", NUM_ITEMS), ("t_category", "category", NUM_CATEGORIES)]
        self.ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(
                    name=t, embedding_dim=EMB_DIM, num_embeddings=n, feature_names=[f]
                )
                for t, f, n in tables
            ],
            device=device,
        )
        self.bottom = nn.Sequential(nn.Linear(DENSE_IN, EMB_DIM), nn.ReLU())
        width = 3 * EMB_DIM
        self.top = nn.Sequential(nn.Linear(width, top_width), nn.ReLU(), nn.Linear(top_width, 1))

    def forward(
        self, dense: torch.Tensor, sparse: KeyedJaggedTensor, freeze: bool = False
    ) -> torch.Tensor:
        pooled = self.ebc(sparse).values()
        if freeze:  # no gradient reaches the tables: no backward embedding all-to-all
            pooled = pooled.detach()
        return self.top(torch.cat([self.bottom(dense), pooled], dim=1)).squeeze(1)


def dataset(num_samples: int, seed: int) -> dict[str, np.ndarray]:
    """Heavy-tailed history lengths; the label follows the category, the dense features noise."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(3.0, 1.0, num_samples).astype(np.int64), 1, 2000)
    return {
        "lengths": lengths,
        "category": rng.integers(NUM_CATEGORIES, size=num_samples),
        "dense": rng.standard_normal((num_samples, DENSE_IN)).astype(np.float32),
        "seed": np.array([seed]),
    }


def make_batch(data: dict[str, np.ndarray], ids: np.ndarray) -> tuple[torch.Tensor, ...]:
    """(dense, sparse KJT, labels) of the samples ``ids``; item ids are drawn per sample."""
    lengths = data["lengths"][ids]
    items = np.concatenate(
        [
            np.random.default_rng((int(data["seed"][0]), int(i))).integers(NUM_ITEMS, size=n)
            for i, n in zip(ids, lengths, strict=True)
        ]
    )
    sparse = KeyedJaggedTensor.from_lengths_sync(
        keys=["history", "category"],
        values=torch.from_numpy(np.concatenate([items, data["category"][ids]])),
        lengths=torch.from_numpy(np.concatenate([lengths, np.ones(len(ids), np.int64)])),
    )
    labels = torch.from_numpy((data["category"][ids] % 2).astype(np.float32))
    return torch.from_numpy(data["dense"][ids]), sparse, labels


def build(model: DLRM, dmp_kwargs: dict) -> tuple[DistributedModelParallel, CombinedOptimizer]:
    """Table-wise sharded tables with a fused SGD, SGD on the dense part."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    sharders = [
        EmbeddingBagCollectionSharder(
            fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}
        )
    ]
    world = dist.get_world_size()
    planner = EmbeddingShardingPlanner(
        topology=TopologyFactory.create_topology(
            trainer_config=TrainerConfig(world_size=world, local_world_size=world),
            kernel_config=KernelConfig(compute_device="cpu"),
        ),
        constraints={
            t: ParameterConstraints(sharding_types=["table_wise"])
            for t in ("t_history", "t_category")
        },
    )
    env = dmp_kwargs.get("env")
    plan = planner.collective_plan(model, sharders, env.process_group if env else None)
    dmp = DistributedModelParallel(
        model, device=torch.device("cpu"), plan=plan, sharders=sharders, **dmp_kwargs
    )
    fused = set(dmp.fused_optimizer.params)
    dense = {k: v for k, v in dmp.named_parameters() if k not in fused}
    optimizer = CombinedOptimizer(
        [
            dmp.fused_optimizer,
            KeyedOptimizerWrapper(dense, lambda ps: torch.optim.SGD(ps, lr=0.1)),
        ]
    )
    return dmp, optimizer


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data = dataset(100_000, seed=0)
    cost_model = CostModel(c0=20.0, a=1.0, b=0.0)
    fs = FreeScale(toggles(args), cost_model=cost_model)  # FreeScale
    fs.setup()  # FreeScale
    model = DLRM(torch.device("meta"), args.top_width)
    if not args.plain:  # FreeScale
        model = fs.prepare(model)  # FreeScale: PEC where it can (this model's EBC: it cannot)
    dmp, optimizer = build(model, {} if args.plain else fs.dmp_kwargs())  # FreeScale
    if not args.plain:  # FreeScale
        fs.attach(dmp)  # FreeScale
    rec = None
    if args.run_dir:  # recorder: every step after the first is traced
        rec = RunRecorder(
            args.run_dir,
            freescale=None if args.plain else fs,
            cost_model=cost_model,
            profiler=ProfilerConfig.every_step(args.steps, wait=0),
            workload={"steps": args.steps, "batch_size": args.batch_size, "seed": 0},
        )
    losses = []
    size = args.batch_size * world
    order = np.random.default_rng(1).permutation(len(data["lengths"]))
    batches = order[: len(order) // size * size].reshape(-1, size)  # the global batches
    window = fs.window  # FreeScale: global batches planned together (1 without a window)
    for step in range(args.steps):
        with rec.step(step) if rec else contextlib.nullcontext(StepState(step)) as s:  # recorder
            if args.plain:
                ids = batches[step]
                mine, scale = ids[rank * args.batch_size : (rank + 1) * args.batch_size], 1.0
            else:
                if step % window == 0:  # FreeScale: plan the window that starts here
                    pool = batches[step : min(step + window, args.steps)]  # FreeScale
                    shares = fs.split_window(step, [data["lengths"][b] for b in pool])  # FreeScale
                share, ids = shares[step % window], pool.reshape(-1)  # FreeScale
                mine, scale = ids[share.positions], share.loss_scale  # FreeScale
            dense, sparse, labels = make_batch(data, mine)
            logits = dmp(dense, sparse, freeze=step == args.freeze_embeddings_at)
            loss = nn.functional.binary_cross_entropy_with_logits(logits, labels)
            optimizer.zero_grad()
            (loss * scale).backward()
            optimizer.step()
            fs.after_step(step)  # FreeScale
            total = torch.tensor([float(loss) * len(mine), len(mine)], dtype=torch.float64)
            dist.all_reduce(total)  # the step's loss sum and samples over the ranks
            losses.append(float(total[0]) / float(total[1]))
            s.lengths, s.loss = data["lengths"][mine], loss.item()  # recorder
    if rec is not None:
        rec.close()  # recorder: collective; rank 0 writes run.json
    if rank == 0 and args.losses_out:
        status = {} if args.plain else fs.status()  # FreeScale
        Path(args.losses_out).write_text(json.dumps({"losses": losses, "toggles": status}))
    fs.close()  # FreeScale
    # Free the model first: its DDP reducer holds the process groups, and gloo's worker threads
    # live as long as they do. Left to the interpreter's exit, a thread that drops a tensor then
    # may find the interpreter finalizing, and the process aborts (SIGABRT, "terminate called
    # without an active exception"): rare, but seen in this project's test suite.
    del dmp, optimizer
    gc.collect()
    dist.destroy_process_group()


def toggles(args: argparse.Namespace) -> FreeScaleConfig:
    """The toggles from the command line."""
    return FreeScaleConfig(
        balance=BalanceConfig(
            enabled=args.balance,
            method=args.balance_method,
            counts=args.balance_counts,
            window=args.balance_window,
        ),
        priority_overlap=PriorityConfig(
            enabled=args.priority_overlap, dense_order=args.dense_order
        ),
        sm_free=SMFreeConfig(enabled=args.sm_free),
        sync_gc=SyncGCConfig(enabled=args.sync_gc),
    )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank and step")
    p.add_argument("--top-width", type=int, default=64)
    p.add_argument("--balance", action="store_true")
    p.add_argument("--balance-method", default="kk", choices=METHODS)
    p.add_argument("--balance-counts", choices=COUNTS, help="default: the method's own")
    p.add_argument("--balance-window", type=int, default=1, help="global batches planned together")
    p.add_argument("--priority-overlap", action="store_true")
    p.add_argument("--dense-order", default="auto", choices=DENSE_ORDERS)
    p.add_argument("--sm-free", action="store_true")
    p.add_argument("--sync-gc", action="store_true")
    p.add_argument("--plain", action="store_true", help="plain torchrec: FreeScale not attached")
    p.add_argument("--freeze-embeddings-at", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--losses-out", help="rank 0 writes the global mean loss per step here")
    p.add_argument("--run-dir", help="write the run here (traces, step sidecars, run.json)")
    return p.parse_args()


if __name__ == "__main__":
    main()
