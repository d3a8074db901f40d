"""The run's ``run.json`` (DESIGN §3) and how an interrupted run is closed off.

``run.json`` is written by one process only (the launcher or rank 0), atomically. Keys::

    format_version  1                      created     UTC ISO time of this metadata
    name, world_size, backend, device, hosts (list), workload (dict), simulated (bool)
    toggles         {name: {"requested": bool, "applied": bool, "reason": str | None}}
    versions        {"python": ..., "torch": ... | None, "torchrec": ... | None}
    status          "complete" | "incomplete"   reason: why incomplete (None when complete)
    ranks_present   ranks that left a trace

The loader (:mod:`fsobs.trace.loader`) reads ``world_size`` and ``status``: a ``complete`` run
missing a rank's trace is an error, an ``incomplete`` one only a warning. This module does not
import torch (versions come from the installed package metadata when torch is not loaded).
"""

from __future__ import annotations

import json
import logging
import platform
import re
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from fsobs.collect._atomic import TEMP_RE, write_atomic
from fsobs.collect.sidecar import PARTIAL_SUFFIX, recover_partial

logger = logging.getLogger(__name__)

__all__ = [
    "FORMAT_VERSION",
    "RUN_JSON",
    "build_run_meta",
    "finalize_incomplete",
    "mark_incomplete",
    "read_run_json",
    "write_run_json",
]

FORMAT_VERSION = 1
RUN_JSON = "run.json"
STATUSES = ("complete", "incomplete")
_TRACE_RE = re.compile(r"^rank(\d+)\.trace\.json\.gz$")
_PARTIAL_RE = re.compile(r"^steps\.rank(\d+)\.jsonl" + re.escape(PARTIAL_SUFFIX) + "$")


def build_run_meta(
    *,
    name: str,
    world_size: int,
    backend: str,
    device: str,
    hosts: Sequence[str],
    workload: Mapping[str, Any],
    toggles: Mapping[str, Mapping[str, Any]],
    ranks_present: Sequence[int],
    status: str,
    reason: str | None = None,
    simulated: bool = False,
) -> dict[str, Any]:
    """The content of ``run.json``; raises ValueError naming the inconsistent field.

    A ``complete`` run has every rank present and no reason; an ``incomplete`` one needs a reason.
    A toggle that is applied must have been requested; one requested but not applied needs a reason.
    """
    if type(world_size) is not int or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    for key, value in (("name", name), ("backend", backend), ("device", device)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"{key} must be a non-empty string, got {value!r}")
    if isinstance(hosts, str) or not all(isinstance(h, str) for h in hosts):
        raise ValueError(f"hosts must be a list of host names, got {hosts!r}")
    present = _ranks(ranks_present, world_size)
    _check_status(status, reason, present, world_size)
    return {
        "format_version": FORMAT_VERSION,
        "created": _now(),
        "name": name,
        "world_size": world_size,
        "backend": backend,
        "device": device,
        "hosts": list(hosts),
        "workload": dict(workload),
        "toggles": {key: _toggle(key, value) for key, value in toggles.items()},
        "simulated": bool(simulated),
        "versions": _versions(),
        "status": status,
        "reason": reason,
        "ranks_present": present,
    }


def write_run_json(run_dir: str | Path, meta: Mapping[str, Any]) -> Path:
    """Write ``run_dir/run.json`` atomically (sorted keys, indent 2, strict JSON); its path."""
    path = Path(run_dir) / RUN_JSON
    text = json.dumps(dict(meta), sort_keys=True, indent=2, allow_nan=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.encode("utf-8"))
    return path


