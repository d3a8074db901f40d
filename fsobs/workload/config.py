"""The job's configuration (no torch): the model's shape, and ``JobConfig`` with its ``job.json``.

- :class:`ModelConfig` (the shape of ``SeqRecModel``) and its named presets; :class:`ModelSpec`,
  which of them a job trains.
- :class:`JobConfig`: one reference-job configuration composed of its components' own configs,
  each knob declared once, in the component that reads it::

      JobConfig(
          steps=20, batch_size=32, ...                 # the training loop's own knobs
          model=ModelSpec(size="small"),               # here: ModelConfig.preset + a dense block
          data=DataConfig(preset="lognormal", ...),    # fsobs.workload.data
          profiler=ProfilerConfig(...),                # fsobs.collect.profiler
          freescale=FreeScaleConfig(...),              # optim.config: the toggles
      )

- ``job.json``: ``fsobs run`` builds the JobConfig from its flags and writes it into the run
  directory (:func:`write_job_json`, atomic); every rank reads it (:func:`read_job_json`), which
  turns a bad field into one :class:`~fsobs.errors.JobConfigError` line naming the file and the
  field (``data.preset``; :func:`fsobs.runformat.structs.convert`). ``run.json``'s
  ``workload`` is the same JSON (:meth:`JobConfig.to_json`;
  :meth:`fsobs.runformat.runmeta.RunMeta.knob` reads a knob of it, and of the flat record older
  runs hold).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

from fsobs.collect.profiler import ProfilerConfig
from fsobs.errors import JobConfigError
from fsobs.runformat.atomic import write_atomic
from fsobs.runformat.names import JOB_JSON
from fsobs.runformat.structs import FieldError, convert
from fsobs.workload.data import DataConfig
from optim.config import FreeScaleConfig

_TABLES = ("num_items", "num_categories", "num_users", "num_contexts")
"""The embedding tables' row counts, the same names in ModelConfig and DataConfig."""


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
        for name in ("emb_dim", "num_heads", "head_dim", "num_blocks", *_TABLES):
            if getattr(self, name) < 1:
                raise FieldError(name, f"must be >= 1, got {getattr(self, name)}")
        if self.wide_dim < 0:
            raise FieldError("wide_dim", f"must be >= 0, got {self.wide_dim}")
        if any(d < 1 for d in self.mlp_dims):
            raise FieldError("mlp_dims", f"every width must be >= 1, got {self.mlp_dims}")
        if self.emb_dim % 4:
            raise FieldError("emb_dim", f"must be a multiple of 4 (fbgemm), got {self.emb_dim}")
        if self.loss_reduction not in ("mean", "sum"):
            raise FieldError("loss_reduction", f"'mean' or 'sum', got {self.loss_reduction!r}")

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
            raise FieldError(
                "name", f"unknown model preset {name!r}, expected {list(MODEL_PRESETS)}"
            )
        return dataclasses.replace(MODEL_PRESETS[name], **overrides)


