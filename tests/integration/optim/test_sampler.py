"""optim.sampler: the balance toggle as a batch sampler whose batches carry their share.

The expected global batches are derived here from DistributedSampler's rule (the dataset's
indices in ``torch.randperm`` order seeded with ``seed + epoch``, cut into runs of
``batch_size · world_size``) and checked against torch's own DistributedSampler; the expected
shares are contiguous chunks with the toggle off, and StepPlan.make's parts with it on.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optim.balance import CostModel
from optim.plan import BalanceConfig, StepPlan
from optim.sampler import BalancedBatchSampler, BatchShare, ShareCollate, ShareDataset, ShareList
from tests.support.procs import json_from_fresh_processes

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

import torch.distributed as dist  # noqa: E402
from fbgemm_gpu.split_embedding_configs import EmbOptimType  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler  # noqa: E402
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: E402
from torchrec.distributed.model_parallel import DistributedModelParallel  # noqa: E402
from torchrec.distributed.sharding_plan import (  # noqa: E402
    construct_module_sharding_plan,
    table_wise,
)
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist  # noqa: E402
from torchrec.distributed.types import ShardingEnv, ShardingPlan  # noqa: E402
from torchrec.modules.embedding_configs import EmbeddingBagConfig  # noqa: E402
from torchrec.modules.embedding_modules import EmbeddingBagCollection  # noqa: E402
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper  # noqa: E402
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # noqa: E402
from torchrec.streamable import Pipelineable  # noqa: E402

from optim.config import FreeScaleConfig  # noqa: E402
from optim.freescale import FreeScale  # noqa: E402
from tests.support.dist import run_ranks  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
COST = CostModel(c0=1.0, a=0.5, b=0.25)
CONFIGS = {
    "off": BalanceConfig(),
    "kk": BalanceConfig(enabled=True),
    "lpt": BalanceConfig(enabled=True, method="lpt"),
    "random": BalanceConfig(enabled=True, method="random"),
}


def _lengths(n: int, seed: int = 0) -> np.ndarray:
    """Heavy-tailed lengths: most short, a few long."""
    rng = np.random.default_rng(seed)
    return np.minimum(rng.pareto(1.2, n) * 4, 200).astype(np.int64)


def _samplers(n: int, lengths: Any, world: int, **kw: Any) -> list[BalancedBatchSampler]:
    kw = {"batch_size": 4, "config": CONFIGS["kk"], "costs": COST} | kw
    return [
        BalancedBatchSampler(range(n), lengths, world_size=world, rank=r, **kw)
        for r in range(world)
    ]


def _epoch(samplers: list[BalancedBatchSampler], epoch: int = 0) -> list[list[ShareList[int]]]:
    """Each rank's batches of ``epoch``."""
    for s in samplers:
        s.set_epoch(epoch)
    return [list(s) for s in samplers]


