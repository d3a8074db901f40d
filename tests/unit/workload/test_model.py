"""The reference model on one process (plain EBC/EC on CPU, no DMP) and its cost model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from torchrec.distributed.train_pipeline.tracing import Tracer

from fsobs.workload.batch import collate
from fsobs.workload.config import ModelConfig, check_compatible, data_config_for
from fsobs.workload.cost import cost_coefficients, estimate_cost
from fsobs.workload.data import DataConfig, Sample, SyntheticHistories
from fsobs.workload.model import SeqRecModel


def _model(preset: str) -> SeqRecModel:
    torch.manual_seed(0)
    return SeqRecModel(ModelConfig.preset(preset), device="cpu")


def _sample(length: int, index: int = 0) -> Sample:
    items = np.arange(length, dtype=np.int64) % 1000
    return Sample(
        index=index,
        user_id=3,
        ctx_ids=np.array([1, 2]),
        item_seq=items,
        cat_seq=items % 20,
        target_item=7,
        label=1.0,
    )


def test_forward_backward_without_dmp():
    cfg = ModelConfig.preset("tiny")
    model = _model("tiny")
    ds = SyntheticHistories(data_config_for(cfg, num_samples=64, preset="powerlaw"))
    batch = collate([ds.sample(i) for i in range(8)])
    loss, logits = model(batch)
    assert logits.shape == (8,) and not logits.requires_grad
    assert torch.isfinite(loss) and loss.ndim == 0
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
    assert model.ec.embeddings["t_item"].weight.grad.abs().sum() > 0


def test_samples_do_not_see_each_other():
    """No padding, no mixing: a sample's logit is the same alone and inside a batch."""
    model = _model("tiny")
    samples = [_sample(5, 0), _sample(40, 1), _sample(1, 2)]
    _, together = model(collate(samples))
    alone = torch.cat([model(collate([s]))[1] for s in samples])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)


def test_top_level_forward_is_traceable_by_the_pipeline():
    """TrainPipelineSparseDist fx-traces the model with sharded modules and dense leaves."""
    graph = Tracer(leaf_modules=["ebc", "ec", "tower"]).trace(_model("tiny"))
    targets = [n.target for n in graph.nodes if n.op == "call_module"]
    assert targets == ["ebc", "ec", "tower"]


def _fit_r2(x: np.ndarray, y: np.ndarray) -> float:
    design = np.stack([np.ones_like(x), x, x * x], axis=1)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ coef
    return 1 - float(residual @ residual) / float(((y - y.mean()) ** 2).sum())


def test_matmul_flops_grow_like_the_cost_model():
    """FLOPs of one sample's forward + backward: c0 + a·L + b·L², exactly the analytic count."""
    model = _model("small")
    lengths = np.array([32, 64, 128, 256, 512])
    flops = []
    for length in lengths:
        counter = FlopCounterMode(display=False)
        with counter:
            loss, _ = model(collate([_sample(int(length))]))
            loss.backward()
        flops.append(counter.get_total_flops())
    flops = np.array(flops, dtype=np.float64)
    assert _fit_r2(lengths.astype(np.float64), flops) > 0.9999
    expected = estimate_cost(lengths, ModelConfig.preset("small"), elementwise_weight=0.0)
    np.testing.assert_allclose(flops, expected, rtol=1e-9)


def test_cost_coefficients():
    cfg = ModelConfig.preset("small")
    coef = cost_coefficients(cfg, elementwise_weight=0.0)
    d, n, inner = 64, 2, 64
    assert coef.a == 30 * n * d * inner and coef.b == 12 * n * inner
    assert coef.c0 == 6 * (320 * 128 + 128 * 64 + 64)
    with_ew = cost_coefficients(cfg)
    assert with_ew.a > coef.a and with_ew.b > coef.b and with_ew.c0 == coef.c0
    cost = estimate_cost(np.array([1, 10, 100]), cfg)
    assert cost.dtype == np.float64 and np.all(np.diff(cost) > 0)
    with pytest.raises(ValueError, match="^elementwise_weight"):
        cost_coefficients(cfg, elementwise_weight=-1)


def test_model_config_presets_and_validation():
    small = ModelConfig.preset("small", num_blocks=3)
    assert small.num_blocks == 3 and small.emb_dim == 64
    with pytest.raises(ValueError, match="^name"):
        ModelConfig.preset("huge")
    with pytest.raises(ValueError, match="^emb_dim"):
        ModelConfig.preset("tiny", emb_dim=18)
    with pytest.raises(ValueError, match="^mlp_dims"):
        ModelConfig.preset("tiny", mlp_dims=(0,))
    with pytest.raises(ValueError, match="^loss_reduction"):
        ModelConfig.preset("tiny", loss_reduction="max")


def test_data_must_fit_the_tables():
    cfg = ModelConfig.preset("tiny")
    check_compatible(cfg, data_config_for(cfg))
    with pytest.raises(ValueError, match="^num_items"):
        check_compatible(cfg, DataConfig(num_items=5000))
    with pytest.raises(ValueError, match="^num_items"):
        data_config_for(cfg, num_items=10)


def test_public_names_resolve():
    import fsobs.workload as workload

    assert sorted(workload.__all__) == sorted(workload._SOURCES)
    for name in workload.__all__:
        assert getattr(workload, name) is not None
    with pytest.raises(AttributeError):
        workload.not_a_name  # noqa: B018
