"""Kineto trace text, as the simulated traces write it.

Both writers of simulated traces render through this module: :mod:`fsobs.simulate.simtrace`
(the simulator's small traces, one compact line per event) and
:mod:`fsobs.simulate.synthetic_kineto` (large traces in the layout Kineto itself writes,
``libkineto/src/output_json.cpp``: one key group per line). What they share:

- :func:`us`: integer nanoseconds as exact microseconds with three decimals;
- :func:`header` / :func:`footer`: the top-level object around ``traceEvents``
  (``schemaVersion``, ``deviceProperties``, ``distributedInfo``, ..., ``baseTimeNanoseconds``)
  in either :data:`COMPACT` or :data:`KINETO` layout;
- the events: :func:`compact_event`, and :class:`EventRenderer` for Kineto's layout.

The files' names are the run format's (:func:`fsobs.runformat.trace_file_name`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fsobs.simulate._kineto_ops import GpuOp

NCCL_VERSION = "2.21.5"


def us(ns: int) -> str:
    """Integer nanoseconds as Kineto writes times: exact microseconds with three decimals.

    ``us(1500) == "1.500"``, ``us(-1500) == "-1.500"``.
    """
    sign = "-" if ns < 0 else ""
    whole, frac = divmod(abs(ns), 1000)
    return f"{sign}{whole}.{frac:03d}"


def host_name(rank: int, ranks_per_host: int) -> str:
    """The simulated host of ``rank``: ``sim-node<K>``."""
    return f"sim-node{rank // ranks_per_host}"


def process_group(name: str, desc: str, world_size: int) -> dict[str, Any]:
    """One ``pg_config`` entry of ``distributedInfo``: an NCCL group of every rank."""
    return {
        "pg_name": name,
        "pg_desc": desc,
        "backend_config": "cuda:nccl",
        "pg_size": world_size,
        "ranks": list(range(world_size)),
    }


@dataclass(frozen=True)
class Layout:
    """How the top-level object is spaced: the simulator's compact one or Kineto's own."""

    indent: str
    colon: str
    newline: str
    separators: tuple[str, str]
    """Of ``json.dumps`` for values rendered from Python objects (``distributedInfo``)."""

    def field(self, key: str, value: str) -> str:
        return f'{self.indent}"{key}"{self.colon}{value}'


COMPACT = Layout(indent="", colon=":", newline="", separators=(",", ":"))
KINETO = Layout(indent="  ", colon=": ", newline="\n", separators=(", ", ": "))


def header(
    layout: Layout,
    *,
    rank: int,
    world_size: int,
    groups: list[dict[str, Any]],
    devices: str,
    host: str,
    environment: Sequence[tuple[str, str]] = (),
) -> str:
    """Everything before the first event; ``devices`` and the ``environment`` values are
    rendered JSON, placed as given between ``distributedInfo`` and ``host_name``."""
    info = {
        "backend": "nccl",
        "rank": rank,
        "world_size": world_size,
        "pg_count": len(groups),
        "pg_config": groups,
        "nccl_version": NCCL_VERSION,
    }
    fields = [
        ("schemaVersion", "1"),
        ("deviceProperties", devices),
        ("distributedInfo", json.dumps(info, separators=layout.separators)),
        *environment,
        ("host_name", f'"{host}"'),
    ]
    nl = layout.newline
    head = "".join(layout.field(key, value) + "," + nl for key, value in fields)
    return "{" + nl + head + layout.field("traceEvents", "[\n")


def footer(layout: Layout, base_ns: int, *, trace_name: str | None = None) -> str:
    """Everything after the last event: ``traceName`` (when given, written as is),
    ``displayTimeUnit`` and ``baseTimeNanoseconds``."""
    fields = [("traceName", f'"{trace_name}"')] if trace_name is not None else []
    fields += [("displayTimeUnit", '"ms"'), ("baseTimeNanoseconds", str(base_ns))]
    nl = layout.newline
    tail = ("," + nl).join(layout.field(key, value) for key, value in fields)
    return "\n" + layout.indent + "]," + nl + tail + nl + "}\n"


def compact_event(
    cat: str, name: str, pid: int, tid: int, ts_ns: int, dur_ns: int, args: str = ""
) -> str:
    """A complete (``X``) event on one line; ``args`` is the rendered inside of ``args``."""
    tail = f',"args":{{{args}}}}}' if args else "}"
    return (
        f'{{"ph":"X","cat":"{cat}","name":"{name}","pid":{pid},"tid":{tid},'
        f'"ts":{us(ts_ns)},"dur":{us(dur_ns)}' + tail
    )


class EventRenderer:
    """Renders one rank's events in Kineto's layout; owns the per-trace id counters
    (External id, correlation, Ev Idx). Times in are absolute ns, out relative µs."""

    def __init__(self, *, pid: int, device: int, base_ns: int) -> None:
        self.pid = pid
        self.device = device
        self.base_ns = base_ns
        self.ext_id = 0
        self.corr = 0
        self.ev_idx = 0

    def host_range(
        self, cat: str, name: str, tid: int, start: int, end: int, extra: str = ""
    ) -> str:
        """A cpu_op / user_annotation ``X`` event."""
        self.ext_id += 1
        self.ev_idx += 1
        return (
            f'  {{\n    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": {self.pid},'
            f' "tid": {tid},\n    "ts": {us(start - self.base_ns)}, "dur": {us(end - start)},\n'
            f'    "args": {{\n      "External id": {self.ext_id},'
            f'      "Record function id": {self.ext_id}, "Ev Idx": {self.ev_idx - 1}{extra}\n'
            "    }\n  }"
        )

    def launch(self, op: GpuOp, tid: int, start: int, end: int) -> list[str]:
        """The runtime call plus its ``ac2g`` flow start; takes a new correlation id."""
        self.corr += 1
        ts = us(start - self.base_ns)
        return [
            f'  {{\n    "ph": "X", "cat": "cuda_runtime", "name": "{op.launch}", "pid": {self.pid},'
            f' "tid": {tid},\n    "ts": {ts}, "dur": {us(end - start)},\n    "args": {{\n'
            f'      "External id": {self.ext_id},      "cbid": {op.cbid},'
            f' "correlation": {self.corr}\n    }}\n  }}',
            f'  {{\n    "ph": "s", "id": {self.corr}, "pid": {self.pid}, "tid": {tid},'
            f' "ts": {ts},\n    "cat": "ac2g", "name": "ac2g"\n  }}',
        ]

    def device_event(
        self, op: GpuOp, stream: int, start: int, end: int, ext_id: int, corr: int, extra: str = ""
    ) -> list[str]:
        """The GPU activity plus its ``ac2g`` flow end."""
        ts = us(start - self.base_ns)
        dev = self.device
        queued = ', "queued": 0' if op.gpu_cat == "kernel" else ""
        return [
            f'  {{\n    "ph": "X", "cat": "{op.gpu_cat}", "name": "{op.gpu_name}", "pid": {dev},'
            f' "tid": {stream},\n    "ts": {ts}, "dur": {us(end - start)},\n    "args": {{\n'
            f'      "External id": {ext_id}{queued}, "device": {dev}, "context": 1,'
            f'      "stream": {stream}, "correlation": {corr}{op.static_args}{extra}\n    }}\n  }}',
            f'  {{\n    "ph": "f", "id": {corr}, "pid": {dev}, "tid": {stream}, "ts": {ts},\n'
            f'    "cat": "ac2g", "name": "ac2g", "bp": "e"\n  }}',
        ]

    def span(self, cat: str, name: str, pid: str, tid: str, start: int, end: int, arg: str) -> str:
        """An ``X`` event outside the id counters (the profiler's own span); ``arg`` is rendered."""
        return (
            f'  {{\n    "ph": "X", "cat": "{cat}", "ts": {us(start - self.base_ns)},'
            f' "dur": {us(end - start)},\n    "pid": "{pid}", "tid": "{tid}",\n'
            f'    "name": "{name}",\n    "args": {{\n      {arg}\n    }}\n  }}'
        )

    def instant(self, name: str, pid: str, tid: str, ts: int) -> str:
        """A global instant (``i``) event."""
        return (
            f'  {{\n    "name": "{name}", "ph": "i", "s": "g",\n'
            f'    "pid": "{pid}", "tid": "{tid}", "ts": {us(ts - self.base_ns)}\n  }}'
        )

    def metadata(self, name: str, pid: int | str, tid: int | str, ts: int, arg: str) -> str:
        """An ``M`` event (process_name, thread_name, labels, sort indices); ``arg`` is rendered."""
        return (
            f'  {{\n    "name": "{name}", "ph": "M", "ts": {us(ts - self.base_ns)},'
            f' "pid": {_id(pid)}, "tid": {_id(tid)},\n    "args": {{\n      {arg}\n    }}\n  }}'
        )


def _id(value: int | str) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)