def _order(n: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """DistributedSampler's order of the epoch (before its padding or cut)."""
    if not shuffle:
        return list(range(n))
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


def _expected_batches(n: int, size: int, order: list[int], drop_last: bool) -> list[list[int]]:
    end = n - n % size if drop_last else n
    return [order[k : k + size] for k in range(0, end, size)]


def _chunk(batch: list[int], world: int, rank: int) -> list[int]:
    """Rank ``rank``'s contiguous chunk: the first ``len % world`` chunks one sample longer."""
    q, rem = divmod(len(batch), world)
    start = rank * q + min(rank, rem)
    return batch[start : start + q + (rank < rem)]


# ------------------------------------------------------------------ properties of an epoch


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 70),
    batch_size=st.integers(1, 6),
    world=st.integers(1, 4),
    method=st.sampled_from(list(CONFIGS)),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**20),
    epoch=st.integers(0, 5),
    drop_last=st.booleans(),
)
def test_an_epoch_is_the_global_batches_split_by_the_plan(
    n, batch_size, world, method, shuffle, seed, epoch, drop_last
):
    lengths = _lengths(n, seed)
    config = CONFIGS[method]
    samplers = _samplers(
        n,
        lengths,
        world,
        batch_size=batch_size,
        config=config,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
    )
    got = _epoch(samplers, epoch)
    size = batch_size * world
    order = _order(n, seed, epoch, shuffle)
    expected = _expected_batches(n, size, order, drop_last)
    full, rest = divmod(n, size)
    assert len(samplers[0]) == len(expected) == full + (rest > 0 and not drop_last)
    assert [len(b) for b in got] == [len(expected)] * world  # every rank, every step
    served = [i for rank in got for batch in rank for i in batch]
    assert len(served) == len(set(served))  # none twice
    kept = n - rest if drop_last else n
    assert sorted(served) == sorted(order[:kept])  # every sample once (drop_last: the tail cut)
    for step, batch in enumerate(expected):
        shares = [got[r][step] for r in range(world)]
        assert sorted(i for s in shares for i in s) == sorted(batch)
        plan_config = config
        if config.enabled and config.equal_size and len(batch) % world:
            plan_config = BalanceConfig()  # equal counts impossible: the toggle off's split
        if plan_config.enabled:
            plan = StepPlan.make(COST(lengths[batch]), world, plan_config)
            want = [np.asarray(batch)[p].tolist() for p in plan.parts]
        else:
            want = [_chunk(batch, world, r) for r in range(world)]
        assert [list(s) for s in shares] == want
        for r, s in enumerate(shares):
            assert s.share == BatchShare(
                epoch=epoch,
                step=step,
                rank=r,
                world_size=world,
                num_samples=len(batch),
                num_tokens=int(lengths[batch].sum()),
                num_loss_terms=int(lengths[batch].sum()),  # no loss_counts: the tokens
                digest=shares[0].share.digest,
            )


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 70),
    batch_size=st.integers(1, 6),
    world=st.integers(1, 4),
    method=st.sampled_from(["kk", "lpt", "random"]),
    seed=st.integers(0, 2**20),
    drop_last=st.booleans(),
)
def test_balance_off_and_on_see_the_same_global_batches(
    n, batch_size, world, method, seed, drop_last
):
    """A/B: the toggle changes who trains a sample, never the step it is trained at."""
    kw = {"batch_size": batch_size, "seed": seed, "drop_last": drop_last}
    lengths = _lengths(n, seed)
    off = _epoch(_samplers(n, lengths, world, config=CONFIGS["off"], **kw))
    on = _epoch(_samplers(n, lengths, world, config=CONFIGS[method], **kw))
    for step in range(len(off[0])):
        assert sorted(i for r in off for i in r[step]) == sorted(i for r in on for i in r[step])


@pytest.mark.parametrize("drop_last", [False, True])
def test_global_batches_are_distributed_samplers(drop_last):
    """Torch's DistributedSampler + a DataLoader(batch_size=5) per rank, 3 ranks, 52 samples:
    three full global batches of 15, the same sets here. The 7 samples left: drop_last leaves
    them out on both; without it torch pads the order to 3 · ceil(52 / 3) = 54 by repeating its
    first 2 samples (last batches of 3 per rank: 7 new + 2 repeated), here they form a last
    global batch of 7."""
    n, world, batch_size, seed = 52, 3, 5, 7
    ours = _epoch(
        _samplers(n, _lengths(n), world, batch_size=batch_size, seed=seed, drop_last=drop_last),
        epoch=2,
    )
    theirs = []
    for r in range(world):
        sampler = DistributedSampler(range(n), world, r, seed=seed, drop_last=drop_last)
        sampler.set_epoch(2)
        theirs.append(list(BatchSampler(sampler, batch_size, drop_last=drop_last)))
    assert len(theirs[0]) == len(ours[0]) == (3 if drop_last else 4)
    for step in range(3):
        torch_set = sorted(i for r in theirs for i in r[step])
        assert sorted(i for r in ours for i in r[step]) == torch_set
    if not drop_last:
        order = _order(n, seed, 2, True)
        torch_last = sorted(i for r in theirs for i in r[3])
        assert len(torch_last) == 9 and len(set(torch_last)) == 9  # 7 new + the 2 repeated
        assert set(torch_last) == set(order[45:]) | set(order[:2])
        assert sorted(i for r in ours for i in r[3]) == sorted(order[45:])


