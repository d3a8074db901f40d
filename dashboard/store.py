"""The run store: where the dashboard finds runs (plain functions, no Streamlit).

The store is one directory (default ``traces`` in the current directory), chosen by
``--store DIR`` after ``--`` on the ``streamlit run`` command line, else by the ``FSOBS_STORE``
environment variable. A **run** is a directory inside it, at most :data:`MAX_DEPTH` levels down,
that holds a ``run.json`` or Kineto trace files (``*.json``, ``*.json.gz`` other than ``run.json``
and ``cost_model.json``). Its **id** is its path relative to the store with ``/`` separators.
Hidden directories (``.name``, e.g. an upload being validated) and symbolic links (folders and
files) are skipped, so the app only ever opens what lies inside the store; a run's linked files
are named (:attr:`RunEntry.links`) for the page to say so.

The store can also be an fsspec URL (``s3://bucket/runs``, ``gs://...``, ``http(s)://...``; see
:mod:`fsobs.storage`): its runs are listed and analyzed where they are, never copied. Such
a store is read-only (:func:`is_read_only`): the app offers no upload into it. So is a local store
that ``fsobs dashboard --read-only`` serves (``FSOBS_READ_ONLY=1``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fsobs import FsobsError
from fsobs.cli import READ_ONLY_ENV
from fsobs.live import RUNNING, run_status
from fsobs.runformat import (
    PARTIAL_SUFFIX,
    RUN_JSON,
    WINDOWS_DIR,
    RunFiles,
    RunMeta,
    read_run_meta,
    run_files,
)
from fsobs.storage import Entry, Location, RemotePath, as_location, is_url

STORE_ENV = "FSOBS_STORE"
DEFAULT_STORE = "traces"
MAX_DEPTH = 3
UNKNOWN = "unknown"
"""The status of a live run that cannot be read (its ``run.json`` is broken, say)."""

Signature = tuple[tuple[str, int, int], ...]
"""(file name, mtime ns, size) of every file of a run: changes whenever a file does."""


@dataclass(frozen=True)
class RunEntry:
    """One run of the store, as found on disk (nothing parsed but ``run.json``)."""

    run_id: str
    path: Location
    """A local folder, or a :class:`~fsobs.storage.RemotePath` in a URL store."""
    trace_files: tuple[str, ...]
    signature: Signature
    meta: RunMeta | None = field(default=None, compare=False, hash=False)
    meta_error: str | None = None
    """Why ``run.json`` could not be read (the loader will say it again, in its words)."""
    live: bool = False
    """Written while its job runs (:func:`is_live`): read by the Live page, not parsed
    as a finished run."""
    links: tuple[str, ...] = ()
    """Its files that are symbolic links (local store): skipped, never opened."""

    @property
    def unfinished(self) -> bool:
        """Live and ``run.json`` not complete (running or stopped): never parsed as a finished
        run (its traces are in its windows, its sidecars may grow)."""
        return self.live and (self.meta is None or self.meta.status != "complete")

    @property
    def trace_bytes(self) -> int:
        """Size on disk of the trace files (sizes a URL store does not tell count as 0)."""
        sizes = {name: size for name, _, size in self.signature}
        return sum(max(sizes.get(name, 0), 0) for name in self.trace_files)


def store_from_argv(argv: Sequence[str]) -> str | None:
    """The ``--store DIR`` given after ``--`` on the ``streamlit run`` command line, if any."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--store", default=None)
    known, _ = parser.parse_known_args(list(argv))
    store: str | None = known.store
    return store


def resolve_store(
    argv: Sequence[str], environ: dict[str, str] | os._Environ[str]
) -> Path | RemotePath:
    """The store: ``--store`` beats ``FSOBS_STORE`` beats ``traces``; a directory, or a URL
    (``file://`` URLs are directories)."""
    chosen = store_from_argv(argv) or environ.get(STORE_ENV) or DEFAULT_STORE
    if is_url(chosen):
        location = as_location(chosen)
        return location.resolve() if isinstance(location, Path) else location
    return Path(chosen).expanduser().resolve()


def is_read_only(store: Location) -> bool:
    """Whether viewers must not write into the store (no upload, no capture request): a URL
    store, or any store served with ``--read-only`` (``FSOBS_READ_ONLY=1``). The app's own
    analysis cache is kept in a local store even then, where the store lets it write."""
    return isinstance(store, RemotePath) or os.environ.get(READ_ONLY_ENV) == "1"


def read_only_note(store: Location) -> str:
    """Why uploads are off, in one line."""
    if isinstance(store, RemotePath):
        return (
            "This run store is a URL, opened read-only: uploading runs into it is disabled. "
            "Copy runs there with your storage tools, or start the dashboard on a local directory."
        )
    return "This dashboard serves its run store read-only: uploading runs is disabled."


def list_runs(store: Location) -> list[RunEntry]:
    """Every run of the store, sorted by id."""
    found: list[RunEntry] = []
    if isinstance(store, RemotePath) or store.is_dir():
        _scan(store, store, 0, found)
    return sorted(found, key=lambda e: e.run_id)


def run_state(entry: RunEntry) -> tuple[str | None, str | None]:
    """(``running``, ``stopped`` or ``complete``; why it stopped): what ``fsobs watch`` says
    (:func:`fsobs.live.state.run_status`) of a live run in a local store, else ``run.json``'s
    status (``incomplete`` is stopped); (None, None) without ``run.json``; (:data:`UNKNOWN`,
    why) when the live run cannot be read."""
    if entry.live and isinstance(entry.path, Path):
        try:
            return run_status(entry.path)
        except (FsobsError, OSError) as exc:
            return UNKNOWN, " ".join(str(exc).split())
    meta = entry.meta
    if meta is None:
        return None, None
    return ("complete", None) if meta.status == "complete" else ("stopped", meta.reason)


