"""Simulated runs that write the run format (no torch).

:func:`write_gpu_run` writes realistic multi-rank NCCL GPU Kineto traces (for benchmarks and
tests of the loader and the analyses). Imported lazily, so that
``python -m fsobs.simulate.synthetic_kineto`` runs the module only once.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["SyntheticRunConfig", "kernels_for_size", "write_gpu_run"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("fsobs.simulate.synthetic_kineto"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
