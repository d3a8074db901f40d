"""Which embedding modules ``priority_overlap`` turns into PEC ones, and what it says about the
others (optim.pec_setup), in one process: no sharding is needed to decide."""

from __future__ import annotations

import inspect
from typing import Any

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
from optim.pec import ExactTrainPipelinePEC  # noqa: E402
from optim.pec_setup import PECSetup, leaf_module_names, to_pec  # noqa: E402
from optim.status import priority_status  # noqa: E402

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
        tables_of={"ec": ("t_item", "t_cat")},
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


_BRANCH_LINE = inspect.getsourcelines(Branching.forward)[1] + 1  # the `if` on the lengths


@pytest.mark.parametrize(
    ("cls", "why"),
    [
        (
            Branching,
            f"torch.fx cannot trace the model at test_pec_setup.py:{_BRANCH_LINE} (symbolically "
            "traced variables cannot",
        ),
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


class _Ran(ExactTrainPipelinePEC):
    """The two facts the status reads off a PEC pipeline that has trained (a real one runs in
    tests/integration/optim/test_pec.py and the examples' tests): the steps run and the modules
    torchrec
    pipelined."""

    def __init__(self, steps: int, pipelined: tuple[str, ...]) -> None:
        self.steps_run = steps
        self._pec_modules = dict.fromkeys(pipelined)


def test_the_status_is_applied_only_once_pec_acted_and_says_each_part():
    groups = ToggleStatus(True, True, "gloo: groups of their own")
    took = PECSetup(
        ("ec", "seq.ec"),
        ("t_item", "t_cat"),
        {"ebc": "an EmbeddingBagCollection"},
        {"ec": ("t_item",), "seq.ec": ("t_cat",)},
    )
    tail = "dense order: after_embedding; process groups: gloo: groups of their own"
    ran = priority_status(groups, took, _Ran(3, ("ec",)), DenseGate())
    assert (ran.requested, ran.applied) == (True, True)
    assert ran.reason == (
        "partly applied: torchrec's PEC (TrainPipelinePEC, gradients exact) on tables t_item; "
        "not on seq.ec: torchrec's pipeline did not pipeline it (its input is not taken from "
        f"the batch as it is); not on ebc: an EmbeddingBagCollection; {tail}"
    )
    whole = PECSetup(("ec",), ("t_item",), {}, {"ec": ("t_item",)})
    full = priority_status(groups, whole, _Ran(1, ("ec",)), DenseGate())
    assert full.applied and full.reason == (
        f"torchrec's PEC (TrainPipelinePEC, gradients exact) on tables t_item; {tail}"
    )
    # not acted: no step yet, no PEC pipeline (the loop calls the model itself), nothing taken
    for pipeline, words in [
        (_Ran(0, ()), "PEC on tables t_item: no step trained yet"),
        (None, "PEC took tables t_item, but the loop has no train pipeline from fs.pipeline"),
    ]:
        status = priority_status(groups, whole, pipeline, DenseGate())
        assert not status.applied and status.reason is not None
        assert status.reason.startswith(words)
    nothing = PECSetup(skipped={"ebc": "an EmbeddingBagCollection"})
    off = priority_status(ToggleStatus(True, True, None), nothing, None, None)
    assert off.applied is False and off.reason == (
        "PEC took no table (not on ebc: an EmbeddingBagCollection); dense order: concurrent; "
        "process groups: embedding and dense groups of their own"
    )
    # without PEC (prepare not called): not applied, the dense order said as what it is
    alone = priority_status(groups, None, None, DenseGate(auto=True))
    assert not alone.applied and alone.reason == (
        "PEC: fs.prepare(model) was not called; dense order: auto: not decided yet (no "
        "backward with dense buckets seen); process groups: gloo: groups of their own"
    )


class _Sublayer(nn.Module):
    def forward(self, x: torch.Tensor, layer: Any) -> torch.Tensor:
        return x + layer(x)


class _Block(nn.Module):
    """A transformer-like block that hands a lambda to a sublayer (as BERT4Rec's does)."""

    def __init__(self) -> None:
        super().__init__()
        self.sub = _Sublayer()
        self.lin = nn.Linear(8, 8, device=META)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sub(x, lambda y: self.lin(y))


class _History(nn.Module):
    """The embedding module one level down, beside a norm; reads a buffer in Python."""

    def __init__(self) -> None:
        super().__init__()
        self.ec = _ec("t_item")
        self.norm = nn.LayerNorm(8, device=META)
        self.register_buffer("scale", torch.ones(()))

    def forward(self, seq: KeyedJaggedTensor) -> torch.Tensor:
        x = self.norm(self.ec(seq)["f_t_item"].values())
        if self.scale.shape == ():  # a concrete buffer in torchrec's tracer
            return x
        return x * 2


class _Deep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.history = _History()
        self.blocks = nn.ModuleList([_Block(), _Block()])
        self.out = nn.Linear(8, 1, device=META)

    def forward(self, seq: KeyedJaggedTensor) -> torch.Tensor:
        x = self.history(seq)
        for block in self.blocks:
            x = block(x)
        return self.out(x).sum()


def test_the_leaves_are_torchrecs_and_what_its_tracer_accepts_pec_takes():
    """torchrec's rule (``_get_leaf_module_names``), by hand: in each module with an embedding
    module below it, every other child is a leaf by name; the rest is traced (a ModuleList's
    blocks by their own names are not leaves, so the lambda is traced through)."""
    model = _Deep()
    assert leaf_module_names(model) == ["blocks", "history.norm", "out"]
    setup = to_pec(model)
    assert setup.applied and setup.tables_of == {"history.ec": ("t_item",)}