def test_set_epoch_changes_the_order_and_an_epoch_repeats():
    samplers = _samplers(40, _lengths(40), 2, config=CONFIGS["off"])
    zero, one, zero_again = _epoch(samplers, 0), _epoch(samplers, 1), _epoch(samplers, 0)
    assert zero == zero_again and zero != one
    assert [i for r in zero for b in r for i in b] != [i for r in one for b in r for i in b]
    unshuffled = _samplers(40, _lengths(40), 2, config=CONFIGS["off"], shuffle=False)
    assert _epoch(unshuffled, 0) == _epoch(unshuffled, 3)
    assert [list(b) for b in _epoch(unshuffled)[1][:2]] == [[4, 5, 6, 7], [12, 13, 14, 15]]


def test_lengths_as_a_function_give_the_same_shares():
    lengths = _lengths(30, 3)
    as_array = _epoch(_samplers(30, lengths, 3, config=CONFIGS["lpt"]))
    as_function = _epoch(_samplers(30, lambda i: int(lengths[i]), 3, config=CONFIGS["lpt"]))
    assert as_array == as_function
    assert [b.share for b in as_array[0]] == [b.share for b in as_function[0]]


def test_lpt_gives_unequal_shares_that_kk_keeps_equal():
    """The heavy tail of _lengths: lpt's shares differ in size, kk's do not."""
    lengths = _lengths(64, 1)
    lpt = _epoch(_samplers(64, lengths, 2, batch_size=16, config=CONFIGS["lpt"]))
    kk = _epoch(_samplers(64, lengths, 2, batch_size=16))
    assert any(len(a) != len(b) for a, b in zip(*lpt, strict=True))
    assert all(len(a) == len(b) == 16 for a, b in zip(*kk, strict=True))


_SCRIPT = """
import json
import numpy as np
from optim.balance import CostModel
from optim.plan import BalanceConfig
from optim.sampler import BalancedBatchSampler
lengths = np.minimum(np.random.default_rng(5).pareto(1.2, 50) * 4, 200).astype(np.int64)
out = []
for rank in range(2):
    s = BalancedBatchSampler(range(50), lambda i: int(lengths[i]), batch_size=6, world_size=2,
                             rank=rank, config=BalanceConfig(enabled=True, method="lpt"),
                             costs=CostModel(c0=1.0, a=0.5, b=0.25), seed=11)
    for epoch in (0, 1):
        s.set_epoch(epoch)
        out.append([[list(b), b.share.digest] for b in s])
print(json.dumps(out))
"""


def test_the_same_seed_and_epoch_give_the_same_shares_in_separate_processes():
    runs = json_from_fresh_processes(_SCRIPT)
    here = []
    for s in _samplers(50, _lengths(50, 5), 2, batch_size=6, config=CONFIGS["lpt"], seed=11):
        for epoch in (0, 1):
            s.set_epoch(epoch)
            here.append([[list(b), b.share.digest] for b in s])
    assert runs[0] == runs[1] == here
    assert here[0] != here[1]  # epoch 1 is another order


