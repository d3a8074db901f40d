"""Hand-built Kineto traces for tests: small, explicit, exact.

Events (``x``, ``kernel``, ``launch``, ``step``, ``thread_name``; on GPU ranks ``gemm``,
``allreduce``, ``memcpy``; on gloo ranks ``cpu_op``, ``gloo``), one rank's document (``trace``;
``gpu_doc``, ``cpu_doc`` for the usual layouts), files (``write``, ``write_ranks``,
``write_allreduce_run``) and :data:`REFERENCE`, the committed reference traces.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

REFERENCE = Path(__file__).resolve().parents[2] / "traces" / "reference"
BASE_NS = 1_790_000_000_000_000_000
MAIN_TID = 100
GLOO_TID = 200
"""The gloo worker thread of the default group."""
GLOO_PG1_TID = 300
"""The gloo worker thread of a second group."""
NCCL_ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def x(
    name: str, cat: str, ts: float, dur: float, *, pid: Any = 1, tid: Any = MAIN_TID, **args: Any
) -> dict:
    """A complete ("X") event; keyword args become its ``args`` (use the Kineto key names)."""
    event = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        event["args"] = {k.replace("_", " "): v for k, v in args.items()}
    return event


def kernel(name: str, ts: float, dur: float, *, stream: int = 7, corr: int, **args: Any) -> dict:
    event = x(name, "kernel", ts, dur, pid=0, tid=stream, **args)
    event["args"] = event.get("args", {}) | {"stream": stream, "correlation": corr, "device": 0}
    return event


def launch(ts: float, corr: int, *, dur: float = 2.0, tid: Any = MAIN_TID) -> dict:
    event = x("cudaLaunchKernel", "cuda_runtime", ts, dur, tid=tid)
    event["args"] = {"correlation": corr}
    return event


def step(n: int, ts: float, dur: float, *, tid: Any = MAIN_TID) -> dict:
    return x(f"ProfilerStep#{n}", "user_annotation", ts, dur, tid=tid)


def thread_name(tid: Any, name: str, pid: Any = 1) -> dict:
    return {
        "ph": "M",
        "name": "thread_name",
        "pid": pid,
        "tid": tid,
        "ts": 0,
        "args": {"name": name},
    }


def trace(
    events: list[dict],
    *,
    rank: int | None = 0,
    world_size: int | None = 1,
    base_ns: int | None = BASE_NS,
    backend: str = "nccl",
    host: str = "host-a",
    **extra: Any,
) -> dict:
    doc: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": [], "host_name": host}
    if rank is not None:
        doc["distributedInfo"] = {"backend": backend, "rank": rank, "world_size": world_size}
    if base_ns is not None:
        doc["baseTimeNanoseconds"] = base_ns
    doc["traceEvents"] = events
    doc.update(extra)
    return doc


def write(path: Path, doc: dict) -> Path:
    text = json.dumps(doc).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text) if path.name.endswith(".gz") else text)
    return path


def write_ranks(run_dir: Path, docs: list[dict]) -> Path:
    """Each doc as ``rank<R>.json`` (R from its ``distributedInfo``); returns ``run_dir``."""
    for doc in docs:
        write(run_dir / f"rank{doc['distributedInfo']['rank']}.json", doc)
    return run_dir


# ----------------------------------------------------------------------------- GPU ranks


def gemm(ts: float, dur: float, *, name: str = "gemm", stream: int = 7, corr: int = -1) -> dict:
    return kernel(name, ts, dur, stream=stream, corr=corr)


def allreduce(
    ts: float,
    dur: float,
    seq: int,
    *,
    pg: str = "0",
    nelems: int = 1024,
    stream: int = 20,
    corr: int = -1,
    **args: Any,
) -> dict:
    """An NCCL all_reduce kernel with the collective args Kineto records (``Seq`` = ``seq``)."""
    return kernel(
        NCCL_ALLREDUCE,
        ts,
        dur,
        stream=stream,
        corr=corr,
        Collective_name="allreduce",
        Process_Group_Name=pg,
        Seq=seq,
        In_msg_nelems=nelems,
        dtype="Float",
        **args,
    )


def memcpy(ts: float, dur: float, *, stream: int) -> dict:
    name = "Memcpy HtoD (Pageable -> Device)"
    return x(name, "gpu_memcpy", ts, dur, pid=0, tid=stream, stream=stream, correlation=-1)


def gpu_doc(
    rank: int,
    steps: dict[int, tuple[float, float]],
    work: list[tuple[int, dict]],
    *,
    world_size: int = 2,
    host: str = "host-a",
    shift: float = 0,
) -> dict:
    """One GPU rank: ``steps`` maps n -> (start, dur) of ProfilerStep#n on the CPU; every
    ``(n, event)`` of ``work`` gets a cudaLaunchKernel inside step n (1 µs apart from the step's
    start) with a fresh correlation id. ``shift`` is added to every timestamp."""
    events = [step(n, ts, dur) for n, (ts, dur) in steps.items()]
    launched = dict.fromkeys(steps, 0)
    for corr, (n, event) in enumerate(work, start=1):
        launched[n] += 1
        events.append(launch(steps[n][0] + launched[n], corr, dur=0.5))
        event["args"]["correlation"] = corr
        events.append(event)
    for event in events:
        event["ts"] += shift
    return trace(events, rank=rank, world_size=world_size, host=host)


def write_allreduce_run(
    run_dir: Path,
    compute_us: list[tuple[float, float]],
    *,
    lengths: list[tuple[list[int], list[int]]] | None = None,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Two GPU ranks; in step n (ProfilerStep#n, n = 1, 2, ...) rank r computes
    ``compute_us[n-1][r]`` µs, then both meet in an all_reduce that lasts 20 µs after the last
    arrival. With M = max over the ranks, the step starts at T::

        t (µs)   T+10        T+10+c_r     T+10+M     T+30+M           T+60+M = next T+10
        rank r   |=====c_r=====|~~~wait~~~~|xxxxxxxxxx|    (host idle)   |
                 <------------------------ window: M + 50 ------------->

    busy = c_r, straggler_wait = M - c_r, exposed_comm = 20, host_idle = 30, so bubble =
    M + 50 - c_r; the last step's window ends with its all_reduce (no host idle: M + 20 - c_r).
    ``lengths`` (per step, per rank) become the step sidecars; ``meta`` the run.json.
    """
    docs: list[list[dict]] = [[], []]
    start = 0.0
    for n, costs in enumerate(compute_us, start=1):
        last = max(costs)
        for rank, cost in enumerate(costs):
            docs[rank] += [
                step(n, start, last + 50),
                launch(start + 1, 2 * n, dur=0.5),
                launch(start + 2, 2 * n + 1, dur=0.5),
                gemm(start + 10, cost, corr=2 * n),
                allreduce(start + 10 + cost, last - cost + 20, n, corr=2 * n + 1),
            ]
        start += last + 50
    for rank, events in enumerate(docs):
        write(run_dir / f"rank{rank}.trace.json", trace(events, rank=rank, world_size=2))
    for rank in range(2):
        records = [
            json.dumps({"step": n, "num_samples": len(ls[rank]), "seq_lengths": ls[rank]})
            for n, ls in enumerate(lengths or [], start=1)
        ]
        if records:
            (run_dir / f"steps.rank{rank}.jsonl").write_text("\n".join(records) + "\n")
    if meta is not None:
        (run_dir / "run.json").write_text(json.dumps(meta))
    return run_dir


# ----------------------------------------------------------------------------- gloo ranks


def cpu_op(name: str, ts: float, dur: float) -> dict:
    return x(name, "cpu_op", ts, dur)


def gloo(coll: str, ts: float, dur: float, tid: int = GLOO_TID) -> dict:
    """The ``gloo:<coll>`` range on a gloo worker thread."""
    return x(f"gloo:{coll}", "user_annotation", ts, dur, tid=tid)


def cpu_doc(
    rank: int,
    events: list[dict],
    *,
    world_size: int = 2,
    steps: tuple[tuple[int, float, float], ...] = ((1, 0, 100),),
) -> dict:
    """A gloo rank: the ProfilerSteps ``(n, start, dur)`` and ``events`` on the main thread
    (gloo events carry their own tid)."""
    marks = [step(n, ts, dur) for n, ts, dur in steps]
    names = [thread_name(GLOO_TID, "pt_gloo_runloop"), thread_name(GLOO_PG1_TID, "pt_gloo_runloop")]
    return trace([*names, *marks, *events], rank=rank, world_size=world_size, backend="gloo")