def live_first(entries: Sequence[RunEntry], states: Sequence[str | None]) -> list[RunEntry]:
    """``entries`` with the running ones first, then the stopped ones (each group in its
    order); ``states``: their :func:`run_state`."""
    rank = {"running": 0, "stopped": 1}
    order = sorted(range(len(entries)), key=lambda i: rank.get(states[i] or "", 2))
    return [entries[i] for i in order]


def find_run(runs: Sequence[RunEntry], run_id: str | None) -> RunEntry | None:
    """The run with this id among ``runs`` (ids from a URL are only ever looked up here)."""
    return next((r for r in runs if r.run_id == run_id), None)


def _scan(store: Location, folder: Location, depth: int, found: list[RunEntry]) -> None:
    """The runs in ``folder`` and below it, listed once each (a URL store afresh)."""
    try:
        listed = run_files(folder, fresh=True)
    except OSError as exc:  # local: listed (the loader says why it cannot be opened), not hidden
        if depth > 0 and isinstance(store, Path) and isinstance(folder, Path):
            why = f"cannot read this folder ({exc.strerror or exc})"
            found.append(_unreadable(store, folder, why))
        return
    is_run = depth > 0 and listed.is_run
    if is_run:
        found.append(_entry(store, listed))
    if depth >= MAX_DEPTH:
        return
    for name in listed.folders:
        if not _skipped(name, is_run):
            _scan(store, folder / name, depth + 1, found)


def _unreadable(store: Path, folder: Path, why: str) -> RunEntry:
    """A folder of the store that cannot be listed (no permission): a run with no file, whose
    analysis fails in one line."""
    run_id = folder.relative_to(store).as_posix()
    return RunEntry(run_id=run_id, path=folder, trace_files=(), signature=(), meta_error=why)


def _skipped(name: str, in_run: bool) -> bool:
    """Hidden folders, and a run's ``windows/`` (its profiling windows are part of it)."""
    return name.startswith(".") or (in_run and name == WINDOWS_DIR)


def is_live(files: Sequence[str], folders: Sequence[str], meta: RunMeta | None) -> bool:
    """Whether a run (its file and folder names, its ``run.json``) is written by a running job,
    or was left by one: ``run.json`` says so (incomplete, reason ``running``), or its profiling
    windows are published one by one (``windows/``), or a step sidecar is still ``.partial``."""
    running = meta is not None and meta.status == "incomplete" and meta.reason == RUNNING
    return running or WINDOWS_DIR in folders or any(f.endswith(PARTIAL_SUFFIX) for f in files)


def folder_signature(folder: Location) -> Signature:
    """The signature of the run in ``folder``, as :func:`list_runs` computes it."""
    return signature_of(run_files(folder, fresh=True).files)


def _entry(store: Location, listed: RunFiles) -> RunEntry:
    folder = listed.folder
    meta, error = (None, None) if listed.run_json is None else _read_meta(listed.run_json)
    return RunEntry(
        links=listed.file_links,
        run_id=_run_id(store, folder),
        path=folder,
        trace_files=tuple(e.location.name for e in listed.traces),
        signature=signature_of(listed.files),
        meta=meta,
        meta_error=error,
        live=is_live(listed.names, listed.folders, meta),
    )


def _run_id(store: Location, folder: Location) -> str:
    """The folder's path relative to the store, with ``/`` separators."""
    if isinstance(store, RemotePath) and isinstance(folder, RemotePath):
        return folder.url[len(store.url) :].strip("/")
    assert isinstance(store, Path) and isinstance(folder, Path)  # a local store's are local
    return folder.relative_to(store).as_posix()


def signature_of(files: Sequence[Entry]) -> Signature:
    """(name, mtime ns or 0, size or -1) of each file, sorted: the cache key of a run's content
    (a URL store's listing may tell neither; HTTP's does not)."""
    rows = [(f.location.name, f.mtime_ns or 0, -1 if f.size is None else f.size) for f in files]
    return tuple(sorted(rows))


def _read_meta(path: Location) -> tuple[RunMeta | None, str | None]:
    try:
        return read_run_meta(path), None
    except FsobsError as exc:
        return None, f"{RUN_JSON} unreadable: {exc}"


def toggles_table(meta: RunMeta | None) -> list[dict[str, Any]]:
    """The optimizer toggles of ``run.json`` as rows: toggle, requested, applied, reason."""
    if meta is None:
        return []
    return [
        {"toggle": name, "requested": t.requested, "applied": t.applied, "reason": t.reason or ""}
        for name, t in sorted(meta.toggles.items())
    ]


def toggles_summary(meta: RunMeta | None) -> str:
    """One short cell for the runs table: ``balance, sm_free (requested, not applied)``."""
    parts = []
    for row in toggles_table(meta):
        if row["applied"]:
            parts.append(row["toggle"])
        elif row["requested"]:
            parts.append(f"{row['toggle']} (requested, not applied)")
    return ", ".join(parts) if parts else "none"


def applied_toggles(meta: RunMeta | None) -> list[str]:
    """The toggles ``run.json`` records as applied, sorted."""
    return [] if meta is None else sorted(n for n, t in meta.toggles.items() if t.applied)


def every_toggle_off(meta: RunMeta | None) -> bool:
    """Whether ``run.json`` records toggles and none of them applied (a baseline: nothing of
    the optimizer acted, whatever was requested); False without ``run.json`` or toggles."""
    return meta is not None and bool(meta.toggles) and not applied_toggles(meta)


def parent_of(run_id: str) -> str:
    """The folder of a run id: ``demo`` for ``demo/baseline``, ``""`` at the top."""
    return run_id.rpartition("/")[0]
