"""optim.pec against plain torchrec on gloo ranks: torchrec's PEC pipeline with the CPU changes
and the gradient fixes trains bit for bit like a plain row-wise EmbeddingCollection trained with
TrainPipelineSparseDist; without either gradient fix it does not.

The model: an EmbeddingCollection of two row-wise tables (two sequence features, Zipf-drawn IDs:
most of a batch's IDs were in the previous batch, so both the overlapped and the non-overlapped
path carry traffic), a table-wise EmbeddingBagCollection (the non-PEC sparse module of CPU point
3) and an MLP. The table optimizer is fused through the sharders' fused params, as torchrec
does (exact SGD or exact row-wise Adagrad); the MLP has torch's SGD. Every run trains the same
batches from the same start; each rank writes what it saw and the tests compare with ``==``.
All runs of one world size share one set of rank processes (:func:`_rank`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec.distributed.train_pipeline.pec_train_pipeline")

import torch.distributed as dist  # noqa: E402
from fbgemm_gpu.split_embedding_configs import EmbOptimType  # noqa: E402
from torch import nn  # noqa: E402
from torchrec.distributed.dist_data import _get_recat  # noqa: E402
from torchrec.distributed.embedding import EmbeddingCollectionSharder  # noqa: E402
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: E402
from torchrec.distributed.model_parallel import DistributedModelParallel  # noqa: E402
from torchrec.distributed.pec_embedding import PECEmbeddingCollectionSharder  # noqa: E402
from torchrec.distributed.sharding_plan import (  # noqa: E402
    construct_module_sharding_plan,
    row_wise,
    table_wise,
)
from torchrec.distributed.train_pipeline import pec_train_pipeline  # noqa: E402
from torchrec.distributed.train_pipeline.train_pipelines import (  # noqa: E402
    TrainPipelineSparseDist,
)
from torchrec.distributed.types import ShardingEnv, ShardingPlan  # noqa: E402
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig  # noqa: E402
from torchrec.modules.embedding_modules import (  # noqa: E402
    EmbeddingBagCollection,
    EmbeddingCollection,
)
from torchrec.modules.pec_embedding_modules import PECEmbeddingCollection  # noqa: E402
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper  # noqa: E402
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # noqa: E402
from torchrec.streamable import Pipelineable  # noqa: E402

from optim.pec import (  # noqa: E402
    ExactTrainPipelinePEC,
    cpu_record_stream,
    pec_to_plain_keys,
    plain_to_pec_keys,
    variable_batch_fields,
)
from optim.pec import _rank_major_order as rank_major_order  # noqa: E402
from tests.support.dist import run_ranks  # noqa: E402

STEPS = 21
CHECKPOINT_AT = 8  # steps done when the mid-run checkpoint is taken
BATCH = 8  # samples per rank
MAX_LEN = 6
DIM = 8
SEQ_TABLES = {"t_item": ("item", 300), "t_cat": ("cat", 40)}  # table: (feature, rows)
USER_TABLE = ("t_user", "user", 32)
OPTIMIZERS = {
    "sgd": {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1},
    "adagrad": {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1, "eps": 1e-8},
}
CPU = torch.device("cpu")
multiprocess = [pytest.mark.multiprocess, pytest.mark.slow]

# ----------------------------------------------------------------------------- data


@dataclass
class Batch(Pipelineable):
    user: KeyedJaggedTensor
    seq: KeyedJaggedTensor
    label: torch.Tensor

    def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
        return Batch(
            self.user.to(device, non_blocking=non_blocking),
            self.seq.to(device, non_blocking=non_blocking),
            self.label.to(device, non_blocking=non_blocking),
        )

    def record_stream(self, stream: Any) -> None:  # as a GPU job writes it
        self.user.record_stream(stream)
        self.seq.record_stream(stream)
        self.label.record_stream(stream)

    def pin_memory(self) -> Batch:
        return Batch(self.user.pin_memory(), self.seq.pin_memory(), self.label.pin_memory())


def _zipf(rows: int, exponent: float = 1.1) -> torch.Tensor:
    return 1.0 / torch.arange(1, rows + 1, dtype=torch.float64) ** exponent


def make_batch(rank: int, step: int) -> Batch:
    """Rank ``rank``'s batch of step ``step``: Zipf IDs, so many repeat from step to step."""
    g = torch.Generator().manual_seed(1_000 * rank + step)
    lengths = torch.randint(1, MAX_LEN + 1, (BATCH,), generator=g, dtype=torch.int32)
    n = int(lengths.sum())
    seq = KeyedJaggedTensor.from_lengths_sync(
        keys=[feature for feature, _ in SEQ_TABLES.values()],
        values=torch.cat(
            [
                torch.multinomial(_zipf(rows), n, replacement=True, generator=g)
                for _, rows in SEQ_TABLES.values()
            ]
        ),
        lengths=torch.cat([lengths] * len(SEQ_TABLES)),
    )
    user = KeyedJaggedTensor.from_lengths_sync(
        keys=[USER_TABLE[1]],
        values=torch.randint(0, USER_TABLE[2], (BATCH,), generator=g),
        lengths=torch.ones(BATCH, dtype=torch.int32),
    )
    return Batch(user, seq, torch.randint(0, 2, (BATCH,), generator=g).float())