def read_run_json(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's metadata, None when there is no ``run.json``."""
    path = Path(run_dir) / RUN_JSON
    if not path.exists():
        return None
    meta = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: run metadata must be a JSON object")
    return meta


def mark_incomplete(
    run_dir: str | Path, reason: str, ranks_present: Sequence[int]
) -> dict[str, Any]:
    """Set ``status: incomplete`` with ``reason`` and ``ranks_present`` in ``run.json``.

    Keeps every other key; without a ``run.json`` writes a minimal one (the loader then takes
    the world size from the traces). Returns the metadata written.
    """
    if not isinstance(reason, str) or not reason:
        raise ValueError(f"reason must be a non-empty string, got {reason!r}")
    meta = read_run_json(run_dir)
    if meta is None:
        meta = {"format_version": FORMAT_VERSION, "created": _now(), "versions": _versions()}
    world_size = meta.get("world_size")
    if type(world_size) is int and world_size >= 1:
        present = _ranks(ranks_present, world_size)
    else:
        present = sorted({_rank(r) for r in ranks_present})
    meta.update(status="incomplete", reason=reason, ranks_present=present)
    write_run_json(run_dir, meta)
    return meta


def finalize_incomplete(run_dir: str | Path, reason: str | None = None) -> dict[str, Any]:
    """Make what an interrupted run left analyzable and mark it incomplete.

    Call once no rank process of the run is alive. Steps:

    1. remove temporary files of interrupted atomic writes (``.<name>.<pid>.<hex>.tmp``);
    2. publish every ``steps.rank<R>.jsonl.partial`` as ``steps.rank<R>.jsonl``, dropping a
       torn last line (:func:`fsobs.collect.sidecar.recover_partial`);
    3. set ``status: incomplete``, ``ranks_present`` (the ranks with a ``rank<R>.trace.json.gz``)
       and ``reason`` (the one given, else a description of what was found) in ``run.json``.

    Returns the metadata written.
    """
    root = Path(run_dir)
    for temp in sorted(p for p in root.iterdir() if TEMP_RE.match(p.name)):
        logger.info("removing leftover temporary file %s", temp)
        temp.unlink(missing_ok=True)
    unclosed, dropped = [], 0
    for partial in sorted(root.iterdir()):
        match = _PARTIAL_RE.match(partial.name)
        if match is None:
            continue
        if partial.with_name(partial.name[: -len(PARTIAL_SUFFIX)]).exists():
            logger.warning("%s: left alone, the closed sidecar is already there", partial)
            continue
        dropped += recover_partial(partial)
        unclosed.append(int(match.group(1)))
    present = sorted(int(m.group(1)) for p in root.iterdir() if (m := _TRACE_RE.match(p.name)))
    if reason is None:
        reason = _describe(read_run_json(root), present, sorted(unclosed), dropped)
    return mark_incomplete(root, reason, present)


def _describe(
    meta: dict[str, Any] | None, present: list[int], unclosed: list[int], dropped: int
) -> str:
    parts = []
    world_size = (meta or {}).get("world_size")
    if type(world_size) is int:
        missing = sorted(set(range(world_size)) - set(present))
        if missing:
            parts.append(f"no trace from ranks {missing}")
    if unclosed:
        torn = f", {dropped} torn line(s) dropped" if dropped else ""
        parts.append(f"step files of ranks {unclosed} were never closed{torn}")
    return "interrupted: " + ("; ".join(parts) if parts else "finalized before completion")


def _check_status(status: str, reason: str | None, present: list[int], world_size: int) -> None:
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
    if status == "complete":
        if reason is not None:
            raise ValueError(f"reason must be None for a complete run, got {reason!r}")
        if present != list(range(world_size)):
            raise ValueError(
                f"ranks_present {present} must be all {world_size} ranks for a complete run"
            )
    elif not isinstance(reason, str) or not reason:
        raise ValueError("an incomplete run needs a reason")


def _toggle(name: str, value: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(value, Mapping) or set(value) != {"requested", "applied", "reason"}:
        raise ValueError(f"toggles.{name} must have exactly requested, applied and reason")
    requested, applied, reason = value["requested"], value["applied"], value["reason"]
    if type(requested) is not bool or type(applied) is not bool:
        raise ValueError(f"toggles.{name}: requested and applied must be bools")
    if reason is not None and not isinstance(reason, str):
        raise ValueError(f"toggles.{name}.reason must be a string or None, got {reason!r}")
    if applied and not requested:
        raise ValueError(f"toggles.{name} is applied but was not requested")
    if requested and not applied and not reason:
        raise ValueError(f"toggles.{name} was requested but not applied: give the reason")
    return {"requested": requested, "applied": applied, "reason": reason}


def _ranks(ranks: Sequence[int], world_size: int) -> list[int]:
    present = sorted({_rank(r) for r in ranks})
    if present and present[-1] >= world_size:
        raise ValueError(f"ranks_present {present} has ranks >= world_size {world_size}")
    return present


def _rank(value: object) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"ranks_present must hold non-negative integers, got {value!r}")
    return value


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _versions() -> dict[str, str | None]:
    return {
        "python": platform.python_version(),
        "torch": _package_version("torch"),
        "torchrec": _package_version("torchrec"),
    }


def _package_version(name: str) -> str | None:
    loaded = getattr(sys.modules.get(name), "__version__", None)
    if loaded is not None:
        return str(loaded)
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
