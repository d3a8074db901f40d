"""Event classification: what each Kineto event is (DESIGN §4).

``kind`` is decided from the category and the name alone, once per distinct (cat, name) pair:

=============  ===========================================================================
kind           events
=============  ===========================================================================
step           ``ProfilerStep#N`` ranges (user_annotation, or cpu_op in very old traces)
comm           GPU: NCCL/RCCL kernels (``ncclKernel_*``, ``ncclDevKernel_*``, ``rccl*``) and
               peer-to-peer copy-engine memcpys (``Memcpy PtoP``).
               CPU: ``gloo:*`` annotations, which the gloo worker threads record around the
               whole collective, wait for the peers included
memcpy         ``gpu_memcpy`` events and ``Memcpy*`` kernels
memset         ``gpu_memset`` events and ``Memset*`` kernels
sync           ``cuda_sync`` (Stream / Event / Context Sync)
runtime        host-side launches: CUDA/HIP runtime and driver calls, and the ``c10d::*`` and
               ``record_param_comms`` ops that only enqueue a collective
annotation     other user annotations (``## forward ##``, ``nccl:all_reduce``), their GPU
               projections, and ``python_function`` frames
compute        any other GPU kernel; any other ``cpu_op``
other          everything else
=============  ===========================================================================
"""

from __future__ import annotations

import re

STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d+)")
COMM_KERNEL_RE = re.compile(r"^(void )?(nccl|rccl|hccl)|ncclKernel|ncclDevKernel", re.IGNORECASE)
MEMCPY_KERNEL_RE = re.compile(r"^(hip)?Memcpy")
MEMSET_KERNEL_RE = re.compile(r"^(hip)?Memset")

GPU_CATS = frozenset(
    {"kernel", "Kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync"}
)
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver", "runtime"})
ANNOTATION_CATS = frozenset({"user_annotation", "gpu_user_annotation", "python_function"})


def classify(cat: str | None, name: str) -> str:
    """Return the ``kind`` of an event with category ``cat`` and name ``name``."""
    if cat is None:
        return "other"
    if cat in ("user_annotation", "cpu_op") and STEP_RE.match(name):
        return "step"
    if cat in ("kernel", "Kernel"):
        if COMM_KERNEL_RE.search(name):
            return "comm"
        if MEMCPY_KERNEL_RE.match(name):
            return "memcpy"
        if MEMSET_KERNEL_RE.match(name):
            return "memset"
        return "compute"
    if cat == "gpu_memcpy":
        return "comm" if "PtoP" in name else "memcpy"
    if cat == "gpu_memset":
        return "memset"
    if cat == "cuda_sync":
        return "sync"
    if cat in RUNTIME_CATS:
        return "runtime"
    if cat == "user_annotation" and name.startswith("gloo:"):
        return "comm"
    if cat in ANNOTATION_CATS:
        return "annotation"
    if cat == "cpu_op":
        if name.startswith("c10d::") or name == "record_param_comms":
            return "runtime"
        return "compute"
    return "other"


def is_device_cat(cat: str | None) -> bool:
    return cat in GPU_CATS


def step_number(name: str) -> int:
    match = STEP_RE.match(name)
    return int(match.group(1)) if match else -1


# ---------------------------------------------------------------- collective names and sizes

_COLL_ALIASES = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather",
    "all_gather": "all_gather",
    "_allgather_base": "all_gather",
    "allgather_base": "all_gather",
    "_all_gather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "alltoall": "all_to_all",
    "all_to_all": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_allv": "all_to_allv",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "barrier": "barrier",
    "send": "send",
    "recv": "recv",
    "gather": "gather",
    "scatter": "scatter",
    "sparse_all_reduce": "all_reduce",
}

_KERNEL_COLLS = (
    ("AllReduce", "all_reduce"),
    ("AllGather", "all_gather"),
    ("ReduceScatter", "reduce_scatter"),
    ("SendRecv", "sendrecv"),
    ("AllToAll", "all_to_all"),
    ("Broadcast", "broadcast"),
    ("Reduce", "reduce"),
    ("Send", "send"),
    ("Recv", "recv"),
)


def normalize_collective(name: str) -> str:
    """Canonical collective name for a ``Collective name`` arg or an annotation suffix."""
    key = name.strip().lower()
    return _COLL_ALIASES.get(key, key)


def collective_from_annotation(name: str) -> str | None:
    """``nccl:all_to_all`` / ``gloo:all_reduce`` -> ``all_to_all`` / ``all_reduce``."""
    prefix, sep, rest = name.partition(":")
    if not sep or prefix not in ("nccl", "gloo", "rccl"):
        return None
    return normalize_collective(rest)


def collective_from_c10d(name: str) -> str | None:
    """``c10d::allreduce_`` (the op that enqueues a collective) -> ``all_reduce``."""
    if not name.startswith("c10d::"):
        return None
    return normalize_collective(name.removeprefix("c10d::").strip("_"))


def collective_from_kernel(name: str) -> str:
    """Collective of an NCCL kernel from its name alone (``unknown`` for ``*_Generic``)."""
    body = name.removeprefix("void ")
    for key, coll in _KERNEL_COLLS:
        if f"_{key}" in body:
            return coll
    return "unknown"


_DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "double": 8,
    "float64": 8,
    "half": 2,
    "c10::half": 2,
    "float16": 2,
    "bfloat16": 2,
    "c10::bfloat16": 2,
    "byte": 1,
    "char": 1,
    "unsigned char": 1,
    "signed char": 1,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "short": 2,
    "int16": 2,
    "int": 4,
    "int32": 4,
    "long": 8,
    "long int": 8,
    "int64": 8,
    "c10::float8_e4m3fn": 1,
    "c10::float8_e5m2": 1,
}


def dtype_bytes(dtype: str | None) -> int:
    """Bytes per element of a trace dtype string, -1 when unknown."""
    if not dtype:
        return -1
    return _DTYPE_BYTES.get(dtype.strip().lower(), -1)
