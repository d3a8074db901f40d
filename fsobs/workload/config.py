"""Model shape (no torch): the config of ``SeqRecModel`` and its named presets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from fsobs.workload.data import DataConfig


@dataclass(kw_only=True, frozen=True)
class ModelConfig:
    """Shape of the reference sequence-recommendation model (``fsobs.workload.model``).

    Every embedding table has ``emb_dim`` columns (an EmbeddingCollection needs one dim for all
    its tables). Use ``ModelConfig.preset(name)`` for the named sizes.
    """

    emb_dim: int
    """Width D of every embedding and of the sequence blocks' residual stream."""
    num_heads: int
    """Attention heads H per block."""
    head_dim: int
    """Width of each head's query, key, value and gate (U) vectors."""
    num_blocks: int
    """HSTU blocks applied to each jagged sequence."""
    mlp_dims: tuple[int, ...]
    """Hidden widths of the MLP head (its input is 5·D, its output one logit)."""
    num_items: int
    """Rows of the item table (``item_seq`` and ``target_item``)."""
    num_categories: int
    """Rows of the category table (``cat_seq``)."""
    num_users: int
    """Rows of the user table (pooled ``user_id``)."""
    num_contexts: int
    """Rows of the context table (pooled ``ctx``)."""
    wide_dim: int = 0
    """Hidden width of an extra residual MLP block in the head (``5·D -> wide_dim -> 5·D``):
    dense parameters whose gradients DDP all-reduces every step; 0: no such block. The
    priority-overlap benchmark uses it to make the dense all-reduce compete (``--dense-mb``)."""
    loss_reduction: Literal["mean", "sum"] = "mean"
    """BCE over the rank's samples: ``mean``, or ``sum`` (for unequal per-rank batches, where
    the loop scales the sum by world_size / global_batch_size)."""

    def __post_init__(self) -> None:
        for name in ("emb_dim", "num_heads", "head_dim", "num_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("num_items", "num_categories", "num_users", "num_contexts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.wide_dim < 0:
            raise ValueError(f"wide_dim: must be >= 0, got {self.wide_dim}")
        if any(d < 1 for d in self.mlp_dims):
            raise ValueError(f"mlp_dims: every width must be >= 1, got {self.mlp_dims}")
        if self.emb_dim % 4:
            raise ValueError(f"emb_dim: must be a multiple of 4 (fbgemm), got {self.emb_dim}")
        if self.loss_reduction not in ("mean", "sum"):
            raise ValueError(f"loss_reduction: 'mean' or 'sum', got {self.loss_reduction!r}")

    @property
    def head_input(self) -> int:
        """Width of the head's input: [h, user, ctx, target, h·target]."""
        return 5 * self.emb_dim

    def wide_dim_for(self, dense_mb: float) -> int:
        """The ``wide_dim`` whose block holds about ``dense_mb`` MiB of float32 parameters."""
        return round(dense_mb * 2**20 / 4 / (2 * self.head_input + 1)) if dense_mb > 0 else 0

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """A named size (``MODEL_PRESETS``), optionally with some fields replaced."""
        if name not in MODEL_PRESETS:
            raise ValueError(f"name: unknown model preset {name!r}, expected {list(MODEL_PRESETS)}")
        return dataclasses.replace(MODEL_PRESETS[name], **overrides)


MODEL_PRESETS: dict[str, ModelConfig] = {
    # Unit tests: a forward/backward of a few short samples takes milliseconds.
    "tiny": ModelConfig(
        emb_dim=16,
        num_heads=1,
        head_dim=16,
        num_blocks=1,
        mlp_dims=(32,),
        num_items=1000,
        num_categories=20,
        num_users=100,
        num_contexts=50,
    ),
    "small": ModelConfig(
        emb_dim=64,
        num_heads=2,
        head_dim=32,
        num_blocks=2,
        mlp_dims=(128, 64),
        num_items=20_000,
        num_categories=200,
        num_users=10_000,
        num_contexts=500,
    ),
    "medium": ModelConfig(
        emb_dim=128,
        num_heads=4,
        head_dim=32,
        num_blocks=4,
        mlp_dims=(256, 128),
        num_items=100_000,
        num_categories=1000,
        num_users=100_000,
        num_contexts=1000,
    ),
}


def data_config_for(model: ModelConfig, **fields: Any) -> DataConfig:
    """A ``DataConfig`` whose id ranges equal the model's table sizes; ``fields`` set the rest
    (``preset``, ``num_samples``, ``seed``, ``length_scale``)."""
    tables: dict[str, Any] = {
        "num_items": model.num_items,
        "num_categories": model.num_categories,
        "num_users": model.num_users,
        "num_contexts": model.num_contexts,
    }
    clash = sorted(set(tables) & set(fields))
    if clash:
        raise ValueError(f"{clash[0]}: set by the model config, not here")
    return DataConfig(**tables, **fields)


def check_compatible(model: ModelConfig, data: DataConfig) -> None:
    """Raise ValueError when the data's ids do not fit the model's tables."""
    for name in ("num_items", "num_categories", "num_users", "num_contexts"):
        if getattr(data, name) > getattr(model, name):
            raise ValueError(
                f"{name}: data ids go up to {getattr(data, name)} but the model table has "
                f"{getattr(model, name)} rows"
            )
