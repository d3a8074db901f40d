"""Which embedding modules ``priority_overlap`` turns into PEC ones, and what it says about the
others (optim.pec_setup), in one process: no sharding is needed to decide."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection  # noqa: E402
from torchrec.distributed.embedding import EmbeddingCollectionSharder  # noqa: E402
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: E402
from torchrec.distributed.pec_embedding import PECEmbeddingCollectionSharder  # noqa: E402
from torchrec.distributed.planner import ParameterConstraints  # noqa: E402
from torchrec.modules.embedding_configs import EmbeddingConfig  # noqa: E402
from torchrec.modules.pec_embedding_modules import PECEmbeddingCollection  # noqa: E402
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # noqa: E402

from optim import FreeScale, FreeScaleConfig, PriorityConfig, ToggleStatus  # noqa: E402
from optim.ddp import DenseGate  # noqa: E402
from optim.freescale import _priority_status  # noqa: E402
from optim.pec_setup import PECSetup, to_pec  # noqa: E402

META = torch.device("meta")


def _ec(*tables: str) -> EmbeddingCollection:
    configs = [
        EmbeddingConfig(name=t, embedding_dim=8, num_embeddings=100, feature_names=[f"f_{t}"])
        for t in tables
    ]
    return EmbeddingCollection(tables=configs, device=META)


def _ebc() -> EmbeddingBagCollection:
    config = EmbeddingBagConfig(
        name="t_user", embedding_dim=8, num_embeddings=10, feature_names=["u"]
    )
    return EmbeddingBagCollection(tables=[config], device=META)


class Tower(nn.Module):
    """Dense part, a leaf for the pipeline's tracer (it holds no embedding module)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(8, 1, device=META)

    def forward(self, seq: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.head(seq["f_t_item"].values()).sum()  # a loop over a proxy would not trace


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ebc = _ebc()
        self.ec = _ec("t_item", "t_cat")
        self.tower = Tower()

    def forward(self, pooled: KeyedJaggedTensor, seq: KeyedJaggedTensor) -> torch.Tensor:
        return self.tower(self.ec(seq)) + self.ebc(pooled).values().sum()


class Branching(Model):
    def forward(self, pooled: KeyedJaggedTensor, seq: KeyedJaggedTensor) -> torch.Tensor:
        if seq.lengths().sum() > 0:  # data-dependent control flow: fx cannot trace it
            return self.tower(self.ec(seq))
        return self.ebc(pooled).values().sum()


class Twice(Model):
    def forward(self, pooled: KeyedJaggedTensor, seq: KeyedJaggedTensor) -> torch.Tensor:
        return self.tower(self.ec(seq)) + self.tower(self.ec(seq))


def test_the_collection_becomes_pec_and_the_bag_collection_is_named():
    model = Model()
    inner = model.ec
    setup = to_pec(model)
    assert isinstance(model.ec, PECEmbeddingCollection)
    assert model.ec.embedding_collection is inner  # the same tables, wrapped
    assert setup == PECSetup(
        modules=("ec",),
        tables=("t_item", "t_cat"),
        skipped={"ebc": "an EmbeddingBagCollection (PEC takes EmbeddingCollections only)"},
    )
    assert setup.applied
    assert setup.describe() == (
        "torchrec's PEC (TrainPipelinePEC, gradients exact) on tables t_item, t_cat; "
        "not on ebc: an EmbeddingBagCollection (PEC takes EmbeddingCollections only)"
    )
    with pytest.raises(ValueError, match="ec is PEC already"):
        to_pec(model)


def test_tables_constrained_off_row_wise_stay_plain():
    model = Model()
    constraints = {
        "t_item": ParameterConstraints(sharding_types=["row_wise"]),
        "t_cat": ParameterConstraints(sharding_types=["table_wise", "column_wise"]),
    }
    setup = to_pec(model, constraints)
    assert isinstance(model.ec, EmbeddingCollection) and not setup.applied
    assert setup.skipped["ec"] == (
        "tables constrained to other shardings than row-wise: t_cat (table_wise/column_wise) "
        "(PEC is row-wise only)"
    )
    assert to_pec(Model(), {"t_cat": ParameterConstraints(sharding_types=["row_wise"])}).applied


@pytest.mark.parametrize(
    ("cls", "why"),
    [
        (Branching, "torch.fx cannot trace the model (symbolically traced variables cannot"),
        (Twice, "the model calls ec more than once (PEC needs one call)"),
    ],
)
def test_a_model_the_pipeline_cannot_rewrite_stays_plain(cls, why):
    model = cls()
    inner = model.ec
    setup = to_pec(model)
    assert model.ec is inner and not setup.applied  # put back as it was
    assert setup.skipped["ec"].startswith(why)


def test_sharders_add_pec_around_the_collection_sharder_only_when_pec_took_tables():
    fused = {"learning_rate": 0.1}
    ec_sharder = EmbeddingCollectionSharder(fused_params=fused)
    given = [EmbeddingBagCollectionSharder(fused_params=fused), ec_sharder]
    off = FreeScale()
    assert off.prepare(model := Model()) is model and isinstance(model.ec, EmbeddingCollection)
    assert off.sharders(given) == given
    on = FreeScale(FreeScaleConfig(priority_overlap=PriorityConfig(enabled=True)))
    on.prepare(Model())
    out = on.sharders(given)
    assert out[:2] == given and len(out) == 3
    assert isinstance(out[2], PECEmbeddingCollectionSharder)
    assert out[2]._embedding_collection_sharder is ec_sharder  # the same fused optimizer
    none = FreeScale(FreeScaleConfig(priority_overlap=PriorityConfig(enabled=True)))
    none.prepare(Branching())
    assert none.sharders(given) == given


def test_the_status_says_both_parts():
    groups = ToggleStatus(True, True, "gloo: groups of their own")
    took = PECSetup(("ec",), ("t_item",), {"ebc": "an EmbeddingBagCollection"})
    status = _priority_status(groups, took, DenseGate())
    assert (status.requested, status.applied) == (True, True)
    assert status.reason == (
        "torchrec's PEC (TrainPipelinePEC, gradients exact) on tables t_item; "
        "not on ebc: an EmbeddingBagCollection; dense order: after_embedding; "
        "gloo: groups of their own"
    )
    nothing = PECSetup(skipped={"ebc": "an EmbeddingBagCollection"})
    off = _priority_status(ToggleStatus(True, False, "off here"), nothing, None)
    assert off.applied is False and off.reason is not None
    assert off.reason.endswith("dense order: concurrent; off here")
    # without PEC (prepare not called) the dense order alone, decided by the gate's shape rule
    alone = _priority_status(groups, None, DenseGate(auto=True))
    assert alone.reason == (
        "dense order: auto: not decided yet (no backward with dense buckets seen); "
        "gloo: groups of their own"
    )