# ----------------------------------------------------------------------------- model


class Model(nn.Module):
    def __init__(self, pec: bool) -> None:
        super().__init__()
        meta = torch.device("meta")
        ec = EmbeddingCollection(
            tables=[
                EmbeddingConfig(name=t, embedding_dim=DIM, num_embeddings=n, feature_names=[f])
                for t, (f, n) in SEQ_TABLES.items()
            ],
            device=meta,
        )
        self.ec: nn.Module = PECEmbeddingCollection(ec) if pec else ec
        name, feature, rows = USER_TABLE
        self.ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(
                    name=name, embedding_dim=DIM, num_embeddings=rows, feature_names=[feature]
                )
            ],
            device=meta,
        )
        width = DIM * (1 + len(SEQ_TABLES))
        self.mlp = nn.Sequential(
            nn.Linear(width, 16, device=meta), nn.ReLU(), nn.Linear(16, 1, device=meta)
        )

    def forward(self, batch: Batch) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        seq = self.ec(batch.seq)
        pooled = [
            seq[feature].to_padded_dense(desired_length=MAX_LEN).sum(1)
            for feature, _ in SEQ_TABLES.values()
        ]
        user = self.ebc(batch.user).values()
        logits = self.mlp(torch.cat([user, *pooled], dim=-1)).squeeze(-1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.label)
        return loss, (loss.detach(), logits.detach())


def build(pec: bool, optimizer: str) -> tuple[DistributedModelParallel, CombinedOptimizer]:
    """The sharded model (every parameter set from a seed of its plain key) and its optimizer."""
    world = dist.get_world_size()
    model = Model(pec)
    fused = OPTIMIZERS[optimizer]
    ebc_sharder = EmbeddingBagCollectionSharder(fused_params=fused)
    ec_sharder = (PECEmbeddingCollectionSharder if pec else EmbeddingCollectionSharder)(
        fused_params=fused
    )
    common: dict[str, Any] = {"local_size": world, "world_size": world, "device_type": "cpu"}
    seq_plan = {t: row_wise(compute_kernel="fused") for t in SEQ_TABLES}
    user_plan = {USER_TABLE[0]: table_wise(rank=world - 1, compute_kernel="fused")}
    ec_plan = construct_module_sharding_plan(model.ec, seq_plan, sharder=ec_sharder, **common)
    ebc_plan = construct_module_sharding_plan(model.ebc, user_plan, sharder=ebc_sharder, **common)
    plan = ShardingPlan({"ec": ec_plan, "ebc": ebc_plan})
    dmp = DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=CPU,
        plan=plan,
        sharders=[ebc_sharder, ec_sharder],
    )
    _set_state(dmp)
    fused_keys = set(dmp.fused_optimizer.params)
    dense = {k: v for k, v in dmp.named_parameters() if k not in fused_keys}
    dense_opt = KeyedOptimizerWrapper(dense, lambda ps: torch.optim.SGD(ps, lr=0.05))
    return dmp, CombinedOptimizer([dmp.fused_optimizer, dense_opt])


