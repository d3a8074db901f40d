"""Reference sequence-recommendation workload: synthetic heavy-tailed histories and the model.

Modules (torch-free ones import without torch; names load lazily from them on first use):

- ``lengths``: ``LengthPreset``, ``PRESETS`` (lognormal / powerlaw / uniform). No torch.
- ``data``: ``DataConfig``, ``SyntheticHistories``, ``Sample``, ``global_batches``,
  ``random_split``, ``pack_sample`` / ``unpack_sample``. No torch (except
  ``SyntheticHistories.batch``).
- ``config``: ``ModelConfig`` and its presets, ``data_config_for``; ``JobConfig`` (the job,
  composed of its components' configs) and its ``job.json``. No torch.
- ``cost``: ``estimate_cost``, ``cost_coefficients`` (an ``optim.balance.CostModel``). No torch.
- ``batch``: ``Batch`` (torchrec KJTs), ``collate``.
- ``model``: ``SeqRecModel`` (EBC + EC + HSTU blocks on jagged sequences).
- ``sharding``: ``wrap_model`` (DMP), ``build_optimizer``.
- ``inputs``: ``StepInputs``: each rank's batch per step, the random split or a balanced plan.
- ``overlap``: per embedding table, the share of a global batch's IDs the previous one had (the
  sidecar's ``id_overlap``). No torch.
- ``train``: the instrumented job, one process per rank (``python -m fsobs.workload.train
  RUN_DIR``: it trains ``RUN_DIR/job.json``).
- ``launch``: ``fsobs run``: writes ``job.json``, starts the ranks with torchrun, no torch in
  this process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from optim.lazy import lazy_attributes

if TYPE_CHECKING:
    from fsobs.workload.batch import Batch, collate
    from fsobs.workload.config import ModelConfig, check_compatible, data_config_for
    from fsobs.workload.cost import cost_coefficients, estimate_cost
    from fsobs.workload.data import (
        DataConfig,
        Sample,
        SyntheticHistories,
        global_batches,
        random_split,
    )
    from fsobs.workload.lengths import PRESETS, LengthPreset
    from fsobs.workload.model import SeqRecModel
    from fsobs.workload.sharding import build_optimizer, wrap_model

_SOURCES = {
    "Batch": "batch",
    "collate": "batch",
    "ModelConfig": "config",
    "check_compatible": "config",
    "data_config_for": "config",
    "cost_coefficients": "cost",
    "estimate_cost": "cost",
    "DataConfig": "data",
    "Sample": "data",
    "SyntheticHistories": "data",
    "global_batches": "data",
    "random_split": "data",
    "PRESETS": "lengths",
    "LengthPreset": "lengths",
    "SeqRecModel": "model",
    "build_optimizer": "sharding",
    "wrap_model": "sharding",
}

__all__ = [
    "Batch",
    "DataConfig",
    "LengthPreset",
    "ModelConfig",
    "PRESETS",
    "Sample",
    "SeqRecModel",
    "SyntheticHistories",
    "build_optimizer",
    "check_compatible",
    "collate",
    "cost_coefficients",
    "data_config_for",
    "estimate_cost",
    "global_batches",
    "random_split",
    "wrap_model",
]

__getattr__, __dir__ = lazy_attributes(
    __name__, {name: f".{module}" for name, module in _SOURCES.items()}
)
