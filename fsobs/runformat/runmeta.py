"""The run's ``run.json`` (:class:`RunMeta`) and how an interrupted run is closed off.

``run.json`` is written by one process only (the launcher or rank 0), atomically, sorted keys::

    format_version  1                      created     UTC ISO time of this metadata
    name, world_size, backend, device, hosts (list), simulated (bool)
    workload        the job's config as its own JSON (``job.json``'s; a simulated run's:
                    ``simulator``, ``steps`` and ``freescale.balance``); older runs hold a flat
                    record (``seed``, ``balance_window``, ...): :meth:`RunMeta.knob` reads both
    toggles         {name: {"requested": bool, "applied": bool, "reason": str | null}}
    versions        {"python": ..., "torch": ... | null, "torchrec": ... | null}
    status          "complete" | "incomplete"   reason: why incomplete (null when complete)
    ranks_present   ranks that left a trace
    process_groups  (optional) the optimizer's process groups: {role: {"pg_name": ...}}

A reader refuses a ``run.json`` over 16 MiB (:mod:`fsobs.runformat.bounded`). Every key is
optional to a reader (foreign traces come with a ``run.json`` of their own, or a
minimal one): what is there must have the right type and value, and the first that does not is
one :class:`~fsobs.errors.TraceFormatError` naming the file and the field. The loader
(:mod:`fsobs.trace.loader`) checks ``world_size`` and ``status`` against the traces: a
``complete`` run missing a rank's trace is an error, an ``incomplete`` one only a warning.
No torch here (versions come from the installed package metadata when torch is not loaded).
"""

from __future__ import annotations

import json
import logging
import platform
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import msgspec

from fsobs.errors import TraceFormatError, TraceReadError
from fsobs.runformat.atomic import TEMP_RE, write_atomic
from fsobs.runformat.bounded import MAX_RUN_JSON_BYTES, read_limited
from fsobs.runformat.names import FORMAT_VERSION, PARTIAL_RE, PARTIAL_SUFFIX, RUN_JSON, TRACE_RE
from fsobs.runformat.steps import recover_partial
from fsobs.runformat.structs import FieldError, convert
from fsobs.runformat.windows import list_windows, published_ranks
from fsobs.storage import Location

logger = logging.getLogger(__name__)

STATUSES = ("complete", "incomplete")
MAX_WORLD_SIZE = 2**20
"""The most ranks a run can have (``run.json`` and the traces): more is a wrong value."""