def test_the_sampler_plans_without_torch_when_it_does_not_shuffle():
    """KK on lengths 9 9 1 1 5 5 (costs = lengths), 3 samples a rank: the contiguous split
    would cost 19 vs 11; KK pairs 9+5 twice, then adds a 1 to each: {0, 3, 5} and {1, 2, 4}."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import optim.sampler, optim.weights\n"
        "from optim.plan import BalanceConfig\n"
        "s = optim.sampler.BalancedBatchSampler(range(6), [9, 9, 1, 1, 5, 5], batch_size=3,\n"
        "    world_size=2, rank=0, config=BalanceConfig(enabled=True), costs=lambda x: x * 1.0,\n"
        "    shuffle=False)\n"
        "(batch,) = list(s)\n"
        "assert list(batch) == [0, 3, 5], list(batch)\n"
        "assert 'torch' not in sys.modules or sys.modules['torch'] is None\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


# ----------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"world_size": 0}, "world_size"),
        ({"rank": 2}, "rank"),
        ({"rank": -1}, "rank"),
        ({"seed": -1}, "seed"),
        ({"lengths": [1, 2, 3]}, "lengths"),
        ({"lengths": [1.5] * 8}, "lengths"),
        ({"lengths": [1, 2, 3, -4, 5, 6, 7, 8]}, "lengths"),
        ({"lengths": np.ones((8, 1), dtype=np.int64)}, "lengths"),
    ],
)
def test_bad_arguments_name_the_field(kwargs, field):
    args = {"lengths": [1] * 8, "batch_size": 2, "world_size": 2, "rank": 0} | kwargs
    lengths = args.pop("lengths")
    with pytest.raises(ValueError, match=field):
        BalancedBatchSampler(range(8), lengths, config=BalanceConfig(), costs=COST, **args)


def test_bad_lengths_from_a_function_and_bad_costs_fail_when_planned():
    (negative,) = _samplers(8, lambda i: -1 if i == 3 else 1, 1, shuffle=False)
    with pytest.raises(ValueError, match="lengths: must be >= 0"):
        list(negative)
    (short,) = _samplers(8, [1] * 8, 1, costs=lambda x: x[:1] * 1.0)
    with pytest.raises(ValueError, match="costs: shape"):
        list(short)
    with pytest.raises(ValueError, match="epoch"):
        short.set_epoch(-1)


def test_without_a_share_the_wrappers_say_how_to_load():
    with pytest.raises(ValueError, match="indices: a list carries no BatchShare"):
        ShareDataset([10, 11, 12]).__getitems__([0, 1])
    with pytest.raises(ValueError, match="samples: a list carries no BatchShare"):
        ShareCollate(_collate)([10, 11])


def test_the_facade_sampler_is_plan_mode():
    config = FreeScaleConfig(balance=BalanceConfig(enabled=True, mode="shuffle"))
    with pytest.raises(ValueError, match="balance.mode"):
        FreeScale(config, cost_model=COST).sampler(range(8), [1] * 8, batch_size=2)


# ----------------------------------------------------------------- through a DataLoader


@dataclass
class _Batch:
    indices: list[int]
    samples: list[Any]
    share: BatchShare


def _collate(samples: list[Any], share: BatchShare) -> _Batch:
    return _Batch([s[1] for s in samples], list(samples), share)


class _Items:
    """Sample ``i`` is ``("item", i)``."""

    def __len__(self) -> int:
        return 30

    def __getitem__(self, i: int) -> tuple[str, int]:
        return ("item", i)


class _BatchedItems(_Items):
    """A dataset with its own ``__getitems__``: sample ``i`` is ``("batched", i)``."""

    def __getitems__(self, indices: list[int]) -> list[tuple[str, int]]:
        assert type(indices) is list  # the plain list, not the ShareList
        return [("batched", i) for i in indices]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("dataset", [_Items(), _BatchedItems()], ids=["getitem", "getitems"])
def test_loader_batches_carry_their_share(num_workers, dataset):
    lengths = _lengths(30, 2)
    sampler = BalancedBatchSampler(
        dataset, lengths, batch_size=4, world_size=2, rank=1, config=CONFIGS["lpt"], costs=COST
    )
    sampler.set_epoch(1)
    loader = DataLoader(
        ShareDataset(dataset),
        batch_sampler=sampler,
        collate_fn=ShareCollate(_collate),
        num_workers=num_workers,
    )
    batches = list(loader)
    sampler.set_epoch(1)
    expected = list(sampler)
    assert len(batches) == len(loader) == 4  # 8, 8, 8, 6 samples
    tag = "batched" if isinstance(dataset, _BatchedItems) else "item"
    for batch, want in zip(batches, expected, strict=True):
        assert batch.indices == list(want)
        assert batch.samples == [(tag, i) for i in want]
        assert batch.share == want.share
    assert [b.share.step for b in batches] == [0, 1, 2, 3]
    assert [b.share.num_samples for b in batches] == [8, 8, 8, 6]
    assert all(b.share.epoch == 1 and b.share.rank == 1 for b in batches)


# ------------------------------------------- under torchrec's TrainPipelineSparseDist (2 ranks)

NUM_SEQS, SEQ_BATCH, SEQ_SEED, EPOCHS = 40, 8, 5, 2  # global batches of 16, 16, 8 per epoch
ROWS, DIM = 50, 8


class _Sequences:
    """Sample ``i``: ``(i, item ids, label)``, as many ids as its length (heavy-tailed)."""

    def __init__(self) -> None:
        rng = np.random.default_rng(4)
        self.lengths = 1 + np.minimum(rng.pareto(1.2, NUM_SEQS) * 3, 40).astype(np.int64)
        self.ids = [rng.integers(0, ROWS, n) for n in self.lengths]
        self.labels = rng.integers(0, 2, NUM_SEQS).astype(np.float32)

    def __len__(self) -> int:
        return NUM_SEQS

    def __getitem__(self, i: int) -> tuple[int, np.ndarray, float]:
        return i, self.ids[i], float(self.labels[i])


@dataclass
class _SeqBatch(Pipelineable):
    ids: torch.Tensor
    seq: KeyedJaggedTensor
    label: torch.Tensor
    share: BatchShare  # travels with the batch through the pipeline

    def to(self, device: torch.device, non_blocking: bool = False) -> _SeqBatch:
        return _SeqBatch(
            self.ids.to(device, non_blocking=non_blocking),
            self.seq.to(device, non_blocking=non_blocking),
            self.label.to(device, non_blocking=non_blocking),
            self.share,
        )

    def record_stream(self, stream: Any) -> None:
        self.seq.record_stream(stream)

    def pin_memory(self) -> _SeqBatch:
        return _SeqBatch(self.ids, self.seq.pin_memory(), self.label, self.share)


def _collate_seqs(samples: list[tuple[int, np.ndarray, float]], share: BatchShare) -> _SeqBatch:
    ids = [s[1] for s in samples]
    seq = KeyedJaggedTensor.from_lengths_sync(
        keys=["item"],
        values=torch.from_numpy(np.concatenate(ids)),
        lengths=torch.tensor([len(i) for i in ids], dtype=torch.int32),
    )
    index = torch.tensor([s[0] for s in samples], dtype=torch.int64)
    label = torch.tensor([s[2] for s in samples], dtype=torch.float32)
    return _SeqBatch(index, seq, label, share)


class _SeqModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        meta = torch.device("meta")
        table = EmbeddingBagConfig(
            name="t_item", embedding_dim=DIM, num_embeddings=ROWS, feature_names=["item"]
        )
        self.ebc = EmbeddingBagCollection(tables=[table], device=meta)
        self.mlp = nn.Linear(DIM, 1, device=meta)

    def forward(self, batch: _SeqBatch) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        logits = self.mlp(self.ebc(batch.seq).values()).squeeze(-1)
        losses = nn.functional.binary_cross_entropy_with_logits(
            logits, batch.label, reduction="none"
        )
        loss = losses.sum() * batch.share.loss_weight("mean")  # the weight of its own batch
        return loss, (loss.detach(), losses.detach(), batch.ids)


def _seq_pipeline() -> tuple[TrainPipelineSparseDist[Any, Any], DistributedModelParallel]:
    """The model, its table on rank 1 (table-wise fused exact SGD), every tensor set from a seed
    of its name, the MLP with SGD, in torchrec's pipeline."""
    cpu = torch.device("cpu")
    model = _SeqModel()
    sharder = EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}
    )
    module_plan = construct_module_sharding_plan(
        model.ebc,
        {"t_item": table_wise(rank=1, compute_kernel="fused")},
        sharder=sharder,
        local_size=2,
        world_size=2,
        device_type="cpu",
    )
    dmp = DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=cpu,
        plan=ShardingPlan({"ebc": module_plan}),
        sharders=[sharder],
    )
    with torch.no_grad():
        for key, value in dmp.state_dict().items():
            g = torch.Generator().manual_seed(sum(map(ord, key)))
            full = (torch.rand(tuple(value.size()), generator=g) - 0.5) * 0.2
            for shard in value.local_shards() if hasattr(value, "local_shards") else []:
                rows, cols = shard.metadata.shard_offsets
                r, c = shard.tensor.shape
                shard.tensor.copy_(full[rows : rows + r, cols : cols + c])
            if not hasattr(value, "local_shards"):
                value.copy_(full)
    fused = set(dmp.fused_optimizer.params)
    dense = {k: v for k, v in dmp.named_parameters() if k not in fused}
    dense_opt = KeyedOptimizerWrapper(dense, lambda ps: torch.optim.SGD(ps, lr=0.1))
    optimizer = CombinedOptimizer([dmp.fused_optimizer, dense_opt])
    return TrainPipelineSparseDist(dmp, optimizer, cpu), dmp


