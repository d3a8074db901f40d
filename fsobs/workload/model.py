"""The reference sequence-recommendation model: torchrec embeddings + HSTU blocks on jagged input.

::

    sparse_pooled -> EmbeddingBagCollection (ebc) -> user, ctx [B, 2D] ------------+
    sparse_seq -> EmbeddingCollection (ec) -> item_seq + cat_seq, jagged [ΣL, D]  |
        -> n HSTU blocks, each sample on its own L events                         |
        -> mean over each sample's events: h [B, D] ------------------------------+
    sparse_seq -> ec -> target_item [B, D] ---------------------------------------+
        -> MLP head on [h, user, ctx, target, h·target] -> logit -> BCE with the label

The blocks are HSTU-style (Zhai et al., ICML'24) with *pointwise* attention: U, V, Q, K =
SiLU(Linear(LayerNorm(x))); per head, ``A = tril(SiLU(Q·Kᵀ)) / L``; ``y = Linear(LayerNorm(A·V)
⊙ U)``; ``x + y``. (No relative attention bias, no dropout.) Projections run once on all events of
the batch ([ΣL, ·], no padding); attention runs per sample on its own ``L×L`` scores, so the
compute of a sample is ``c0 + a·L + b·L²`` (``fsobs.workload.cost``), never ``L_max²``. The
Python loop adds ~0.3-0.8 ms per sample on a CPU (``benchmarks/bench_cost_model.py``).
Alternatives tried on CPU, torch 2.13: nested (jagged) tensors support neither ragged matmul nor
causal SDPA; a per-sample loop of softmax SDPA took about as long as this one (32 samples of
16-256 events, 2 heads of 32: 22 vs 22 ms, one thread); SDPA padded to the longest sample took
33 ms there, and would grow with ``B·L_max²`` on heavy tails.

For ``DistributedModelParallel`` build the model with ``device="meta"`` (the tables are then
materialized by DMP, only the shards a rank owns); the dense tower is always built on the CPU,
as in ``shared/examples/torchrec_cpu_dmp.py``. Without DMP use ``device="cpu"``.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from torchrec import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    JaggedTensor,
    KeyedTensor,
)

from fsobs.workload.batch import Batch
from fsobs.workload.config import ModelConfig
from fsobs.workload.cost import estimate_cost

__all__ = ["EBC_TABLES", "EC_TABLES", "HSTUBlock", "ModelConfig", "SeqRecModel", "estimate_cost"]

EBC_TABLES = {"t_user": ("user_id",), "t_ctx": ("ctx",)}
"""Pooled tables of ``SeqRecModel.ebc`` -> their features."""
EC_TABLES = {"t_item": ("item_seq", "target_item"), "t_cat": ("cat_seq",)}
"""Sequence tables of ``SeqRecModel.ec`` -> their features (the target shares the item table)."""


class HSTUBlock(nn.Module):
    """One HSTU block over the events of a batch, attention per sample (see module docstring)."""

    def __init__(self, dim: int, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        inner = num_heads * head_dim
        self.norm_in = nn.LayerNorm(dim)
        self.uvqk = nn.Linear(dim, 4 * inner)
        self.norm_attn = nn.LayerNorm(inner)
        self.proj = nn.Linear(inner, dim)

    def forward(self, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """``x``: [ΣL, D], the events of all samples, sample after sample (``lengths``).

        Everything but the L×L attention runs once over all events, so a sample costs a handful
        of ops (few ops keep the profiler's per-op overhead small); per sample only the two
        matmuls, the SiLU and the causal mask, on that sample's own length.
        """
        total = x.shape[0]
        heads, dim = self.num_heads, self.head_dim
        # torch: Tensor.split is unannotated
        u, vqk = F.silu(self.uvqk(self.norm_in(x))).split([heads * dim, 3 * heads * dim], dim=-1)  # type: ignore[no-untyped-call]
        vqk = vqk.reshape(total, 3, heads, dim).permute(1, 2, 0, 3)  # [3, H, ΣL, d]
        per_event = torch.tensor(lengths, dtype=x.dtype, device=x.device)
        per_event = per_event.repeat_interleave(torch.tensor(lengths, device=x.device))
        values = vqk[0] / per_event[:, None]  # the 1/L normalisation, on the linear side
        # split(), not slicing: the backward of one split is one cat, while each slice's
        # backward would write into a zero tensor of all ΣL rows (cost B·ΣL instead of ΣL).
        parts = zip(*(t.split(lengths, 1) for t in (values, vqk[1], vqk[2])), strict=True)
        attn = torch.cat([torch.tril(F.silu(q @ k.transpose(1, 2))) @ v for v, q, k in parts], 1)
        attn = attn.permute(1, 0, 2).reshape(total, heads * dim)
        return cast(torch.Tensor, x + self.proj(self.norm_attn(attn) * u))  # Module() gives Any


class SequenceTower(nn.Module):
    """The dense part: HSTU blocks, per-sample mean pool, MLP head and BCE loss.

    A separate module so that torchrec's pipeline tracer treats it as one leaf (its
    data-dependent Python loop cannot be traced by torch.fx).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d = cfg.emb_dim
        self.blocks = nn.ModuleList(
            HSTUBlock(d, cfg.num_heads, cfg.head_dim) for _ in range(cfg.num_blocks)
        )
        self.norm_out = nn.LayerNorm(d)
        self.wide = (
            nn.Sequential(
                nn.Linear(cfg.head_input, cfg.wide_dim),
                nn.ReLU(),
                nn.Linear(cfg.wide_dim, cfg.head_input),
            )
            if cfg.wide_dim
            else None
        )
        widths = (cfg.head_input, *cfg.mlp_dims)
        layers: list[nn.Module] = []
        for width_in, width_out in zip(widths[:-1], widths[1:], strict=True):
            layers += [nn.Linear(width_in, width_out), nn.ReLU()]
        self.head = nn.Sequential(*layers, nn.Linear(widths[-1], 1))
        self.loss_reduction = cfg.loss_reduction

    def forward(
        self, pooled: KeyedTensor, seq: dict[str, JaggedTensor], labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, detached logits [B]) from the embedding lookups."""
        items, cats = seq["item_seq"], seq["cat_seq"]
        x = items.values() + cats.values()
        lengths = items.lengths().tolist()
        for block in self.blocks:
            x = block(x, lengths)
        h = torch.segment_reduce(self.norm_out(x), "mean", lengths=items.lengths())
        target = seq["target_item"].values()
        features = torch.cat([h, pooled.values(), target, h * target], dim=-1)
        if self.wide is not None:
            features = features + self.wide(features)
        logits = self.head(features).squeeze(-1)
        loss = F.binary_cross_entropy_with_logits(logits, labels, reduction=self.loss_reduction)
        return loss, logits.detach()


class SeqRecModel(nn.Module):
    """EBC ``ebc`` (pooled user/context) + EC ``ec`` (sequences) + ``tower`` (dense).

    ``forward(batch)`` returns ``(loss, logits)``: what ``TrainPipelineSparseDist`` expects
    (it calls backward on the first and returns the second from ``progress()``).
    """

    def __init__(self, cfg: ModelConfig, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.cfg = cfg
        rows = {
            "t_user": cfg.num_users,
            "t_ctx": cfg.num_contexts,
            "t_item": cfg.num_items,
            "t_cat": cfg.num_categories,
        }
        device = torch.device(device)
        self.ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(
                    name=t, embedding_dim=cfg.emb_dim, num_embeddings=rows[t], feature_names=list(f)
                )
                for t, f in EBC_TABLES.items()
            ],
            device=device,
        )
        self.ec = EmbeddingCollection(
            tables=[
                EmbeddingConfig(
                    name=t, embedding_dim=cfg.emb_dim, num_embeddings=rows[t], feature_names=list(f)
                )
                for t, f in EC_TABLES.items()
            ],
            device=device,
        )
        self.tower = SequenceTower(cfg)

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        loss, logits = self.tower(
            self.ebc(batch.sparse_pooled), self.ec(batch.sparse_seq), batch.labels
        )
        # Unequal sample counts per rank (optim.plan.loss_scale); x 1.0 otherwise, which is exact.
        # (No branch: TrainPipelineSparseDist fx-traces this method.)
        return loss * batch.loss_scale, logits