ModelSize = Literal["tiny", "small", "medium"]
"""The names of :data:`MODEL_PRESETS`."""
MODEL_PRESETS: dict[ModelSize, ModelConfig] = {
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
    for name in _TABLES:
        if getattr(data, name) > getattr(model, name):
            raise ValueError(
                f"{name}: data ids go up to {getattr(data, name)} but the model table has "
                f"{getattr(model, name)} rows"
            )


# ---- the job ----
@dataclass(kw_only=True, frozen=True)
class ModelSpec:
    """Which model a job trains: a named size and an optional dense block (:meth:`config`)."""

    size: ModelSize = "small"
    """The model's size, a key of MODEL_PRESETS."""
    dense_mb: float = 0.0
    """Add a dense block of about this many MiB to the model's head (a large dense all-reduce;
    0: none).

    Its width is ``ModelConfig.wide_dim``."""

    def __post_init__(self) -> None:
        if self.size not in MODEL_PRESETS:
            raise FieldError(
                "size", f"unknown {self.size!r}, expected one of {list(MODEL_PRESETS)}"
            )
        if not (math.isfinite(self.dense_mb) and self.dense_mb >= 0):
            raise FieldError("dense_mb", f"must be >= 0, got {self.dense_mb}")

    def config(self) -> ModelConfig:
        """The model's shape: the preset, with ``wide_dim`` sized for ``dense_mb``."""
        base = MODEL_PRESETS[self.size]
        return dataclasses.replace(base, wide_dim=base.wide_dim_for(self.dense_mb))


OPTIMIZERS: tuple[str, ...] = ("adagrad", "sgd")
"""``adagrad`` (default): exact row-wise Adagrad on the tables, Adagrad on the dense parameters.
``sgd``: plain SGD on both, for tests: an update proportional to the gradient, so a wrong scale of
the loss shows in the parameters (Adagrad's update is invariant to a constant factor)."""
_STEPS = 20


def job_profiler(
    steps: int, *, window: int | None = None, every: int | None = None, **fields: Any
) -> ProfilerConfig:
    """The job's profiler: every step after one wait and one warm-up step, input shapes not
    recorded (they cost step time on CPU, BENCHMARKS.md "Profiler overhead"); ``fields`` set
    the other knobs (``enabled``, ``record_shapes``, ...).

    ``window``: live windows of that many recorded steps instead, one every ``every`` steps
    (default ``window + 2``: back to back), each after one wait and one warm-up step, each
    published into its own folder as it closes (:mod:`fsobs.runformat.windows`), so a killed
    job keeps the windows it finished and a watcher sees each one as it closes; the job also
    records what ``fsobs capture`` asks for. ``every=0`` without a window: captures only."""
    fields = {"record_shapes": False} | fields
    if window is None and every is None:
        return ProfilerConfig.every_step(steps, **fields)
    if every == 0 and window is None:
        return ProfilerConfig(active=1, every=0, **fields)
    if window is None:
        raise FieldError("profile_every", "needs profile_window, the steps recorded in each window")
    if type(window) is not int or not 1 <= window <= steps - 2:
        raise FieldError(
            "profile_window",
            f"must be an integer from 1 to the job's {steps} steps less a wait "
            f"and a warm-up step, got {window!r}",
        )
    every = window + 2 if every is None else every
    if type(every) is not int or every < window + 2:
        raise FieldError(
            "profile_every",
            f"must be an integer >= profile_window + 2 ({window + 2}: a wait, a "
            f"warm-up and the window), got {every!r}",
        )
    return ProfilerConfig(active=window, every=every, **fields)


def _default_data() -> DataConfig:
    return data_config_for(ModelSpec().config())


def _default_profiler() -> ProfilerConfig:
    return job_profiler(_STEPS)


@dataclass(kw_only=True, frozen=True)
class JobConfig:
    """The reference job, the same on every rank (``job.json``); the defaults are
    ``fsobs run``'s. Sections that depend on others are checked against them: ``data`` fills
    the model's tables, ``profiler``'s cycles fit in ``steps``."""

    steps: int = _STEPS
    """Training steps (one global batch each)."""
    batch_size: int = 32
    """Samples per rank and step."""
    model: ModelSpec = field(default_factory=ModelSpec)
    """The model trained."""
    data: DataConfig = field(default_factory=_default_data)
    """The synthetic dataset; its id ranges equal the model's tables (``data_config_for``), and
    its ``seed`` is the job's: the dataset, the batch order and the model's initialization."""
    profiler: ProfilerConfig = field(default_factory=_default_profiler)
    """The per-rank profiler (``job_profiler(steps)``: every step after one wait and one
    warm-up step); ``enabled=False`` trains without it."""
    freescale: FreeScaleConfig = field(default_factory=FreeScaleConfig)
    """The optimizer's toggles (``optim.FreeScale``)."""
    cost_model: Path | None = None
    """A JSON cost model file (fsobs fit-cost) for balance (default: the analytic one of the
    model shape)."""
    optimizer: str = "adagrad"
    """One of ``OPTIMIZERS`` (``sgd`` for equivalence tests)."""
    ddp_bucket_mb: int = 25
    """DDP's bucket size for the dense all-reduce, in MiB (torchrec's default).

    Smaller buckets make more all-reduces that can be in flight when the embedding all-to-all
    is issued."""
    save_params: bool = False
    """Write each rank's final parameters to ``params.rank<R>.pt`` (for equivalence tests)."""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "ddp_bucket_mb"):
            if getattr(self, name) < 1:
                raise FieldError(name, f"must be >= 1, got {getattr(self, name)}")
        if self.optimizer not in OPTIMIZERS:
            raise FieldError(
                "optimizer", f"unknown {self.optimizer!r}, expected one of {list(OPTIMIZERS)}"
            )
        shape = self.model.config()
        for name in _TABLES:
            if getattr(self.data, name) != getattr(shape, name):
                raise FieldError(
                    f"data.{name}",
                    f"{getattr(self.data, name)} ids, but the model's table has "
                    f"{getattr(shape, name)} rows (build the data with data_config_for)",
                )
        if self.profiler.num_steps > self.steps:
            raise FieldError(
                "profiler",
                f"its cycles take {self.profiler.num_steps} steps, the job has "
                f"{self.steps} (job_profiler(steps) records every step)",
            )

    @property
    def seed(self) -> int:
        """The job's seed (``data.seed``)."""
        return self.data.seed

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values, one object per section (what ``job.json`` holds, and ``run.json``
        as its ``workload``)."""
        obj: dict[str, Any] = msgspec.to_builtins(self, enc_hook=str)  # a Path as its string
        return obj

    @classmethod
    def from_json(cls, obj: object, *, path: str | Path | None = None) -> JobConfig:
        """The config that :meth:`to_json` gave; a section or field left out takes its default.
        A bad, unknown or mistyped field raises :class:`JobConfigError` naming it (and
        ``path``)."""
        try:
            return convert(obj, cls)
        except FieldError as exc:
            raise JobConfigError(exc.reason, path=path, field=exc.field or None) from None


def write_job_json(run_dir: str | Path, job: JobConfig) -> Path:
    """Write ``run_dir/job.json`` atomically (indent 2, strict JSON); its path."""
    path = Path(run_dir) / JOB_JSON
    text = json.dumps(job.to_json(), indent=2, allow_nan=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.encode("utf-8"))
    return path


def read_job_json(run_dir: str | Path) -> JobConfig:
    """The job of the run in ``run_dir`` (its ``job.json``); :class:`JobConfigError`, one line
    naming the file and the field, when it is missing, not JSON or holds a bad field."""
    path = Path(run_dir) / JOB_JSON
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise JobConfigError(f"cannot read the job config ({exc.strerror})", path=path) from None
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise JobConfigError(f"not JSON: {exc}", path=path) from None
    return JobConfig.from_json(obj, path=path)
