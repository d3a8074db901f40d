"""Which files make up a run folder (docs/design.md §3), worked out once for every reader.

:func:`run_files` lists a folder once, a local path or a URL (:mod:`fsobs.storage`), and sorts
what it holds by the names of :mod:`fsobs.runformat.names`; the loader, the sidecar reader, the
dashboard's store, ``fsobs run`` and the live state (:mod:`fsobs.live.state`) read that
listing, and the dashboard's upload takes the names :func:`~fsobs.runformat.names.is_run_file`
admits::

    <run>/                       RunFiles
      rank<R>.trace.json.gz      .traces      every regular *.json(.gz) that is no other run
      worker.pt.trace.json                    file (the loader then reads its opening)
      steps.rank<R>.jsonl        .sidecars    (file, rank), sorted by name
      steps.rank<R>.jsonl.partial .partial_sidecars   still being written, or left by a dead rank
      run.json                   .run_json
      windows/                   .windows     a live run's published windows (a folder)
      notes.txt                  .files       every regular file, run file or not
      linked.json -> elsewhere   .links       never followed, never opened
      fifo                       .special     neither file, folder nor link (local only)

Only regular files are run files: in a local folder a symbolic link (to a file, a folder or
nothing) is named in :attr:`RunFiles.links` and left out, and a FIFO or device in
:attr:`RunFiles.special`; a URL listing has neither.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from fsobs.runformat.names import (
    PARTIAL_RE,
    RUN_JSON,
    SIDECAR_RE,
    WINDOWS_DIR,
    is_run_file,
    is_trace_name,
)
from fsobs.storage import Entry, Location, RemotePath, list_dir


@dataclass(frozen=True)
class RunFiles:
    """What one folder holds, sorted by name (module docstring); nothing is opened."""

    folder: Location
    files: tuple[Entry, ...]
    """Every regular file, with its size and modification time (a URL listing may lack them)."""
    folders: tuple[str, ...]
    """The names of the subfolders (local: links to folders are in :attr:`links` instead)."""
    links: tuple[str, ...] = ()
    """Local: the names of the symbolic links, whatever they lead to."""
    folder_links: frozenset[str] = frozenset()
    """Local: those of :attr:`links` that lead to a folder."""
    special: tuple[Path, ...] = ()
    """Local: the entries that are neither a regular file, a folder nor a link."""

    @property
    def names(self) -> tuple[str, ...]:
        """The names of :attr:`files`."""
        return tuple(f.location.name for f in self.files)

    @property
    def traces(self) -> tuple[Entry, ...]:
        """The files that may be Kineto traces (:func:`~fsobs.runformat.names.is_trace_name`)."""
        return tuple(f for f in self.files if is_trace_name(f.location.name))

    @property
    def sidecars(self) -> tuple[tuple[Location, int], ...]:
        """(file, rank) of every finished step sidecar ``steps.rank<R>.jsonl``; a rank may have
        several (``steps.rank01.jsonl`` beside ``steps.rank1.jsonl``)."""
        return _ranked(self.files, SIDECAR_RE)

    @property
    def partial_sidecars(self) -> tuple[tuple[Location, int], ...]:
        """(file, rank) of every sidecar still being written, ``steps.rank<R>.jsonl.partial``
        (a live run's, or one a rank that died left)."""
        return _ranked(self.files, PARTIAL_RE)

    @property
    def run_json(self) -> Location | None:
        """``run.json``, when the folder has it as a regular file."""
        return next((f.location for f in self.files if f.location.name == RUN_JSON), None)

    @property
    def windows(self) -> Location | None:
        """``windows/``, the published windows of a live run, when the folder has it."""
        return self.folder / WINDOWS_DIR if WINDOWS_DIR in self.folders else None

    @property
    def is_run(self) -> bool:
        """Whether the folder holds a run: a trace or ``run.json``."""
        return bool(self.traces) or self.run_json is not None

    @property
    def linked_run_files(self) -> tuple[str, ...]:
        """The links whose names are run files' (:func:`~fsobs.runformat.names.is_run_file`):
        what a reader of the run leaves out and says so."""
        return tuple(n for n in self.links if is_run_file(n))

    @property
    def file_links(self) -> tuple[str, ...]:
        """The links that do not lead to a folder (to a file, or to nothing)."""
        return tuple(n for n in self.links if n not in self.folder_links)


def _ranked(files: tuple[Entry, ...], pattern: re.Pattern[str]) -> tuple[tuple[Location, int], ...]:
    """(file, the rank its name gives) of the files whose names match ``pattern``."""
    matches = ((f.location, pattern.match(f.location.name)) for f in files)
    return tuple((location, int(m.group(1))) for location, m in matches if m is not None)


def run_files(folder: Location, *, fresh: bool = False) -> RunFiles:
    """The files of ``folder``, listed once; OSError when it cannot be listed
    (FileNotFoundError when it is missing). ``fresh``: a URL folder is listed anew, never
    from fsspec's cache."""
    if isinstance(folder, RemotePath):
        listed = list_dir(folder, fresh=fresh)
        files = tuple(e for e in listed if not e.is_dir)
        return RunFiles(folder, files, tuple(e.location.name for e in listed if e.is_dir))
    return _local(folder)


def _local(folder: Path) -> RunFiles:
    files: list[Entry] = []
    folders: list[str] = []
    links: list[str] = []
    folder_links: set[str] = set()
    special: list[Path] = []
    with os.scandir(folder) as scan:
        children = sorted(scan, key=lambda e: e.name)
    for child in children:
        path = folder / child.name
        if child.is_symlink():
            links.append(child.name)
            if child.is_dir():  # follows the link: one stat, nothing opened
                folder_links.add(child.name)
        elif child.is_dir(follow_symlinks=False):
            folders.append(child.name)
        elif child.is_file(follow_symlinks=False):
            try:
                stat = child.stat(follow_symlinks=False)
            except OSError:  # gone since the listing: no file of the run
                continue
            files.append(Entry(path, False, stat.st_size, stat.st_mtime_ns))
        else:
            special.append(path)
    return RunFiles(
        folder, tuple(files), tuple(folders), tuple(links), frozenset(folder_links), tuple(special)
    )