@torch.no_grad()
def _set_state(dmp: DistributedModelParallel) -> None:
    for key, value in dmp.state_dict().items():
        (plain_key,) = pec_to_plain_keys({key: None})
        g = torch.Generator().manual_seed(sum(map(ord, plain_key)))
        full = (torch.rand(tuple(value.size()), generator=g) - 0.5) * 0.2
        if not hasattr(value, "local_shards"):
            value.copy_(full)
        for shard in getattr(value, "local_shards", list)():
            rows, cols = shard.metadata.shard_offsets
            r, c = shard.tensor.shape
            shard.tensor.copy_(full[rows : rows + r, cols : cols + c])


def local(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """This rank's part of every tensor of a (model or optimizer) state dict, cloned; keys in
    plain torchrec's spelling. Optimizer states are keyed ``<param>/<state>``."""
    out = {}
    for key, value in pec_to_plain_keys(state).items():
        if isinstance(value, dict):
            out |= {f"{key}/{k}": v for k, v in local(value).items()}
        elif hasattr(value, "local_shards"):
            if value.local_shards():
                out[key] = torch.cat([s.tensor for s in value.local_shards()]).clone()
        else:
            out[key] = value.detach().clone()
    return out


def tables(dmp: DistributedModelParallel) -> dict[str, torch.Tensor]:
    return {k: v for k, v in local(dmp.state_dict()).items() if "mlp" not in k}


def train(
    pipeline: Any,
    rank: int,
    steps: int = STEPS,
    *,
    start: int = 0,
    after: Callable[[int], None] | None = None,
) -> dict[str, list[torch.Tensor]]:
    """Losses and logits of each step of batches ``start, ..., start + steps - 1``;
    ``after(step)`` is called after each step (``step`` counts the steps done)."""
    batches = iter([make_batch(rank, start + i) for i in range(steps)])
    losses, logits = [], []
    while True:
        try:
            loss, out = pipeline.progress(batches)
        except StopIteration:
            break
        losses.append(loss.clone())
        logits.append(out[1].clone())
        if after is not None:
            after(start + len(losses))
    return {"losses": losses, "logits": logits}


class CountingPEC(ExactTrainPipelinePEC):
    """Counts, per step, the IDs this rank's shards look up overlapped and non-overlapped."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counts: list[tuple[int, int]] = []

    def _pec_ol_compute(self, context: Any) -> None:
        ctxs = [fc for group in context.pec_forward_ctxs.values() for fc in group]
        ol = sum(fc.ol_features.values().numel() for fc in ctxs)
        self.counts.append((ol, sum(fc.nol_features.values().numel() for fc in ctxs)))
        super()._pec_ol_compute(context)


def pipeline_for(dmp: DistributedModelParallel, opt: Any, pec: bool, **kw: Any) -> Any:
    return CountingPEC(dmp, opt, CPU, **kw) if pec else TrainPipelineSparseDist(dmp, opt, CPU)


# ----------------------------------------------------------------------------- ranks


def _equivalence(rank: int, optimizer: str, checkpoints: dict[str, Any]) -> dict[str, Any]:
    """Plain and PEC over STEPS steps; plain's state after CHECKPOINT_AT steps is kept (model
    and optimizer, as a checkpoint would hold them)."""
    result: dict[str, Any] = {}
    for variant in ("plain", "pec"):
        dmp, opt = build(variant == "pec", optimizer)

        def keep(step: int, dmp: Any = dmp, opt: Any = opt, variant: str = variant) -> None:
            if step == CHECKPOINT_AT and variant == "plain":
                checkpoints["plain"] = _checkpoint(dmp, opt)

        pipeline = pipeline_for(dmp, opt, variant == "pec")
        run = train(pipeline, rank, after=keep)
        result[variant] = run | {"tables": tables(dmp), "counts": getattr(pipeline, "counts", [])}
    return result


def _checkpoint(dmp: DistributedModelParallel, opt: CombinedOptimizer) -> dict[str, Any]:
    return copy.deepcopy({"model": dmp.state_dict(), "optim": opt.state_dict()})


def _first_update(rank: int, pec: bool, **kw: Any) -> dict[str, torch.Tensor]:
    """Each table's change in the first step (exact SGD), the deferred part drained. The
    sequence tables start at zero, so their change is exactly ``-lr * gradient``."""
    dmp, opt = build(pec, "sgd")
    with torch.no_grad():
        for key, value in dmp.state_dict().items():
            for shard in value.local_shards() if ".embeddings." in key else []:
                shard.tensor.zero_()
    before = tables(dmp)
    pipeline = pipeline_for(dmp, opt, pec, **kw)
    pipeline.progress(iter([make_batch(rank, 0), make_batch(rank, 1)]))
    if pec:
        pipeline.drain()
    return {k: v - before[k] for k, v in tables(dmp).items()}


def _checkpoints(rank: int, plain_ckpt: dict[str, Any]) -> dict[str, Any]:
    """Row-wise Adagrad: PEC drained mid-run (its state then, and at its end), and a run
    resumed from each mid-run checkpoint by each side.

    A resumed run is compared with plain torchrec resumed from the same step: with more than
    two ranks, plain torchrec resumed from its own checkpoint already differs from its
    uninterrupted run in the last bits (the MLP, from the first resumed step on: a new DDP's
    all-reduce sums the dense gradients in another order)."""
    dmp, opt = build(True, "adagrad")
    pipeline = pipeline_for(dmp, opt, True)
    at: dict[str, Any] = {}

    def keep(step: int) -> None:
        if step == CHECKPOINT_AT:
            pipeline.drain()
            at["pec"] = _checkpoint(dmp, opt)

    train(pipeline, rank, after=keep)
    pipeline.drain()  # after the last step: nothing left to apply
    out = {
        "pec_at": {"model": local(at["pec"]["model"]), "optim": local(at["pec"]["optim"]["state"])},
        "plain_at": {
            "model": local(plain_ckpt["model"]),
            "optim": local(plain_ckpt["optim"]["state"]),
        },
        "pec_drained_end": tables(dmp),
    }
    resumes = {
        "plain_from_plain": plain_ckpt,
        "pec_from_plain": plain_ckpt,
        "plain_from_pec": at["pec"],
    }
    for name, ckpt in resumes.items():
        pec = name.startswith("pec")
        dmp, opt = build(pec, "adagrad")
        model, state = pec_to_plain_keys(ckpt["model"]), pec_to_plain_keys(ckpt["optim"]["state"])
        if pec:
            model, state = plain_to_pec_keys(model, ["ec"]), plain_to_pec_keys(state, ["ec"])
        dmp.load_state_dict(model)  # strict: every key must match
        opt.load_state_dict({"state": state})
        steps = STEPS - CHECKPOINT_AT
        train(pipeline_for(dmp, opt, pec), rank, steps, start=CHECKPOINT_AT)
        out[name] = tables(dmp)
    return out


def _rank(rank: int, world: int, out: Path) -> None:
    checkpoints: dict[str, Any] = {}
    record: dict[str, Any] = {"sgd": _equivalence(rank, "sgd", {})}
    record["adagrad"] = _equivalence(rank, "adagrad", checkpoints)
    record["first_update"] = {
        "plain": _first_update(rank, False),
        "exact": _first_update(rank, True),
        "undivided": _first_update(rank, True, divide_gradients=False),
        "unordered": _first_update(rank, True, reorder_gradients=False),
    }
    record["checkpoints"] = _checkpoints(rank, checkpoints["plain"])
    torch.save(record, out / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """``ranks(world)``: what each of ``world`` ranks recorded (the ranks run once per size)."""
    done: dict[int, list[dict[str, Any]]] = {}

    def get(world: int) -> list[dict[str, Any]]:
        if world not in done:
            out = tmp_path_factory.mktemp(f"pec_world{world}")
            run_ranks(_rank, world, out)
            done[world] = [torch.load(out / f"rank{r}.pt") for r in range(world)]
        return done[world]

    return get


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """The keys where ``a`` and ``b`` differ (all keys when the key sets differ)."""
    if a.keys() != b.keys():
        return sorted(a.keys() ^ b.keys())
    return [k for k in a if not torch.equal(a[k], b[k])]


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.multiprocess
@pytest.mark.slow
def test_pec_trains_bit_for_bit_like_plain_torchrec(ranks, world, optimizer):
    records = ranks(world)
    for rank, record in enumerate(records):
        plain, pec = record[optimizer]["plain"], record[optimizer]["pec"]
        assert len(pec["losses"]) == len(plain["losses"]) == STEPS
        assert [x.item() for x in pec["losses"]] == [x.item() for x in plain["losses"]], rank
        assert all(
            torch.equal(a, b) for a, b in zip(pec["logits"], plain["logits"], strict=True)
        ), rank
        assert _equal(pec["tables"], plain["tables"]) == [], rank
        assert set(plain["tables"]) >= {"ec.embeddings.t_item.weight", "ec.embeddings.t_cat.weight"}
        assert pec["counts"][0][0] == 0  # the first batch has no previous one: all NOL
    # Both paths carry IDs, most of them the overlapped one (over all ranks: the low Zipf IDs,
    # the frequent ones, are on the first rank's shards).
    ol, nol = (
        sum(n)
        for n in zip(*(c for r in records for c in r[optimizer]["pec"]["counts"]), strict=True)
    )
    assert ol > nol > 0, (ol, nol)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.multiprocess
@pytest.mark.slow
def test_each_gradient_fix_is_load_bearing(ranks, world):
    """Without the division PEC's first update is exactly world_size times plain torchrec's;
    without the reordering it lands on other rows; with both it is plain torchrec's."""
    for rank, record in enumerate(ranks(world)):
        update = record["first_update"]
        seq = [k for k in update["plain"] if k.startswith("ec.")]
        assert _equal(update["exact"], update["plain"]) == [], rank
        for key in seq:
            plain, undivided = update["plain"][key], update["undivided"][key]
            assert plain.norm() > 0
            assert torch.equal(undivided, world * plain), (rank, key)
            assert (undivided.norm() / plain.norm()).item() == world
        assert _equal(update["unordered"], update["plain"]) != [], rank
        assert not any(torch.equal(update["unordered"][k], update["plain"][k]) for k in seq)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.multiprocess