def _local_state(dmp: DistributedModelParallel) -> dict[str, torch.Tensor]:
    state = {}
    for key, value in dmp.state_dict().items():
        shards = value.local_shards() if hasattr(value, "local_shards") else None
        if shards is None:
            state[key] = value.detach().clone()
        elif shards:
            state[key] = torch.cat([s.tensor for s in shards]).clone()
    return state


def _train_seqs(config: BalanceConfig, num_workers: int) -> dict[str, Any]:
    """EPOCHS epochs through the pipeline from FreeScale's sampler: per step what the model
    trained (its loss, its per-sample losses, the samples), and the parameters at the end."""
    pipeline, dmp = _seq_pipeline()
    data = _Sequences()
    fs = FreeScale(FreeScaleConfig(balance=config), cost_model=COST)
    sampler = fs.sampler(data, data.lengths, batch_size=SEQ_BATCH, seed=SEQ_SEED)
    loader = DataLoader(
        ShareDataset(data),
        batch_sampler=sampler,
        collate_fn=ShareCollate(_collate_seqs),
        num_workers=num_workers,
    )
    steps = []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        batches = iter(loader)
        while True:
            try:
                loss, losses, ids = pipeline.progress(batches)  # the model's output
            except StopIteration:
                break
            steps.append({"loss": loss.item(), "losses": losses.clone(), "ids": ids.tolist()})
    return {"steps": steps, "state": _local_state(dmp)}


