"""Synthetic multi-rank GPU Kineto traces in the new Kineto format, without torch.

``write_gpu_run`` writes ``rank<R>.trace.json.gz`` files that look like what the PyTorch profiler
writes for an NCCL sequence-recommendation job: ``ProfilerStep#N`` ranges, nested ``aten::*``
cpu_ops, ``cudaLaunchKernel`` calls with ``ac2g`` flows to kernels on a compute stream, memcpy and
memset, and per step one embedding all-to-all-v and one gradient all-reduce as NCCL kernels on a
communication stream with the full collective args (``Seq``, split sizes, uint64 ``Comms Id``).

Each step of each rank runs::

    main      |DataLoader| HtoD, embedding ops, all_to_all, dense forward |        | optimizer, item
    autograd                                                  | backward, all_reduce |
    stream 7    |copy|==sparse==|          |==dense fwd + bwd==|          |=optim=|copy|
    stream 20                   |==a2a=====|                   |==ar=====|
                                ^ arrival  ^ same end on all ranks

Compute time per rank and step follows a seeded heavy-tailed load (a per-rank Pareto factor times
per-step noise), so one rank is the straggler: on the other ranks the NCCL kernels start earlier
and last longer, and the collectives end at (almost) the same time on every rank. Times are exact
integer nanoseconds internally; the schedule is computed for all ranks first (cheap, no text), then
each rank's file is rendered and streamed to disk on its own (in parallel processes).

Run ``python -m fsobs.simulate.synthetic_kineto OUT --ranks 8 --steps 5 --mb 100``.
"""

from __future__ import annotations

import argparse
import gzip as _gzip
import io
import json
import multiprocessing
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from fsobs.simulate._kineto_ops import (
    ALL_REDUCE,
    ALL_TO_ALL,
    BACKWARD_OPS,
    COMM_STREAM,
    COMPUTE_STREAM,
    DENSE_OPS,
    GRAD_ZERO,
    INPUT_COPY,
    LOSS_READ,
    OPTIMIZER_OPS,
    SPARSE_OPS,
    EventRenderer,
    GpuOp,
    us,
)

START_NS = 1_767_225_600_123_456_789  # 2026-01-01T00:00:00.123Z: where every synthetic run starts
_BASE_UNIT_NS = 7_889_238 * 10**9  # Kineto floors baseTimeNanoseconds to this unit
BASE_NS = START_NS // _BASE_UNIT_NS * _BASE_UNIT_NS
EMBEDDING_DIM = 64
ALL_REDUCE_NELEMS = 8_388_608  # 32 MiB of float gradients
_NCCL_LATENCY_NS = 30_000