@pytest.mark.slow
def test_drained_mid_run_state_equals_plain_and_training_goes_on_unchanged(ranks, world):
    for rank, record in enumerate(ranks(world)):
        ckpt = record["checkpoints"]
        assert _equal(ckpt["pec_at"]["model"], ckpt["plain_at"]["model"]) == [], rank
        assert _equal(ckpt["pec_at"]["optim"], ckpt["plain_at"]["optim"]) == [], rank
        assert any("momentum1" in k for k in ckpt["plain_at"]["optim"])
        assert _equal(ckpt["pec_drained_end"], record["adagrad"]["plain"]["tables"]) == []


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_checkpoint_loads_across_the_toggle_and_resumes_bit_for_bit(ranks, world):
    for rank, record in enumerate(ranks(world)):
        ckpt = record["checkpoints"]
        assert _equal(ckpt["pec_from_plain"], ckpt["plain_from_plain"]) == [], rank
        assert _equal(ckpt["plain_from_pec"], ckpt["plain_from_plain"]) == [], rank
        if world == 2:  # (_checkpoints: with two ranks, resuming changes no bit at all)
            assert _equal(ckpt["plain_from_plain"], record["adagrad"]["plain"]["tables"]) == []


# ---------------------------------------------------------------- single process, no ranks


