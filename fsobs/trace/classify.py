"""Event classification: what each Kineto event is (docs/design.md §4).

``kind`` is decided from the category and the name alone, once per distinct (cat, name) pair:

=============  ===========================================================================
kind           events
=============  ===========================================================================
step           ``ProfilerStep#N`` ranges (user_annotation, or cpu_op in very old traces)
comm           GPU: kernels whose name matches :data:`COMM_KERNEL_PATTERNS` (NCCL, RCCL,
               DeepEP, NVSHMEM, ...: see there) or one of the user's own patterns
               (``LoadConfig.comm_kernels``, ``--comm-kernel``), and peer-to-peer
               copy-engine memcpys (``Memcpy PtoP``).
               CPU: ``gloo:*`` annotations, which the gloo worker threads record around the
               whole collective, wait for the peers included
memcpy         ``gpu_memcpy`` events, ``Memcpy*`` kernels and DMA requests (``dma*``, HTA's
               memory rule: MTIA's copies)
memset         ``gpu_memset`` events and ``Memset*`` kernels
sync           ``cuda_sync`` (Stream / Event / Context Sync)
runtime        host-side launches: CUDA/HIP runtime and driver calls, and the ``c10d::*`` and
               ``record_param_comms`` ops that only enqueue a collective
annotation     other user annotations (``## forward ##``, ``nccl:all_reduce``), their GPU
               projections, and ``python_function`` frames
compute        any other GPU kernel; any other ``cpu_op``
other          everything else
=============  ===========================================================================

A device kernel is a ``kernel`` event on a GPU (CUDA, ROCm) or an ``mtia_ccp_events`` one on an
MTIA (:data:`KERNEL_CATS`), whose launches are ``mtia_runtime`` calls: the same rules apply to
both ("GPU" below and in the reports means the device, whichever it is).
"""

from __future__ import annotations

import re

STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d+)")
COMM_KERNEL_PATTERNS = (
    r"^(void )?(nccl|rccl|hccl)|ncclKernel|ncclDevKernel",
    r"\b(deep_ep|dpsk::ep)::\w+::(\w*notify\w*|dispatch|combine|barrier)\b",
    r"\bEp(Dispatch|Combine)\w*Kernel",
    r"nvshmem",
    r"\bmscclpp",
    r"\bc10d::(symmetric_memory|nvshmem_extension)::",
    r"cross_device_reduce",
    r"all_?to_?all|all2all",
)
"""GPU kernels that move data between ranks, whatever launched them (regular expressions,
searched in the kernel name, case-insensitive):

1. NCCL, RCCL and HCCL: ``ncclKernel_*``, ``ncclDevKernel_*`` (also inside a namespace),
   ``rccl*``, ``hccl*``;
2. DeepEP's expert-parallel kernels: ``deep_ep::intranode::dispatch``, ``...::combine``,
   ``...::notify_dispatch``, ``...::cached_notify_combine``, ``...::barrier`` (``intranode``,
   ``internode``, ``internode_ll``), and the same kernels as DeepSeek's released training
   trace names them (``dpsk::ep::internode::dispatch``, ``...::combine``,
   ``...::notify_dispatch``, ``...::cached_notify``); not ``get_dispatch_layout``, which only
   counts locally;
3. AMD MORI's expert-parallel ``EpDispatch*Kernel`` / ``EpCombine*Kernel``;
4. NVSHMEM's device kernels (``nvshmemi_*``, ``nvshmemx_*``: one-sided puts, barriers,
   collectives);
5. MSCCL++ (``mscclpp::*``);
6. PyTorch's symmetric-memory collectives (``c10d::symmetric_memory::*``,
   ``c10d::nvshmem_extension::*``: one-/two-shot all-reduce, all_to_all_vdev, ...);
7. vLLM's custom all-reduce (``cross_device_reduce_*``);
8. any kernel named as an all-to-all (``all_to_all``, ``alltoall``, ``all2all``): custom
   all-to-alls.

A job with communication kernels of other names adds patterns of its own
(``LoadConfig.comm_kernels``, ``fsobs analyze --comm-kernel REGEX``): without them such kernels
count as compute, and their time is busy instead of communication. Kernels outside NCCL carry
no collective metadata, so they are communication that synchronises nothing known (their
collective is ``unknown``): never a straggler wait, exposed when nothing computes beside them.
"""
MEMCPY_KERNEL_RE = re.compile(r"^(hip)?Memcpy|^dma")
MEMSET_KERNEL_RE = re.compile(r"^(hip)?Memset")

GRAPH_CAPTURE_RE = re.compile(r"^(cuda|hip)(StreamBeginCapture|StreamEndCapture|GraphInstantiate)")
"""Runtime calls that build a CUDA (HIP) graph: the kernels launched while a stream captures
are recorded into the graph, not run."""
KERNEL_CATS = frozenset({"kernel", "Kernel", "mtia_ccp_events"})
"""Device kernels: CUDA's and ROCm's (``Kernel``: 2020-2021 traces), MTIA's."""
GPU_CATS = KERNEL_CATS | {"gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync"}
RUNTIME_CATS = frozenset(
    {"cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver", "mtia_runtime", "runtime"}
)
ANNOTATION_CATS = frozenset({"user_annotation", "gpu_user_annotation", "python_function"})


