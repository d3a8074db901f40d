"""Hand-built Kineto traces for tests: small, explicit, exact."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

BASE_NS = 1_790_000_000_000_000_000
MAIN_TID = 100


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