def test_state_dict_keys_map_both_ways():
    pec = {
        "ec._embedding_collection.embeddings.t.weight": 1,
        "ebc.embedding_bags.u.weight": 2,
        "mlp.0.weight": 3,
    }
    plain = {"ec.embeddings.t.weight": 1, "ebc.embedding_bags.u.weight": 2, "mlp.0.weight": 3}
    assert pec_to_plain_keys(pec) == plain
    assert plain_to_pec_keys(plain, ["ec"]) == pec
    assert plain_to_pec_keys(plain, ["e"]) == plain  # a module path, not a key prefix
    assert pec_to_plain_keys(plain) == plain


def test_cpu_record_stream_is_a_no_op_on_the_cpu_stream_only_while_active():
    t = torch.ones(2)
    stream = torch.cpu.current_stream()
    original = torch.Tensor.record_stream
    with pytest.raises(RuntimeError, match="unknown parameter type"):
        t.record_stream(stream)
    with cpu_record_stream():
        t.record_stream(stream)
        with cpu_record_stream():  # nested (progress calls fill_pipeline)
            t.record_stream(stream)
        t.record_stream(stream)
        with pytest.raises(NotImplementedError):  # torch's own error for any other stream
            t.record_stream(torch.Stream("cpu"))
    assert torch.Tensor.record_stream is original
    assert "record_stream" not in torch.Tensor.__dict__
    with pytest.raises(RuntimeError, match="unknown parameter type"):
        t.record_stream(stream)