@dataclass(kw_only=True, frozen=True)
class SyntheticRunConfig:
    """Shape of a synthetic run."""

    num_ranks: int
    num_steps: int
    kernels_per_step: int = 400
    """Compute kernels per step and rank (plus 3 copies and 2 NCCL kernels)."""
    seed: int = 0
    ranks_per_host: int = 8
    first_step: int = 10
    """Number of the first ``ProfilerStep#N``."""
    imbalance: float = 0.5
    """Scale of the per-rank Pareto load factor (0: balanced ranks)."""
    a2a_gbps: float = 40.0
    all_reduce_gbps: float = 80.0

    def __post_init__(self) -> None:
        for name in ("num_ranks", "num_steps", "ranks_per_host"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.kernels_per_step < 5:
            raise ValueError("kernels_per_step must be >= 5")
        if self.imbalance < 0:
            raise ValueError("imbalance must be >= 0")


@dataclass
class _StepPlan:
    """What one rank does in one step: the ops in host order and their random costs (ns)."""

    ops: list[GpuOp]
    thread: np.ndarray  # 0: main thread, 1: autograd thread
    i_a2a: int
    i_dense_end: int  # index of the last dense-forward op
    i_ar: int
    gpu_ns: np.ndarray
    gpu_gap_ns: np.ndarray
    cpu_gap_ns: np.ndarray
    pre_ns: np.ndarray  # per nesting level, before the launch
    post_ns: np.ndarray  # per nesting level, after the launch
    launch_ns: np.ndarray
    dataloader_ns: int
    end_jitter_ns: tuple[int, int]  # how much later than the global end each collective ends here


def _plan(cfg: SyntheticRunConfig, rank: int, step: int, load: float) -> _StepPlan:
    """Deterministic in (seed, rank, step): the schedule pass and the writing pass agree."""
    rng = np.random.default_rng([cfg.seed, rank, step])
    n = cfg.kernels_per_step
    n_sparse, n_dense, n_opt = max(1, n // 5), max(1, 3 * n // 10), max(1, n // 10)
    n_bwd = n - n_sparse - n_dense - n_opt

    def pick(pool: tuple[GpuOp, ...], k: int) -> list[GpuOp]:
        return [pool[i] for i in rng.integers(len(pool), size=k).tolist()]

    ops = [INPUT_COPY, *pick(SPARSE_OPS, n_sparse), ALL_TO_ALL, *pick(DENSE_OPS, n_dense)]
    i_a2a, i_dense_end = 1 + n_sparse, 1 + n_sparse + n_dense
    ops += [GRAD_ZERO, *pick(BACKWARD_OPS, n_bwd), ALL_REDUCE, *pick(OPTIMIZER_OPS, n_opt)]
    ops.append(LOSS_READ)
    i_ar = len(ops) - n_opt - 2
    size = len(ops)
    thread = np.zeros(size, dtype=np.int8)
    thread[i_dense_end + 1 : i_ar + 1] = 1
    scale = np.ones(size)
    scale[1:i_ar] = load  # sequence-length dependent work: embeddings, forward, backward
    mean_ns = np.array([op.mean_us for op in ops]) * 1000.0
    gpu_ns = (mean_ns * scale * rng.lognormal(0.0, 0.3, size)).astype(np.int64)
    gpu_ns[[i_a2a, i_ar]] = 0  # set by the collective's global end
    return _StepPlan(
        ops=ops,
        thread=thread,
        i_a2a=i_a2a,
        i_dense_end=i_dense_end,
        i_ar=i_ar,
        gpu_ns=gpu_ns,
        gpu_gap_ns=rng.integers(1_000, 3_000, size),
        cpu_gap_ns=rng.integers(2_000, 12_000, size),
        pre_ns=rng.integers(800, 2_500, size),
        post_ns=rng.integers(400, 1_500, size),
        launch_ns=rng.lognormal(np.log(4_000), 0.35, size).astype(np.int64) + 1_000,
        dataloader_ns=int(rng.integers(150_000, 400_000)),
        end_jitter_ns=(int(rng.integers(0, 2_000)), int(rng.integers(0, 2_000))),
    )


def _serial(ready: np.ndarray, dur: np.ndarray, gap: np.ndarray, free_at: int) -> np.ndarray:
    """Starts of activities run in order on one stream.

    ``start_i = max(ready_i, end_{i-1} + gap_i)`` with ``end_{-1} = free_at``, in closed form:
    with ``P_i = sum(gap[:i+1]) + sum(dur[:i])``, ``start_i = P_i + max_{j<=i}(ready_j - P_j)``.
    """
    ready = ready.copy()
    ready[0] = max(int(ready[0]), free_at + int(gap[0]))
    offset = np.cumsum(gap)
    offset[1:] += np.cumsum(dur[:-1])
    return offset + np.maximum.accumulate(ready - offset)


class _StepLayout:
    """Absolute times (ns) of one rank's step, fixed in three stages around the two collectives.

    ``__init__`` places the host side and the GPU work up to the all-to-all (``a2a_arrival``);
    ``after_all_to_all`` the work up to the all-reduce (``ar_arrival``); ``after_all_reduce`` the
    rest, which fixes ``step_end`` (the host blocks on the final device-to-host copy).
    """

    def __init__(self, plan: _StepPlan, t0: int) -> None:
        self.plan, self.t0 = plan, t0
        depth = np.array([len(op.chain) for op in plan.ops], dtype=np.int64)
        self.depth = depth
        cost = depth * (plan.pre_ns + plan.post_ns) + plan.launch_ns + plan.cpu_gap_ns
        self.start = t0 + plan.dataloader_ns + np.concatenate(([0], np.cumsum(cost[:-1])))
        self.launch_start = self.start + depth * plan.pre_ns
        self.launch_end = self.launch_start + plan.launch_ns
        self.gpu_start = np.zeros(len(plan.ops), dtype=np.int64)
        self.gpu_end = np.zeros(len(plan.ops), dtype=np.int64)
        self._place(0, plan.i_a2a, free_at=t0, after=t0)
        self.a2a_arrival = max(int(self.launch_end[plan.i_a2a]), int(self.gpu_end[plan.i_a2a - 1]))
        self.ar_arrival = self.step_end = -1

    def _place(self, lo: int, hi: int, *, free_at: int, after: int) -> None:
        """Run ops ``lo..hi-1`` on the compute stream, the first no earlier than ``after``."""
        ready = self.launch_end[lo:hi].copy()
        ready[0] = max(int(ready[0]), after)
        dur = self.plan.gpu_ns[lo:hi]
        self.gpu_start[lo:hi] = _serial(ready, dur, self.plan.gpu_gap_ns[lo:hi], free_at)
        self.gpu_end[lo:hi] = self.gpu_start[lo:hi] + dur

    def after_all_to_all(self, global_end: int) -> None:
        plan, i = self.plan, self.plan.i_a2a
        self.gpu_start[i], self.gpu_end[i] = self.a2a_arrival, global_end + plan.end_jitter_ns[0]
        self._place(i + 1, plan.i_ar, free_at=int(self.gpu_end[i - 1]), after=int(self.gpu_end[i]))
        self.ar_arrival = max(int(self.launch_end[plan.i_ar]), int(self.gpu_end[plan.i_ar - 1]))

    def after_all_reduce(self, global_end: int) -> None:
        plan, i = self.plan, self.plan.i_ar
        self.gpu_start[i], self.gpu_end[i] = self.ar_arrival, global_end + plan.end_jitter_ns[1]
        last = len(plan.ops)
        self._place(i + 1, last, free_at=int(self.gpu_end[i - 1]), after=int(self.gpu_end[i]))
        # .item(): the host returns from the device-to-host copy only once it has finished
        blocked = int(self.gpu_end[-1]) + 2_000 - int(self.launch_start[-1])
        self.launch_end[-1] = self.launch_start[-1] + max(int(plan.launch_ns[-1]), blocked)
        self.step_end = int(self.launch_end[-1] + self.depth[-1] * plan.post_ns[-1]) + 3_000

    def item_end(self, i: int) -> int:
        return int(self.launch_end[i] + self.depth[i] * self.plan.post_ns[i])


@dataclass(frozen=True)
class _Schedule:
    """The run-wide times every rank's file needs: step starts and collective end times."""

    loads: np.ndarray  # [step, rank] compute load factor
    t0: np.ndarray  # [step + 1, rank] step starts (the last row: end of the last step)
    a2a_end: np.ndarray  # [step]
    ar_end: np.ndarray  # [step]


def _loads(cfg: SyntheticRunConfig) -> np.ndarray:
    """Heavy-tailed per-rank load factor times mild per-step noise, shape [step, rank]."""
    rng = np.random.default_rng([cfg.seed, 7919])
    per_rank = 1.0 + cfg.imbalance * rng.pareto(2.5, cfg.num_ranks)
    return per_rank[None, :] * rng.lognormal(0.0, 0.03, (cfg.num_steps, cfg.num_ranks))


def _split_rows(cfg: SyntheticRunConfig, step: int) -> np.ndarray:
    """All-to-all-v rows sent from rank i to rank j in ``step`` (shared by all ranks)."""
    rng = np.random.default_rng([cfg.seed, 104_729, step])
    return rng.integers(1_000, 6_000, (cfg.num_ranks, cfg.num_ranks))


def _transfer_ns(cfg: SyntheticRunConfig, step: int) -> tuple[int, int]:
    """Duration of the all-to-all and the all-reduce once every rank has arrived."""
    rows = _split_rows(cfg, step)
    a2a_bytes = max(rows.sum(axis=1).max(), rows.sum(axis=0).max()) * EMBEDDING_DIM * 4
    n = cfg.num_ranks
    ar_bytes = 2 * (n - 1) / n * ALL_REDUCE_NELEMS * 4
    return (
        _NCCL_LATENCY_NS + int(a2a_bytes / cfg.a2a_gbps),
        _NCCL_LATENCY_NS + int(ar_bytes / cfg.all_reduce_gbps),
    )


def _schedule(cfg: SyntheticRunConfig) -> _Schedule:
    """Play all ranks through all steps (times only) to fix when each collective ends."""
    loads = _loads(cfg)
    t0 = np.full((cfg.num_steps + 1, cfg.num_ranks), START_NS, dtype=np.int64)
    a2a_end = np.zeros(cfg.num_steps, dtype=np.int64)
    ar_end = np.zeros(cfg.num_steps, dtype=np.int64)
    for s in range(cfg.num_steps):
        layouts = [
            _StepLayout(_plan(cfg, r, s, float(loads[s, r])), int(t0[s, r]))
            for r in range(cfg.num_ranks)
        ]
        a2a_xfer, ar_xfer = _transfer_ns(cfg, s)
        a2a_end[s] = max(lay.a2a_arrival for lay in layouts) + a2a_xfer
        for lay in layouts:
            lay.after_all_to_all(int(a2a_end[s]))
        ar_end[s] = max(lay.ar_arrival for lay in layouts) + ar_xfer
        for lay in layouts:
            lay.after_all_reduce(int(ar_end[s]))
        t0[s + 1] = [lay.step_end + 1_000 for lay in layouts]
    return _Schedule(loads=loads, t0=t0, a2a_end=a2a_end, ar_end=ar_end)


def _list_str(values: Sequence[int]) -> str:
    """A list as PyTorch writes it into comm args: a string, cut to 29 entries + the last."""
    items = [str(v) for v in values]
    if len(items) > 30:
        items = [*items[:29], "...", items[-1]]
    return "[" + ", ".join(items) + "]"


def _comms_id(seed: int, seq: int) -> int:
    """A uint64 hash (splitmix64) per collective instance; about half exceed 2**63."""
    z = (seed * 0x9E3779B97F4A7C15 + seq * 0xBF58476D1CE4E5B9 + 1) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return z ^ (z >> 31)


def _comm_args(cfg: SyntheticRunConfig, rank: int, step: int) -> tuple[str, str]:
    """Rendered collective args (kernel and record_param_comms) of the step's two collectives."""
    n = cfg.num_ranks
    rows = _split_rows(cfg, step)
    group = (
        f', "Group size": {n}, "Process Group Name": "0",'
        f' "Process Group Description": "default_pg",'
        f' "Process Group Ranks": "{_list_str(range(n))}"'
    )
    a2a_seq, ar_seq = 2 * step + 1, 2 * step + 2
    a2a = (
        f',      "Collective name": "all_to_allv", "dtype": "Float",'
        f' "In msg nelems": {int(rows[rank].sum()) * EMBEDDING_DIM},'
        f' "Out msg nelems": {int(rows[:, rank].sum()) * EMBEDDING_DIM},'
        f' "In split size": "{_list_str(rows[rank].tolist())}",'
        f' "Out split size": "{_list_str(rows[:, rank].tolist())}"{group},'
        f' "Seq": {a2a_seq}, "Comms Id": {_comms_id(cfg.seed, a2a_seq)}'
    )
    ar = (
        f',      "Collective name": "allreduce", "dtype": "Float",'
        f' "In msg nelems": {ALL_REDUCE_NELEMS}, "Out msg nelems": {ALL_REDUCE_NELEMS},'
        f' "In split size": "[]", "Out split size": "[]"{group},'
        f' "Seq": {ar_seq}, "Comms Id": {_comms_id(cfg.seed, ar_seq)}'
    )
    return a2a, ar


def _host_ids(cfg: SyntheticRunConfig, rank: int) -> tuple[int, int, int]:
    """(pid, main thread id, autograd thread id) of a rank's process."""
    pid = 200_000 + 1_031 * rank
    return pid, pid, pid + 57


def _step_annotations(
    cfg: SyntheticRunConfig, rank: int, step: int, lay: _StepLayout, out: EventRenderer
) -> list[str]:
    """The step's user annotations on the main thread: ProfilerStep, data loading, phases."""
    plan, main = lay.plan, _host_ids(cfg, rank)[1]
    last = len(plan.ops) - 1
    spans = (
        (f"ProfilerStep#{cfg.first_step + step}", lay.t0, lay.step_end),
        (
            "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
            lay.t0 + 1_000,
            lay.t0 + plan.dataloader_ns - 1_000,
        ),
        ("## forward ##", int(lay.start[1]) - 1_000, lay.item_end(plan.i_dense_end) + 1_000),
        (
            "Optimizer.step#SGD.step",
            int(lay.start[plan.i_ar + 1]) - 1_000,
            lay.item_end(last - 1) + 1_000,
        ),
    )
    return [out.host_range("user_annotation", name, main, a, b) for name, a, b in spans]


def _render_step(
    cfg: SyntheticRunConfig, rank: int, step: int, lay: _StepLayout, out: EventRenderer
) -> list[str]:
    """All events of one step of one rank: host events first, then device events."""
    plan = lay.plan
    tids = _host_ids(cfg, rank)[1:]
    a2a_args, ar_args = _comm_args(cfg, rank, step)
    rank_extra = f', "Rank": {rank}, "Global rank start": 0, "Global rank stride": 1'
    comm = {plan.i_a2a: a2a_args, plan.i_ar: ar_args}
    host = _step_annotations(cfg, rank, step, lay, out)
    device: list[str] = []
    start, pre, post = lay.start.tolist(), plan.pre_ns.tolist(), plan.post_ns.tolist()
    l_start, l_end = lay.launch_start.tolist(), lay.launch_end.tolist()
    g_start, g_end = lay.gpu_start.tolist(), lay.gpu_end.tolist()
    threads = plan.thread.tolist()
    for i, op in enumerate(plan.ops):
        tid, depth, extra = tids[threads[i]], len(op.chain), comm.get(i, "")
        for k, (cat, name) in enumerate(op.chain):
            args = extra + rank_extra if name == "record_param_comms" else ""
            ts, end = start[i] + k * pre[i], l_end[i] + (depth - k) * post[i]
            host.append(out.host_range(cat, name, tid, ts, end, args))
        host.extend(out.launch(op, tid, l_start[i], l_end[i]))
        stream = COMM_STREAM if extra else COMPUTE_STREAM
        device.extend(
            out.device_event(op, stream, g_start[i], g_end[i], out.ext_id, out.corr, extra)
        )
    return host + device


def _header(cfg: SyntheticRunConfig, rank: int) -> str:
    """Everything before the first event: device properties, distributedInfo, environment."""
    gpu = (
        '"name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 84929216512,\n'
        '      "computeMajor": 9, "computeMinor": 0,\n'
        '      "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,\n'
        '      "regsPerBlock": 65536, "warpSize": 32,\n'
        '      "sharedMemPerBlock": 49152, "numSms": 132\n'
        '    , "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 232448,'
        ' "sharedMemPerMultiprocessor": 233472'
    )
    devices = ",\n".join(
        f'    {{\n      "id": {d}, {gpu}\n    }}'
        for d in range(min(cfg.ranks_per_host, cfg.num_ranks))
    )
    ranks = list(range(cfg.num_ranks))
    pg = {
        "pg_name": "0",
        "pg_desc": "default_pg",
        "backend_config": "cuda:nccl",
        "pg_size": cfg.num_ranks,
        "ranks": ranks,
    }
    info = {
        "backend": "nccl",
        "rank": rank,
        "world_size": cfg.num_ranks,
        "pg_count": 1,
        "pg_config": [pg],
        "nccl_version": "2.21.5",
    }
    return (
        '{\n  "schemaVersion": 1,\n  "deviceProperties": [\n'
        f"{devices}\n  ],\n"
        f'  "distributedInfo": {json.dumps(info)},\n'
        '  "record_shapes": 0,\n  "profile_memory": 0,\n  "with_stack": 0,\n'
        '  "cupti_version": 24,\n  "cuda_runtime_version": 12040,\n'
        '  "cuda_driver_version": 12040,\n'
        f'  "host_name": "sim-node{rank // cfg.ranks_per_host}",\n'
        '  "traceEvents": [\n'
    )


def _trailer_events(cfg: SyntheticRunConfig, rank: int, end_ns: int, out: EventRenderer) -> str:
    """Profiler span, instants and process/thread metadata, written after the steps."""
    pid, main, autograd = _host_ids(cfg, rank)
    dev, begin = out.device, START_NS - 50_000
    meta = [
        out.metadata("process_name", pid, 0, begin, '"name": "python3.11"'),
        out.metadata("process_labels", pid, 0, begin, f'"labels": "rank {rank}"'),
        out.metadata("thread_name", pid, main, begin, f'"name": "thread {main} (pt_main_thread)"'),
        out.metadata(
            "thread_name", pid, autograd, begin, f'"name": "thread {autograd} (pt_autograd_0)"'
        ),
        out.metadata("process_name", dev, 0, begin, f'"name": "GPU {dev}"'),
        out.metadata("process_labels", dev, 0, begin, f'"labels": "GPU {dev}"'),
    ]
    for stream in (COMPUTE_STREAM, COMM_STREAM):
        meta.append(out.metadata("thread_name", dev, stream, begin, f'"name": "stream {stream} "'))
    span = us(end_ns + 50_000 - begin)
    meta += [
        f'  {{\n    "ph": "X", "cat": "Trace", "ts": {us(begin - BASE_NS)}, "dur": {span},\n'
        '    "pid": "Spans", "tid": "PyTorch Profiler",\n    "name": "PyTorch Profiler (0)",\n'
        '    "args": {\n      "Op count": 0\n    }\n  }',
        '  {\n    "name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g",\n'
        f'    "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": {us(begin - BASE_NS)}\n  }}',
        '  {\n    "name": "Record Window End", "ph": "i", "s": "g",\n'
        f'    "pid": "", "tid": "", "ts": {us(end_ns + 50_000 - BASE_NS)}\n  }}',
    ]
    return ",\n".join(meta)


def _footer(path: Path) -> str:
    return (
        f'\n  ],\n  "traceName": "{path}",\n  "displayTimeUnit": "ms",\n'
        f'  "baseTimeNanoseconds": {BASE_NS}\n}}\n'
    )


@contextmanager
def _open(path: Path, use_gzip: bool) -> Iterator[io.BufferedIOBase]:
    """A binary file, gzip level 1 when asked (no name or time in the header: reproducible)."""
    with open(path, "wb") as raw:
        if not use_gzip:
            yield raw
            return
        with _gzip.GzipFile(filename="", mode="wb", compresslevel=1, fileobj=raw, mtime=0) as gz:
            yield gz


def _write_rank(
    cfg: SyntheticRunConfig, sched: _Schedule, rank: int, path: Path, use_gzip: bool
) -> int:
    """Render and stream one rank's trace to ``path`` (atomically); returns uncompressed bytes."""
    pid = _host_ids(cfg, rank)[0]
    out = EventRenderer(pid=pid, device=rank % cfg.ranks_per_host, base_ns=BASE_NS)
    tmp = path.with_name(path.name + ".tmp")
    size = 0
    with _open(tmp, use_gzip) as fh:

        def put(text: str) -> None:
            nonlocal size
            data = text.encode()
            size += len(data)
            fh.write(data)

        put(_header(cfg, rank))
        for s in range(cfg.num_steps):
            lay = _StepLayout(
                _plan(cfg, rank, s, float(sched.loads[s, rank])), int(sched.t0[s, rank])
            )
            lay.after_all_to_all(int(sched.a2a_end[s]))
            lay.after_all_reduce(int(sched.ar_end[s]))
            assert lay.step_end + 1_000 == sched.t0[s + 1, rank], "schedule and layout disagree"
            put(",\n".join(_render_step(cfg, rank, s, lay, out)) + ",\n")
        put(_trailer_events(cfg, rank, int(sched.t0[-1, rank]), out))
        put(_footer(path))
    tmp.replace(path)
    return size


def _bytes_per_step(cfg: SyntheticRunConfig, kernels: int) -> int:
    """Uncompressed size of one rendered step with ``kernels`` compute kernels (ids mid-trace)."""
    cfg = replace(cfg, kernels_per_step=kernels, num_steps=1)
    lay = _StepLayout(_plan(cfg, 0, 0, 1.0), START_NS)
    lay.after_all_to_all(lay.a2a_arrival + 100_000)
    lay.after_all_reduce(lay.ar_arrival + 100_000)
    out = EventRenderer(pid=_host_ids(cfg, 0)[0], device=0, base_ns=BASE_NS)
    out.ext_id = out.ev_idx = out.corr = 10**5  # typical digit count in a big trace
    return sum(len(e) + 2 for e in _render_step(cfg, 0, 0, lay, out))


def kernels_for_size(cfg: SyntheticRunConfig, target_bytes_per_rank: int) -> int:
    """Compute kernels per step that make each rank's uncompressed JSON about the target size."""
    low, high = 100, 1_000
    b_low, b_high = _bytes_per_step(cfg, low), _bytes_per_step(cfg, high)
    per_kernel = (b_high - b_low) / (high - low)
    fixed = b_low - per_kernel * low
    overhead = len(_header(cfg, 0)) + 8_000
    per_step = (target_bytes_per_rank - overhead) / cfg.num_steps
    return max(5, round((per_step - fixed) / per_kernel))


def write_gpu_run(
    out_dir: str | Path,
    *,
    num_ranks: int,
    num_steps: int,
    kernels_per_step: int = 400,
    target_bytes_per_rank: int | None = None,
    seed: int = 0,
    gzip: bool = True,
    workers: int | None = None,
) -> list[Path]:
    """Write ``rank<R>.trace.json[.gz]`` for every rank of a synthetic NCCL run; returns the paths.

    ``target_bytes_per_rank`` (uncompressed) overrides ``kernels_per_step``. Files are gzipped at
    level 1 and written atomically; ``workers`` processes render ranks in parallel (default: one
    per CPU). The same arguments always give byte-identical files.
    """
    cfg = SyntheticRunConfig(
        num_ranks=num_ranks, num_steps=num_steps, kernels_per_step=kernels_per_step, seed=seed
    )
    if target_bytes_per_rank is not None:
        cfg = replace(cfg, kernels_per_step=kernels_for_size(cfg, target_bytes_per_rank))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    suffix = ".trace.json.gz" if gzip else ".trace.json"
    paths = [out / f"rank{r}{suffix}" for r in range(num_ranks)]
    sched = _schedule(cfg)
    workers = min(num_ranks, workers or os.cpu_count() or 1)
    if workers <= 1:
        for r, path in enumerate(paths):
            _write_rank(cfg, sched, r, path, gzip)
        return paths
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        done = [pool.submit(_write_rank, cfg, sched, r, p, gzip) for r, p in enumerate(paths)]
        for future in done:
            future.result()
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fsobs.simulate.synthetic_kineto OUT --ranks 8 --steps 5 --mb 100``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="output directory")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--mb", type=float, default=None, help="uncompressed MB per rank")
    parser.add_argument("--kernels-per-step", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-gzip", action="store_true")
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args(argv)
    target = int(args.mb * 1e6) if args.mb else None
    paths = write_gpu_run(
        args.out,
        num_ranks=args.ranks,
        num_steps=args.steps,
        kernels_per_step=args.kernels_per_step,
        target_bytes_per_rank=target,
        seed=args.seed,
        gzip=not args.no_gzip,
        workers=args.workers,
    )
    total = sum(p.stat().st_size for p in paths)
    print(f"wrote {len(paths)} traces to {args.out} ({total / 1e6:.1f} MB on disk)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
