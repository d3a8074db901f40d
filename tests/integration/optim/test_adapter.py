"""optim.adapter: a model that returns logits, a loss over masked positions computed by the loop,
a batch that is a plain dict: through PipelineModel and PipelineBatch, fs.pipeline trains them
on PEC (priority_overlap) on 2 gloo ranks exactly as the loop's own hand-written step does."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

import torch.distributed as dist  # noqa: E402
from fbgemm_gpu.split_embedding_configs import EmbOptimType  # noqa: E402
from torch import nn  # noqa: E402
from torchrec import EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor  # noqa: E402
from torchrec.distributed.embedding import EmbeddingCollectionSharder  # noqa: E402
from torchrec.distributed.model_parallel import DistributedModelParallel  # noqa: E402
from torchrec.distributed.sharding_plan import (  # noqa: E402
    construct_module_sharding_plan,
    row_wise,
)
from torchrec.distributed.types import ShardingPlan  # noqa: E402
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper  # noqa: E402

from optim import FreeScaleConfig, PriorityConfig  # noqa: E402
from optim.adapter import PipelineBatch, PipelineModel  # noqa: E402
from optim.freescale import FreeScale  # noqa: E402
from tests.support.dist import run_ranks  # noqa: E402

STEPS, BATCH, MAX_LEN, ROWS, DIM = 8, 6, 7, 60, 8
IGNORE = -100  # cross_entropy's ignore_index: the positions that are not masked


class Masked(nn.Module):
    """A BERT4Rec-like model: item embeddings (padded), a linear head over the item
    vocabulary; it returns logits per position and knows nothing of the loss."""

    def __init__(self) -> None:
        super().__init__()
        table = EmbeddingConfig(name="t_item", embedding_dim=DIM, num_embeddings=ROWS,
                                feature_names=["item"])  # fmt: skip
        self.ec = EmbeddingCollection(tables=[table], device=torch.device("meta"))
        self.head = nn.Linear(DIM, ROWS, device=torch.device("meta"))

    def forward(self, items: KeyedJaggedTensor) -> torch.Tensor:
        seq = self.ec(items)["item"].to_padded_dense(desired_length=MAX_LEN)
        return self.head(seq)  # [B, MAX_LEN, ROWS]


def masked_loss(logits: torch.Tensor, batch: Any) -> torch.Tensor:
    """Cross-entropy over the masked positions only (the loop's own loss)."""
    labels = batch["labels"]
    return nn.functional.cross_entropy(
        logits.reshape(-1, ROWS), labels.reshape(-1), ignore_index=IGNORE
    )


def make_batch(rank: int, step: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(100 * rank + step)
    lengths = torch.randint(1, MAX_LEN + 1, (BATCH,), generator=g)
    items = torch.randint(0, ROWS // 3, (int(lengths.sum()),), generator=g)  # repeats: overlap
    labels = torch.full((BATCH, MAX_LEN), IGNORE)
    for i, n in enumerate(lengths.tolist()):
        picked = torch.randperm(n, generator=g)[: max(1, n // 3)]
        labels[i, picked] = torch.randint(0, ROWS, (len(picked),), generator=g)
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["item"], values=items, lengths=lengths)
    return {"items": kjt, "labels": labels}


def _build(model: nn.Module, sharders: list[Any], prefix: str) -> tuple[Any, Any]:
    world = dist.get_world_size()
    ec_path = f"{prefix}ec"
    ec = model.get_submodule(ec_path)
    sharder = next(s for s in reversed(sharders))
    plan = construct_module_sharding_plan(
        ec, {"t_item": row_wise(compute_kernel="fused")}, sharder=sharder,
        local_size=world, world_size=world, device_type="cpu",
    )  # fmt: skip
    dmp = DistributedModelParallel(
        model, device=torch.device("cpu"), plan=ShardingPlan({ec_path: plan}), sharders=sharders
    )
    with torch.no_grad():  # the same start in both arms: seeded by the key without the prefix
        for key, value in dmp.state_dict().items():
            plain = key.replace("_embedding_collection.", "").removeprefix(prefix)
            g = torch.Generator().manual_seed(sum(map(ord, plain)))
            full = (torch.rand(tuple(value.size()), generator=g) - 0.5) * 0.2
            if not hasattr(value, "local_shards"):
                value.copy_(full)
            for shard in getattr(value, "local_shards", list)():
                rows, _ = shard.metadata.shard_offsets
                shard.tensor.copy_(full[rows : rows + shard.tensor.shape[0]])
    fused = set(dmp.fused_optimizer.params)
    dense = {k: v for k, v in dmp.named_parameters() if k not in fused}
    head = KeyedOptimizerWrapper(dense, lambda ps: torch.optim.SGD(ps, lr=0.1))
    return dmp, CombinedOptimizer([dmp.fused_optimizer, head])


def _sharder() -> EmbeddingCollectionSharder:
    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}
    return EmbeddingCollectionSharder(fused_params=fused)


def _rank(rank: int, world: int, out: Path) -> None:
    # the loop's own step: model, loss, backward, step
    dmp, opt = _build(Masked(), [_sharder()], "")
    own = []
    for step in range(STEPS):
        batch = make_batch(rank, step)
        opt.zero_grad()
        loss = masked_loss(dmp(batch["items"]), batch)
        loss.backward()
        opt.step()
        own.append(loss.detach().clone())
    # the same, through the adapter on PEC
    fs = FreeScale(FreeScaleConfig(priority_overlap=PriorityConfig(enabled=True)))
    fs.setup()
    model = fs.prepare(PipelineModel(Masked(), masked_loss, inputs=lambda b: b["items"]))
    dmp, opt = _build(model, fs.sharders([_sharder()]), "model.")
    pipeline = fs.pipeline(dmp, opt, torch.device("cpu"))
    batches = map(PipelineBatch, (make_batch(rank, step) for step in range(STEPS)))
    adapted = []
    for _ in range(STEPS):
        loss, logits = pipeline.progress(batches)
        adapted.append(loss.detach().clone())
    fs.close()
    torch.save({"own": own, "adapted": adapted, "status": fs.status()}, out / f"rank{rank}.pt")


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_logits_model_and_the_loops_loss_train_on_pec_as_the_loops_own_step(tmp_path):
    run_ranks(_rank, 2, tmp_path)
    for r in range(2):
        got = torch.load(tmp_path / f"rank{r}.pt", weights_only=False)
        assert len(got["adapted"]) == STEPS
        torch.testing.assert_close(got["adapted"], got["own"], rtol=1e-5, atol=1e-6)
        priority = got["status"]["priority_overlap"]
        assert priority["applied"], priority
        assert priority["reason"].startswith(
            "torchrec's PEC (TrainPipelinePEC, gradients exact) on tables t_item; dense order:"
        )


# --------------------------------------------------------------- PipelineBatch, one process


class _Pair(NamedTuple):
    ids: torch.Tensor
    note: str


@dataclass
class _Fields:
    kjt: KeyedJaggedTensor
    pair: _Pair
    nested: dict[str, list[torch.Tensor]]
    count: int


class _Object:
    def __init__(self) -> None:
        self.values = torch.arange(3)
        self.name = "x"


def test_pipeline_batch_reaches_every_tensor_and_keeps_the_rest():
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f"], values=torch.arange(4), lengths=torch.tensor([1, 3])
    )
    fields = _Fields(kjt, _Pair(torch.ones(2), "n"), {"a": [torch.zeros(1)]}, 7)
    batch = PipelineBatch({"fields": fields, "obj": _Object(), "tag": "t"})
    moved = batch.to(torch.device("meta"))
    assert moved["fields"].kjt.values().device.type == "meta"
    assert moved["fields"].pair.ids.device.type == "meta" and moved["fields"].pair.note == "n"
    assert moved["fields"].nested["a"][0].device.type == "meta"
    assert moved["fields"].count == 7 and moved["tag"] == "t"
    assert moved["obj"].values.device.type == "meta" and moved["obj"].name == "x"
    assert batch["fields"].kjt.values().device.type == "cpu"  # the original is left as it was
    assert PipelineBatch(batch).batch is batch.batch  # no double wrapping
    seen = []

    class _Recording(torch.Tensor):
        def record_stream(self, stream: Any) -> None:  # CPU tensors refuse the CPU stream
            seen.append(stream)

    tensor = torch.zeros(2).as_subclass(_Recording)
    PipelineBatch({"x": tensor, "y": [tensor]}).record_stream("stream")
    assert seen == ["stream", "stream"]


def test_pipeline_model_refuses_what_it_cannot_call():
    with pytest.raises(ValueError, match="loss_fn: must be callable"):
        PipelineModel(nn.Linear(1, 1), "mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="inputs: must be callable"):
        PipelineModel(nn.Linear(1, 1), masked_loss, inputs=3)  # type: ignore[arg-type]
