"""Seeded synthetic user histories with heavy-tailed lengths, and the global-batch order.

Everything here is a pure function of the seed, so that every rank can compute the lengths of
all samples up front (what plan-mode balancing needs), materialize any single sample without
materializing the dataset, and draw the same global batches. No torch here:
:func:`fsobs.workload.batch.collate` turns samples into a torchrec batch.

Random streams (``numpy.random.SeedSequence(seed, spawn_key=...)``, independent of each other):

- ``(0,)``: the lengths of all samples, drawn at once from the preset;
- ``(1, i)``: the content of sample ``i``;
- ``(2, user)``: the taste (preferred categories) of a user;
- ``(3, epoch)``: the sample order of an epoch in ``global_batches``.

A sample is a user (one ``user_id``, one to three ``ctx`` ids) with a history of ``L`` events,
each an item and its category (``category = item % num_categories``). A user prefers three
categories: 80% of the history events and half of the targets come from them. The label is 1
when the target's category is one of the user's preferred categories, flipped with
probability 0.1; so the label is learnable from the history and the target item.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fsobs.workload.lengths import PRESETS
from optim.errors import FieldError

MAX_CONTEXTS = 3  # context ids per sample: 1..MAX_CONTEXTS
_NUM_TASTE = 3
_TASTE_SHARE = 0.8
_LABEL_NOISE = 0.1
_STREAM_LENGTHS, _STREAM_SAMPLE, _STREAM_USER, _STREAM_EPOCH = 0, 1, 2, 3


def _rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


def _check_positive(**fields: int | float) -> None:
    for name, value in fields.items():
        if value <= 0:
            raise FieldError(name, f"must be > 0, got {value}")


@dataclass(kw_only=True, frozen=True)
class DataConfig:
    """What the synthetic dataset looks like. Table sizes must fit the model's tables (see
    ``fsobs.workload.config.data_config_for``)."""

    preset: str = "lognormal"
    """Length preset, a key of ``fsobs.workload.lengths.PRESETS``."""
    num_samples: int = 100_000
    """Samples in the dataset (one epoch)."""
    num_items: int = 1000
    """Item ids are in [0, num_items)."""
    num_categories: int = 20
    """Category ids are in [0, num_categories); at most ``num_items``."""
    num_users: int = 100
    """User ids are in [0, num_users)."""
    num_contexts: int = 50
    """Context ids are in [0, num_contexts)."""
    seed: int = 0
    """Seed of every random stream (non-negative)."""
    length_scale: float = 1.0
    """Multiplies every length (and the preset's min and cap) before rounding."""
    item_popularity: float = 0.0
    """Zipf exponent of the items' popularity (0: uniform; 1.1 is realistic).

    Within a category, item ``k`` (0-based) is
    drawn with weight ``(k + 1) ** -item_popularity``; 0 draws them uniformly. Real item
    popularity is heavy-tailed (1.1 is realistic), which is what makes consecutive batches
    share IDs (the overlap PEC exploits; the sidecars record it)."""

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise FieldError("preset", f"unknown {self.preset!r}, expected one of {list(PRESETS)}")
        _check_positive(
            num_samples=self.num_samples,
            num_items=self.num_items,
            num_categories=self.num_categories,
            num_users=self.num_users,
            num_contexts=self.num_contexts,
            length_scale=self.length_scale,
        )
        if self.num_categories > self.num_items:
            raise FieldError(
                "num_categories",
                f"must be <= num_items ({self.num_items}), got {self.num_categories}",
            )
        if self.seed < 0:
            raise FieldError("seed", f"must be >= 0, got {self.seed}")
        if not (math.isfinite(self.item_popularity) and self.item_popularity >= 0):
            raise FieldError("item_popularity", f"must be >= 0, got {self.item_popularity}")


@dataclass(kw_only=True, frozen=True, eq=False)
class Sample:
    """One user history (numpy arrays of int64; compared by identity)."""

    index: int
    user_id: int
    ctx_ids: np.ndarray
    """1..MAX_CONTEXTS context ids."""
    item_seq: np.ndarray
    """The history's items, oldest first; its length is the sample's length."""
    cat_seq: np.ndarray
    """The category of each history item."""
    target_item: int
    label: float

    @property
    def length(self) -> int:
        return len(self.item_seq)


class SyntheticHistories:
    """The dataset: lengths known up front, any sample materialized on demand.

    ``lengths`` (read-only int64 array) and ``sample(i)`` are deterministic functions of the
    config: two instances with the same config agree everywhere, on any rank.
    """

    def __init__(self, cfg: DataConfig) -> None:
        self.cfg = cfg
        self.preset = PRESETS[cfg.preset]
        lengths = self.preset.draw(
            _rng(cfg.seed, _STREAM_LENGTHS), cfg.num_samples, cfg.length_scale
        )
        lengths.setflags(write=False)
        self.lengths: np.ndarray = lengths
        self._items_per_category = cfg.num_items // cfg.num_categories
        weights = np.arange(1, self._items_per_category + 1, dtype=np.float64)
        cdf = np.cumsum(weights**-cfg.item_popularity)
        self._item_cdf = cdf / cdf[-1]

    def __len__(self) -> int:
        return self.cfg.num_samples

    def sample(self, index: int) -> Sample:
        """Sample ``index`` (0 <= index < len(self))."""
        if not 0 <= index < len(self):
            raise IndexError(f"sample index {index} out of range [0, {len(self)})")
        cfg, rng = self.cfg, _rng(self.cfg.seed, _STREAM_SAMPLE, index)
        length = int(self.lengths[index])
        user_id = int(rng.integers(cfg.num_users))
        taste = self._taste(user_id)
        ctx_ids = rng.integers(cfg.num_contexts, size=int(rng.integers(1, MAX_CONTEXTS + 1)))
        from_taste = rng.random(length) < _TASTE_SHARE
        cat_seq = np.where(
            from_taste,
            taste[rng.integers(_NUM_TASTE, size=length)],
            rng.integers(cfg.num_categories, size=length),
        )
        item_seq = cat_seq + cfg.num_categories * self._items(rng, length)
        if rng.random() < 0.5:
            target_cat = int(taste[rng.integers(_NUM_TASTE)])
        else:
            target_cat = int(rng.integers(cfg.num_categories))
        target_item = target_cat + cfg.num_categories * int(self._items(rng, 1)[0])
        label = float((target_cat in taste) != (rng.random() < _LABEL_NOISE))
        return Sample(
            index=index,
            user_id=user_id,
            ctx_ids=ctx_ids,
            item_seq=item_seq,
            cat_seq=cat_seq,
            target_item=target_item,
            label=label,
        )

    def _items(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` item positions within a category (:attr:`DataConfig.item_popularity`)."""
        if self.cfg.item_popularity == 0:
            return rng.integers(self._items_per_category, size=size)
        return np.searchsorted(self._item_cdf, rng.random(size), side="right")

    def _taste(self, user_id: int) -> np.ndarray:
        rng = _rng(self.cfg.seed, _STREAM_USER, user_id)
        size = min(_NUM_TASTE, self.cfg.num_categories)
        taste = rng.choice(self.cfg.num_categories, size=size, replace=False)
        return np.resize(taste, _NUM_TASTE)  # repeats when there are fewer categories


def pack_sample(sample: Sample) -> np.ndarray:
    """``sample`` as one int64 row (what shuffle-mode balancing sends between ranks)::

    [index, user_id, target_item, label, n_ctx, ctx_ids..., L, item_seq..., cat_seq...]
    """
    head = [
        sample.index,
        sample.user_id,
        sample.target_item,
        int(sample.label),
        len(sample.ctx_ids),
    ]
    return np.concatenate(
        [head, sample.ctx_ids, [sample.length], sample.item_seq, sample.cat_seq]
    ).astype(np.int64)


def unpack_sample(row: np.ndarray) -> Sample:
    """The inverse of :func:`pack_sample`."""
    n_ctx = int(row[4])
    length = int(row[5 + n_ctx])
    items = 6 + n_ctx
    return Sample(
        index=int(row[0]),
        user_id=int(row[1]),
        ctx_ids=row[5 : 5 + n_ctx].copy(),
        item_seq=row[items : items + length].copy(),
        cat_seq=row[items + length : items + 2 * length].copy(),
        target_item=int(row[2]),
        label=float(row[3]),
    )


def global_batches(
    num_samples: int, global_batch_size: int, num_steps: int, seed: int
) -> list[np.ndarray]:
    """The sample indices of each step's global batch (int64 arrays of ``global_batch_size``).

    The indices form one stream: a seeded permutation of all samples for epoch 0, then another
    for epoch 1, and so on; step ``s`` takes the stream's ``s``-th slice. Every sample appears
    exactly once per epoch. When ``num_samples`` is not a multiple of the batch size, one step
    spans two epochs (and may then hold the same sample twice).
    """
    _check_positive(
        num_samples=num_samples, global_batch_size=global_batch_size, num_steps=num_steps
    )
    if global_batch_size > num_samples:
        raise FieldError(
            "global_batch_size", f"must be <= num_samples ({num_samples}), got {global_batch_size}"
        )
    if seed < 0:
        raise FieldError("seed", f"must be >= 0, got {seed}")
    num_epochs = math.ceil(global_batch_size * num_steps / num_samples)
    stream = np.concatenate(
        [_rng(seed, _STREAM_EPOCH, e).permutation(num_samples) for e in range(num_epochs)]
    )
    return [
        stream[s * global_batch_size : (s + 1) * global_batch_size].astype(np.int64)
        for s in range(num_steps)
    ]


def random_split(global_batch: np.ndarray, world_size: int, rank: int) -> np.ndarray:
    """The baseline assignment: rank ``rank`` takes the ``rank``-th of ``world_size`` equal
    contiguous chunks of the (already shuffled) global batch."""
    _check_positive(world_size=world_size)
    if not 0 <= rank < world_size:
        raise FieldError("rank", f"must be in [0, {world_size}), got {rank}")
    if len(global_batch) % world_size:
        raise FieldError(
            "global_batch", f"size {len(global_batch)} is not a multiple of world_size {world_size}"
        )
    per_rank = len(global_batch) // world_size
    return np.asarray(global_batch[rank * per_rank : (rank + 1) * per_rank])