def comm_kernel_re(extra: tuple[str, ...] = ()) -> re.Pattern[str]:
    """One pattern for :data:`COMM_KERNEL_PATTERNS` and the user's ``extra`` patterns
    (ValueError naming ``comm_kernels`` for one that is no regular expression)."""
    for pattern in extra:
        try:
            re.compile(pattern)
        except re.error as exc:
            why = f"comm_kernels: {pattern!r} is no regular expression ({exc})"
            raise ValueError(why) from None
    return re.compile("|".join(f"(?:{p})" for p in (*COMM_KERNEL_PATTERNS, *extra)), re.IGNORECASE)


COMM_KERNEL_RE = comm_kernel_re()


def classify(cat: str | None, name: str, comm_kernel: re.Pattern[str] = COMM_KERNEL_RE) -> str:
    """Return the ``kind`` of an event with category ``cat`` and name ``name``; GPU kernels
    that ``comm_kernel`` finds in their name are communication (:func:`comm_kernel_re`)."""
    if cat is None:
        return "other"
    if cat in ("user_annotation", "cpu_op") and STEP_RE.match(name):
        return "step"
    if cat in KERNEL_CATS:
        if comm_kernel.search(name):
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


_EMBEDDING_RANGES = (
    "All2All_Pooled_",
    "Variable_Batch_All2All_Pooled_",
    "All2All_Seq_",
    "All2Allv_",
    "ReduceScatter_",
    "ReduceScatterBase_",
    "ReduceScatterV_",
    "AllGatherBase_",
    "## All2All_",
    "## Variable_Batch_All2All_",
    "## ReduceScatter",
    "## AllGatherBase_",
    "## all2all_",
    "## alltoall_",
    "## variable_batch_all2all",
    "## reduce_scatter",
    "## all_gather_base ##",
    "## KJTAllToAll",
    "## KJTList",
    "## SplitsAllToAllAwaitable",
    "## PooledEmbeddingsAwaitable",
    "## SequenceEmbeddingsAwaitable",
    "## sparse_data_dist",
    "## start_sparse_data_dist",
    "## wait_sparse_data_dist",
    "## forward:all2all",
)
_DENSE_RANGES = (
    "torch::autograd::AccumulateGrad",
    "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad",
)


def framework_role(name: str) -> str | None:
    """The role a CPU range that torchrec or DDP records itself around the issue of its
    collectives gives (by name prefix: ``_EMBEDDING_RANGES``, ``_DENSE_RANGES``), None for any
    other name: what gives a plain torchrec job (no FreeScale markers) its roles.

    - ``embedding``: torchrec's embedding communication (``torchrec.distributed.comm_ops`` and
      ``dist_data``). The autograd functions, recorded as CPU ops for the forward and the
      backward (``All2All_Pooled_Req``, ``All2All_Pooled_WaitBackward``, ``All2All_Seq_Req``,
      ``ReduceScatterBase_Req``, ``ReduceScatterBase_WaitBackward``, ...); their ranges, of
      torchrec 1.x (``## All2All_Pooled_fwd ##``, ``## All2All_Seq_bwd ##``,
      ``## ReduceScatterV_fwd ##``, ...) and of older releases (``## alltoall_fwd_single ##``,
      ``## alltoall_bwd_single ##``, ``## reduce_scatter_base ##``,
      ``## reduce_scatter_base_bw (all_gather) ##``); the input dist, i.e. the KJT all-to-alls
      (``## all2all_data:kjt splits ##``, ``... lengths ##``, ``... values ##``,
      ``## KJTAllToAll* wait() ##``, ``## KJTList* wait() ##``,
      ``## SplitsAllToAllAwaitable wait() ##``) and the pipeline's ``## sparse_data_dist ##``
      stage around them; the awaitables of the output (``## PooledEmbeddingsAwaitable wait()
      ##``, ``## SequenceEmbeddingsAwaitable wait() ##``); DLRM-style
      ``## forward:all2all_global_emb ##``.
    - ``dense``: DDP's gradient all-reduce, which its reducer issues from the hook it places on
      each parameter's gradient accumulation (``torch::autograd::AccumulateGrad``).

    The innermost such range around a collective's launch (a GPU kernel's ``cudaLaunchKernel``,
    a gloo collective's enqueue) gives its role; FreeScale's own markers and PEC's ranges,
    finer, come first (:mod:`fsobs.trace._collectives`).
    """
    if name.startswith(_EMBEDDING_RANGES):
        return "embedding"
    return "dense" if name.startswith(_DENSE_RANGES) else None


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