class ToggleStatus(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One optimizer toggle as requested and as applied, with the reason."""

    requested: bool
    applied: bool
    reason: str | None = None
    """Why it was not applied (required then), or a note on how it was."""

    def __post_init__(self) -> None:
        if type(self.requested) is not bool or type(self.applied) is not bool:
            raise ValueError("requested and applied must be bools")
        if self.applied and not self.requested:
            raise ValueError("applied but not requested")
        if self.requested and not self.applied and not self.reason:
            raise ValueError("requested but not applied: give the reason")

    def to_json(self) -> dict[str, Any]:
        """The toggle's object, keys in the order ``run.json`` has them (sorted)."""
        return {"applied": self.applied, "reason": self.reason, "requested": self.requested}


class RunMeta(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """The content of ``run.json`` (see the module docstring). Read by msgspec
    (:mod:`fsobs.runformat.structs`: the types, unknown fields); the rules between fields are
    checked when made (:class:`~fsobs.runformat.structs.FieldError`, a ``ValueError`` naming
    the field)."""

    name: str | None = None
    world_size: int | None = None
    backend: str | None = None
    """``gloo`` or ``nccl``."""
    device: str | None = None
    """``cpu`` or ``cuda``."""
    hosts: tuple[str, ...] = ()
    workload: dict[str, Any] = {}
    """The job's configuration (model, data, batch, seed, ...): its config's own JSON
    (:meth:`fsobs.workload.config.JobConfig.to_json`), or an older run's flat record; read a
    knob with :meth:`knob`."""
    toggles: dict[str, ToggleStatus] = {}
    simulated: bool = False
    status: Literal["complete", "incomplete"] = "complete"
    reason: str | None = None
    """Why the run is incomplete; None when complete."""
    ranks_present: tuple[int, ...] | None = None
    """Ranks that left a trace; None when not recorded."""
    process_groups: dict[str, Any] | None = None
    versions: dict[str, str | None] = {}
    """python, torch and torchrec versions of the writer."""
    created: str | None = None
    """UTC ISO time the metadata was made (:meth:`now` stamps it)."""
    format_version: int = FORMAT_VERSION

    @classmethod
    def now(cls, **fields: Any) -> RunMeta:
        """Metadata made here and now: ``created`` and ``versions`` stamped by this process."""
        return cls(created=_now(), versions=_versions(), **fields)

    def __post_init__(self) -> None:
        if self.world_size is not None and self.world_size < 1:
            raise _bad("world_size", "a positive integer", self.world_size)
        if self.world_size is not None and self.world_size > MAX_WORLD_SIZE:
            raise _bad("world_size", f"at most {MAX_WORLD_SIZE} ranks", self.world_size)
        for key in ("name", "backend", "device", "reason", "created"):
            if getattr(self, key) == "":
                raise _bad(key, "a non-empty string", "")
        if not isinstance(self.hosts, tuple):
            raise _bad("hosts", "a list of host names", self.hosts)
        if not 1 <= self.format_version <= FORMAT_VERSION:
            raise _bad(
                "format_version", f"an integer from 1 to {FORMAT_VERSION}", self.format_version
            )
        self._check_status()

    def _check_status(self) -> None:
        if self.status not in STATUSES:
            raise _bad("status", f"one of {STATUSES}", self.status)
        present = self.ranks_present
        if present is not None:
            if not all(r >= 0 for r in present) or list(present) != sorted(set(present)):
                raise _bad("ranks_present", "sorted distinct non-negative integers", present)
            if self.world_size is not None and present and present[-1] >= self.world_size:
                raise FieldError(
                    "ranks_present", f"{list(present)} has ranks >= world_size {self.world_size}"
                )
        if self.status == "complete":
            if self.reason is not None:
                raise FieldError("reason", f"must be null for a complete run, got {self.reason!r}")
            if present is not None and self.world_size is not None:
                if list(present) != list(range(self.world_size)):
                    raise FieldError(
                        "ranks_present",
                        f"{list(present)} must be all {self.world_size} ranks for a complete run",
                    )
        elif not self.reason:
            raise FieldError("reason", "an incomplete run needs a reason")

    def to_json(self) -> dict[str, Any]:
        """The object written as ``run.json`` (``process_groups`` only when recorded)."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        out["hosts"] = list(self.hosts)
        if self.ranks_present is not None:
            out["ranks_present"] = list(self.ranks_present)
        if self.process_groups is None:
            del out["process_groups"]
        return out

    @classmethod
    def from_json(cls, value: object) -> RunMeta:
        """Parse ``run.json``'s object strictly: a null value stands for the field left out
        (foreign files write them); :class:`FieldError` naming the bad field."""
        if not isinstance(value, dict):
            raise ValueError("run metadata must be a JSON object")
        fields = {k: v for k, v in value.items() if v is not None or k in _NULLABLE}
        if isinstance(fields.get("toggles"), dict):  # msgspec does not name a dict's key
            for name, toggle in fields["toggles"].items():
                _toggle(name, toggle)
        return convert(fields, cls)

    def knob(self, path: str) -> Any:
        """The workload's value at ``path``, dotted as in the job config's JSON
        (``data.seed``, ``freescale.balance.window``), read from an older run's flat record
        under its flat name too (:data:`FLAT_WORKLOAD`); None when the workload lacks it."""
        value: Any = self.workload
        for key in path.split("."):
            if not isinstance(value, Mapping) or key not in value:
                return self.workload.get(FLAT_WORKLOAD.get(path, path))
            value = value[key]
        return value

    def incomplete(self, reason: str, ranks_present: Sequence[int]) -> RunMeta:
        """This metadata with ``status: incomplete``, ``reason`` and ``ranks_present``."""
        return msgspec.structs.replace(
            self, status="incomplete", reason=reason, ranks_present=tuple(sorted(ranks_present))
        )


_NULLABLE = frozenset({"reason", "ranks_present", "process_groups"})
FLAT_WORKLOAD: dict[str, str] = {
    "model.size": "model_size",
    "model.dense_mb": "dense_mb",
    "data.preset": "preset",
    "data.item_popularity": "item_popularity",
    "data.num_samples": "num_samples",
    "data.seed": "seed",
    "profiler.enabled": "profile",
    "profiler.repeat": "profile_repeat",
    "profiler.every": "profile_every",
    "profiler.record_shapes": "record_shapes",
    "freescale.balance.enabled": "balance",
    "freescale.balance.method": "balance_method",
    "freescale.balance.mode": "balance_mode",
    "freescale.balance.counts": "balance_counts",
    "freescale.balance.window": "balance_window",
    "freescale.priority_overlap.enabled": "priority_overlap",
    "freescale.priority_overlap.dense_order": "dense_order",
    "freescale.sm_free.enabled": "sm_free",
    "freescale.sync_gc.enabled": "sync_gc",
}
"""Where the knobs of an older run's flat ``workload`` are in the job config's JSON: path ->
flat name (``steps``, ``batch_size``, ``optimizer``, ``ddp_bucket_mb``, ``save_params`` are
named alike in both; the flat ``cost_model`` and ``profile_active`` have no exact path)."""


def _toggle(name: str, value: object) -> None:
    """Check one toggle of ``run.json``: :class:`FieldError` naming ``toggles.<name>``."""
    try:
        convert(value, ToggleStatus)
    except FieldError as exc:
        raise exc.within(f"toggles.{name}") from None


def _bad(key: str, wanted: str, value: object) -> FieldError:
    return FieldError(key, f"expected {wanted}, got {json.dumps(value, default=repr)}")


def write_run_json(run_dir: str | Path, meta: RunMeta) -> Path:
    """Write ``run_dir/run.json`` atomically (sorted keys, indent 2, strict JSON); its path."""
    path = Path(run_dir) / RUN_JSON
    text = json.dumps(meta.to_json(), sort_keys=True, indent=2, allow_nan=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.encode("utf-8"))
    return path


def read_run_meta(path: Location) -> RunMeta:
    """Read and check one ``run.json``; one :class:`~fsobs.errors.FsobsError` naming the file
    (and the field) when it is unreadable, bad, or over :data:`MAX_RUN_JSON_BYTES`."""
    try:
        value = json.loads(read_limited(path, MAX_RUN_JSON_BYTES, "run metadata").decode())
    except OSError as exc:
        raise TraceReadError(f"cannot read file: {exc.strerror or exc}", path=path) from exc
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"run metadata is not UTF-8 text ({exc.reason})", path=path) from exc
    except json.JSONDecodeError as exc:
        raise TraceFormatError(
            f"run metadata is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
            path=path,
        ) from exc
    except RecursionError as exc:
        raise TraceFormatError(
            "run metadata is not valid JSON for fsobs: nested deeper than Python's recursion limit",
            path=path,
        ) from exc
    try:
        return RunMeta.from_json(value)
    except FieldError as exc:
        raise TraceFormatError(exc.reason, path=path, field=exc.field or None) from exc
    except (TypeError, ValueError) as exc:
        raise TraceFormatError(str(exc), path=path) from exc


def read_run_json(run_dir: str | Path) -> RunMeta | None:
    """The metadata of a local run directory, None when it has no ``run.json``."""
    path = Path(run_dir) / RUN_JSON
    return read_run_meta(path) if path.exists() else None


def mark_incomplete(run_dir: str | Path, reason: str, ranks_present: Sequence[int]) -> RunMeta:
    """Set ``status: incomplete`` with ``reason`` and ``ranks_present`` in ``run.json``.

    Keeps every other field; without a ``run.json`` writes a minimal one (the loader then takes
    the world size from the traces). Returns the metadata written.
    """
    if not isinstance(reason, str) or not reason:
        raise ValueError(f"reason must be a non-empty string, got {reason!r}")
    meta = read_run_json(run_dir) or RunMeta.now()
    present = sorted(set(ranks_present))
    meta = meta.incomplete(reason, present)
    write_run_json(run_dir, meta)
    return meta


def finalize_incomplete(run_dir: str | Path, reason: str | None = None) -> RunMeta:
    """Make what an interrupted run left analyzable and mark it incomplete.

    Call once no rank process of the run is alive. Steps:

    1. remove temporary files of interrupted atomic writes (``.<name>.<pid>.<hex>.tmp``, and
       the ``<that>.tmp`` that Kineto writes before renaming it to the name it was given),
       in the run's folder and its live windows' folders;
    2. publish every ``steps.rank<R>.jsonl.partial`` as ``steps.rank<R>.jsonl``, dropping a
       torn last line (:func:`fsobs.runformat.steps.recover_partial`; one that cannot be
       written, on a full disk, stays ``.partial``);
    3. set ``status: incomplete``, ``ranks_present`` (the ranks with a ``rank<R>.trace.json.gz``
       or a published live window)
       and ``reason`` (the one given, else a description of what was found) in ``run.json``.

    Returns the metadata written.
    """
    root = Path(run_dir)
    folders = [root, *(w.path for w in list_windows(root))]
    for temp in sorted(p for f in folders for p in f.iterdir() if _is_temp(p.name)):
        logger.info("removing leftover temporary file %s", temp)
        temp.unlink(missing_ok=True)
    unclosed, dropped = [], 0
    for partial in sorted(root.iterdir()):
        match = PARTIAL_RE.match(partial.name)
        if match is None:
            continue
        if partial.with_name(partial.name[: -len(PARTIAL_SUFFIX)]).exists():
            logger.warning("%s: left alone, the closed sidecar is already there", partial)
            continue
        unclosed.append(int(match.group(1)))
        try:
            dropped += recover_partial(partial)
        except OSError as exc:  # a full disk: run.json still says why; the file stays .partial
            logger.warning("%s: not published: %s", partial, exc)
    present = sorted(
        {int(m.group(1)) for p in root.iterdir() if (m := TRACE_RE.match(p.name))}
        | published_ranks(root)
    )
    if reason is None:
        reason = _describe(read_run_json(root), present, sorted(unclosed), dropped)
    return mark_incomplete(root, reason, present)


def _is_temp(name: str) -> bool:
    return TEMP_RE.match(name) is not None or TEMP_RE.match(name.removesuffix(".tmp")) is not None


def _describe(meta: RunMeta | None, present: list[int], unclosed: list[int], dropped: int) -> str:
    parts = []
    world_size = meta.world_size if meta is not None else None
    if world_size is not None:
        missing = sorted(set(range(world_size)) - set(present))
        if missing:
            parts.append(f"no trace from ranks {missing}")
    if unclosed:
        torn = f", {dropped} torn line(s) dropped" if dropped else ""
        parts.append(f"step files of ranks {unclosed} were never closed{torn}")
    return "interrupted: " + ("; ".join(parts) if parts else "finalized before completion")


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
    from importlib import metadata  # 10-45 ms: only when a run is written, not on every read

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