def test_rank_major_order_is_the_order_the_gradient_arrives_in():
    # 2 features x 2 source ranks, 1 sample each; feature-major segments f0r0 f0r1 f1r0 f1r1
    # hold positions [0] [1 2] [3] [4]; the all-to-all delivers r0 (f0, f1), then r1 (f0, f1).
    features = KeyedJaggedTensor(
        keys=["f0", "f1"],
        values=torch.tensor([10, 11, 12, 13, 14]),
        lengths=torch.tensor([1, 2, 1, 1], dtype=torch.int32),
    )
    recat = _get_recat(local_split=2, num_splits=2)
    assert rank_major_order(features, recat).tolist() == [0, 3, 1, 2, 4]


def test_a_cuda_device_keeps_torchrecs_own_pipeline(monkeypatch):
    calls = []
    monkeypatch.setattr(
        pec_train_pipeline.TrainPipelinePEC, "__init__", lambda self, *a: calls.append(a)
    )
    pipeline = ExactTrainPipelinePEC(nn.Linear(1, 1), None, torch.device("cuda"))
    assert len(calls) == 1 and calls[0][2] == torch.device("cuda")
    original = torch.Tensor.record_stream
    with pipeline._cpu_steps():
        assert torch.Tensor.record_stream is original


def _vbe_rank(rank: int, world: int, out: Path) -> None:
    """A batch whose item feature has half the batch size of the category feature (VBE)."""
    dmp, opt = build(True, "sgd")
    before = tables(dmp)
    good = make_batch(rank, 0)
    n = BATCH // 2
    seq = KeyedJaggedTensor(
        keys=["item", "cat"],
        values=torch.arange(n + BATCH) % 40,
        lengths=torch.ones(n + BATCH, dtype=torch.int32),
        stride_per_key_per_rank=[[n], [BATCH]],
    )
    pipeline = ExactTrainPipelinePEC(dmp, opt, CPU)
    with pytest.raises(ValueError) as refused:
        pipeline.progress(iter([Batch(good.user, seq, good.label)]))
    after = tables(dmp)
    same = all(torch.equal(before[k], after[k]) for k in before)
    torch.save({"message": str(refused.value), "unchanged": same}, out / f"rank{rank}.pt")


@pytest.mark.multiprocess
def test_a_variable_batch_per_feature_is_refused_before_any_step(tmp_path):
    assert variable_batch_fields(make_batch(0, 0)) == []
    run_ranks(_vbe_rank, 2, tmp_path)
    for rank in range(2):
        record = torch.load(tmp_path / f"rank{rank}.pt")
        assert record["unchanged"]  # nothing trained
        assert record["message"].startswith(
            "priority_overlap: torchrec's PEC takes no variable batch size per feature (VBE), "
            "and this batch has one in seq;"
        )
