"""Historical Kineto shapes, read as today's.

The first Kineto releases (PyTorch 1.8 and 1.9, 2021) named the event categories differently
(``libkineto/src/output_json.cpp`` of that time): CPU ops, ``ProfilerStep#N`` included, were
``Operator``, runtime calls ``Runtime``, kernels ``Kernel``, copies ``Memcpy`` and ``Memset``,
the GPU projection of a ``record_function`` ``User`` (then ``gpu_user_Annotation``), and a CPU
op's shapes were ``Input dims``. The loader maps these names to today's as it builds the
events table, so the classification, the steps and the CPU rules see one vocabulary::

    2021 trace   {"cat": "Operator", "name": "ProfilerStep#5", ...}
    events       cat cpu_op, kind step, step 5

HTA's rules (:mod:`fsobs.analysis.hta_compat`) give the same numbers either way: where they
look at the category, they accept both the old and the new name.
"""

from __future__ import annotations

LEGACY_CATEGORIES = {
    "Operator": "cpu_op",
    "Runtime": "cuda_runtime",
    "Kernel": "kernel",
    "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset",
    "User": "gpu_user_annotation",
    "gpu_user_Annotation": "gpu_user_annotation",
}
"""Category of PyTorch 1.8 / 1.9 traces -> today's."""


def modern_category(cat: str | None) -> str | None:
    """Today's name of a trace category (the name itself when it is not a historical one)."""
    return LEGACY_CATEGORIES.get(cat, cat) if cat is not None else None
