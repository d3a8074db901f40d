"""Synthetic multi-rank GPU Kineto traces in the new Kineto format, without torch.

``write_gpu_run`` writes ``rank<R>.trace.json.gz`` files that look like what the PyTorch profiler
writes for an NCCL sequence-recommendation job: ``ProfilerStep#N`` ranges, nested ``aten::*``
cpu_ops, ``cudaLaunchKernel`` calls with ``ac2g`` flows to kernels on a compute stream, memcpy and
memset, and per step one embedding all-to-all-v and one gradient all-reduce as NCCL kernels on a
communication stream with the full collective args (``Seq``, split sizes, uint64 ``Comms Id``).

When each event happens is :mod:`fsobs.simulate._synthetic_timing` (the step picture, the
straggler); here the times become text through :mod:`fsobs.simulate.kineto_writer`, each rank's
file rendered and streamed to disk on its own (in parallel processes).

From the command line: ``python benchmarks/gen_synthetic.py OUT --ranks 8 --steps 5 --mb 100``.
"""

from __future__ import annotations

import gzip as _gzip
import io
import multiprocessing
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from fsobs.runformat.names import trace_file_name
from fsobs.simulate._kineto_ops import COMM_STREAM, COMPUTE_STREAM
from fsobs.simulate._synthetic_timing import (
    ALL_REDUCE_NELEMS,
    EMBEDDING_DIM,
    START_NS,
    RunSchedule,
    StepLayout,
    SyntheticRunConfig,
    plan_step,
    schedule_run,
    split_rows,
)
from fsobs.simulate.kineto_writer import (
    KINETO,
    EventRenderer,
    footer,
    header,
    host_name,
    process_group,
)

__all__ = ["SyntheticRunConfig", "kernels_for_size", "write_gpu_run"]

_BASE_UNIT_NS = 7_889_238 * 10**9  # Kineto floors baseTimeNanoseconds to this unit
BASE_NS = START_NS // _BASE_UNIT_NS * _BASE_UNIT_NS


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
    rows = split_rows(cfg, step)
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
    cfg: SyntheticRunConfig, rank: int, step: int, lay: StepLayout, out: EventRenderer
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
    cfg: SyntheticRunConfig, rank: int, step: int, lay: StepLayout, out: EventRenderer
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
    environment = [
        ("record_shapes", "0"),
        ("profile_memory", "0"),
        ("with_stack", "0"),
        ("cupti_version", "24"),
        ("cuda_runtime_version", "12040"),
        ("cuda_driver_version", "12040"),
    ]
    return header(
        KINETO,
        rank=rank,
        world_size=cfg.num_ranks,
        groups=[process_group("0", "default_pg", cfg.num_ranks)],
        devices=f"[\n{devices}\n  ]",
        host=host_name(rank, cfg.ranks_per_host),
        environment=environment,
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
    end, ops = end_ns + 50_000, '"Op count": 0'
    meta += [
        out.span("Trace", "PyTorch Profiler (0)", "Spans", "PyTorch Profiler", begin, end, ops),
        out.instant("Iteration Start: PyTorch Profiler", "Traces", "Trace PyTorch Profiler", begin),
        out.instant("Record Window End", "", "", end),
    ]
    return ",\n".join(meta)


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
    cfg: SyntheticRunConfig, sched: RunSchedule, rank: int, path: Path, use_gzip: bool
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
            lay = StepLayout(
                plan_step(cfg, rank, s, float(sched.loads[s, rank])), int(sched.t0[s, rank])
            )
            lay.after_all_to_all(int(sched.a2a_end[s]))
            lay.after_all_reduce(int(sched.ar_end[s]))
            assert lay.step_end + 1_000 == sched.t0[s + 1, rank], "schedule and layout disagree"
            put(",\n".join(_render_step(cfg, rank, s, lay, out)) + ",\n")
        put(_trailer_events(cfg, rank, int(sched.t0[-1, rank]), out))
        put(footer(KINETO, BASE_NS, trace_name=str(path)))
    tmp.replace(path)
    return size


def _bytes_per_step(cfg: SyntheticRunConfig, kernels: int) -> int:
    """Uncompressed size of one rendered step with ``kernels`` compute kernels (ids mid-trace)."""
    cfg = replace(cfg, kernels_per_step=kernels, num_steps=1)
    lay = StepLayout(plan_step(cfg, 0, 0, 1.0), START_NS)
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
    paths = [out / trace_file_name(r, gzip=gzip) for r in range(num_ranks)]
    sched = schedule_run(cfg)
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