def _pipeline_rank(rank: int, world_size: int, out: Path) -> None:
    record = {
        "off": _train_seqs(CONFIGS["off"], num_workers=0),
        "lpt": _train_seqs(CONFIGS["lpt"], num_workers=1),
    }
    torch.save(record, out / f"rank{rank}.pt")


@pytest.mark.multiprocess
@pytest.mark.slow
def test_shares_and_weights_travel_with_their_batch_under_train_pipeline_sparse_dist(tmp_path):
    """Two gloo ranks, torchrec's pipeline (it fetches batches ahead of the step it trains):
    at every step each rank trains the samples of its share of that step's global batch with
    that global batch's weight; lpt's unequal shares (loaded by a worker process) then train
    like the toggle off's equal ones: the same global mean loss per step and the same table
    and dense parameters, up to float32 reordering."""
    run_ranks(_pipeline_rank, 2, tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    global_batches = [
        batch
        for epoch in range(EPOCHS)
        for batch in _expected_batches(
            NUM_SEQS, 2 * SEQ_BATCH, _order(NUM_SEQS, SEQ_SEED, epoch, True), False
        )
    ]
    assert [len(b) for b in global_batches] == [16, 16, 8] * EPOCHS
    for run in ("off", "lpt"):
        steps = [r[run]["steps"] for r in ranks]
        assert [len(s) for s in steps] == [len(global_batches)] * 2
        for k, batch in enumerate(global_batches):
            assert sorted(steps[0][k]["ids"] + steps[1][k]["ids"]) == sorted(batch), (run, k)
            for r in range(2):  # the loss is this batch's: 2 / (its global batch's size) · Σ
                s = steps[r][k]
                assert s["losses"].numel() == len(s["ids"]) > 0
                want = 2 / len(batch) * s["losses"].sum().item()
                assert s["loss"] == pytest.approx(want, rel=1e-6), (run, k, r)
        if run == "off":  # contiguous chunks
            assert all(steps[0][k]["ids"] == _chunk(b, 2, 0) for k, b in enumerate(global_batches))
    lpt_steps = [r["lpt"]["steps"] for r in ranks]
    assert any(len(a["ids"]) != len(b["ids"]) for a, b in zip(*lpt_steps, strict=True))
    for k in range(len(global_batches)):
        off_loss = sum(r["off"]["steps"][k]["loss"] for r in ranks) / 2  # the global mean loss
        lpt_loss = sum(r["lpt"]["steps"][k]["loss"] for r in ranks) / 2
        assert lpt_loss == pytest.approx(off_loss, rel=1e-5), k
    for r in ranks:
        assert r["off"]["state"].keys() == r["lpt"]["state"].keys()
        for key, value in r["off"]["state"].items():
            torch.testing.assert_close(r["lpt"]["state"][key], value, rtol=1e-5, atol=1e-6)
