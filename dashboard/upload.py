"""Store an uploaded run safely (plain functions, no Streamlit).

An upload is several run files (Kineto traces ``*.json`` / ``*.json.gz``, ``run.json``, step
sidecars ``steps.rank<R>.jsonl``) or one ``.zip`` / ``.tar.gz`` / ``.tgz`` archive of them. Steps:

1. create a hidden staging directory ``<store>/uploads/.upload-XXXX`` (the store never lists it);
2. copy the files in, or extract the archive's members **flattened to their base names**, only
   the allowed types (other members are skipped and reported). An archive is refused whole if a
   member has an absolute path or ``..``, is a symbolic or hard link, a device or FIFO, or is
   encrypted; two files with the same name are refused;
3. count bytes against :data:`MAX_UPLOAD_BYTES` (uncompressed, all files together): the sizes the
   archive declares before extracting, and the bytes actually written while streaming, so a
   decompression bomb stops at the limit;
4. validate: load and analyze the staged run with fsobs; any
   :class:`~fsobs.errors.FsobsError` becomes an :class:`UploadError` with its one-line message;
5. ``os.rename`` the staging directory to ``uploads/<name>``, ``<name>-2``, ``<name>-3``, ... (the
   first that does not exist: a stored run is never overwritten).

On any failure the staging directory is removed (and ``uploads/`` too if this upload created
it), so the store is left exactly as it was.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from fsobs import FsobsError, analyze_path
from fsobs.runformat.names import RUN_JSON, SIDECAR_RE, is_trace_name

MAX_UPLOAD_BYTES = 512 * 2**20
"""Largest upload, uncompressed, all files together."""
UPLOADER_MB = -(-MAX_UPLOAD_BYTES // 10**6)
"""The uploader widget's per-file limit, in Streamlit's megabytes, which browsers count as
10**6 bytes (2**20 on Windows): the smallest that admits a file of :data:`MAX_UPLOAD_BYTES`
everywhere. The server's own cap is ``server.maxUploadSize`` (MiB) in
``dashboard/.streamlit/config.toml``; this module applies the rule itself."""
MAX_MEMBERS = 4096
"""Most entries an archive may have (directories and skipped members included)."""
UPLOADS = "uploads"
ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz")
_CHUNK = 1 << 20
_MAX_NAME = 64

Validator = Callable[[Path], object]


class UploadError(ValueError):
    """The upload was refused; the message is one line meant for the user."""


@dataclass(frozen=True)
class StoredUpload:
    """Where an accepted upload went."""

    run_id: str
    path: Path
    files: tuple[str, ...]
    skipped: tuple[str, ...] = ()
    """Archive members that are not run files and were left out."""


@dataclass
class _Budget:
    """Bytes left under the limit: declared sizes first, then what is really written."""

    limit: int
    declared: int = 0
    written: int = 0

    def declare(self, size: int, what: str) -> None:
        self.declared += max(size, 0)
        if self.declared > self.limit:
            raise UploadError(f"{what}: the upload is larger than {_mib(self.limit)} uncompressed")

    def take(self, size: int, what: str) -> None:
        self.written += size
        if self.written > self.limit:
            raise UploadError(f"{what}: the upload is larger than {_mib(self.limit)} uncompressed")


@dataclass
class _Staged:
    folder: Path
    budget: _Budget
    files: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def sanitize_name(name: str) -> str:
    """A safe directory name: letters, digits, ``.``, ``_``, ``-``; at most 64 characters."""
    for suffix in (*ARCHIVE_SUFFIXES, ".json.gz", ".json"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    clean = re.sub(r"[^A-Za-z0-9._-]+", "-", name)
    clean = re.sub(r"-{2,}", "-", clean).strip("-._")[:_MAX_NAME].strip("-._")
    return clean or "upload"


def is_run_file(name: str) -> bool:
    """A file name an upload may contain: a trace, ``run.json`` or a step sidecar."""
    return is_trace_name(name) or name == RUN_JSON or SIDECAR_RE.match(name) is not None


def is_archive(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def store_upload(
    store: Path,
    files: Sequence[tuple[str, IO[bytes]]],
    name: str | None = None,
    *,
    limit: int = MAX_UPLOAD_BYTES,
    validate: Validator = analyze_path,
) -> StoredUpload:
    """Validate the uploaded files (name, binary stream) and store them as a new run.

    Raises :class:`UploadError` (and leaves the store unchanged) when anything is wrong.
    """
    if not files:
        raise UploadError("no file was uploaded")
    archives = [n for n, _ in files if is_archive(n)]
    if archives and len(files) > 1:
        raise UploadError("upload either trace files or one archive, not both")
    base = sanitize_name(name or (files[0][0] if archives else "upload"))
    uploads = store / UPLOADS
    created = not uploads.exists()
    uploads.mkdir(parents=True, exist_ok=True)
    staged = _Staged(Path(tempfile.mkdtemp(prefix=".upload-", dir=uploads)), _Budget(limit))
    try:
        if archives:
            _extract_archive(files[0], staged)
        else:
            for file_name, stream in files:
                _copy_file(file_name, stream, staged)
        _validate(staged, validate)
        final = _commit(staged.folder, uploads, base)
    except BaseException:
        shutil.rmtree(staged.folder, ignore_errors=True)
        if created and not any(uploads.iterdir()):
            uploads.rmdir()
        raise
    return StoredUpload(
        run_id=f"{UPLOADS}/{final.name}",
        path=final,
        files=tuple(sorted(staged.files)),
        skipped=tuple(staged.skipped),
    )


def _copy_file(raw_name: str, stream: IO[bytes], staged: _Staged) -> None:
    name = raw_name.replace("\\", "/").rsplit("/", 1)[-1]
    if not is_run_file(name):
        raise UploadError(
            f"{name}: not a run file (expected *.json, *.json.gz traces, run.json or "
            "steps.rank<R>.jsonl), or upload one .zip / .tar.gz archive"
        )
    _write(name, stream, staged)


def _write(name: str, stream: IO[bytes], staged: _Staged) -> None:
    """Stream into ``folder/name``, counting every byte against the budget."""
    target = staged.folder / name
    if target.exists():
        raise UploadError(f"{name}: two files of the upload have this name")
    with open(target, "xb") as out:
        while chunk := stream.read(_CHUNK):
            staged.budget.take(len(chunk), name)
            out.write(chunk)
    staged.files.append(name)


def _member_name(raw: str) -> str | None:
    """The base name to extract a member to; None to skip it; UploadError if unsafe."""
    path = raw.replace("\\", "/")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if path.startswith("/") or re.match(r"^[A-Za-z]:", path) or ".." in parts or "\0" in path:
        raise UploadError(f"archive member {raw!r}: absolute paths and '..' are not allowed")
    if not parts or any(p.startswith(".") or p == "__MACOSX" for p in parts):
        return None
    return parts[-1]


def _extract_archive(upload: tuple[str, IO[bytes]], staged: _Staged) -> None:
    file_name, stream = upload
    if file_name.lower().endswith(".zip"):
        _extract_zip(file_name, stream, staged)
    else:
        _extract_tar(file_name, stream, staged)


def _extract_zip(file_name: str, stream: IO[bytes], staged: _Staged) -> None:
    try:
        archive = zipfile.ZipFile(stream)
    except (zipfile.BadZipFile, OSError) as exc:
        raise UploadError(f"{file_name}: not a valid .zip archive ({exc})") from None
    with archive:
        members = archive.infolist()
        if len(members) > MAX_MEMBERS:
            raise UploadError(f"{file_name}: more than {MAX_MEMBERS} entries")
        for info in members:
            _check_zip_member(info)
            staged.budget.declare(info.file_size, info.filename)
        for info in members:
            name = None if info.is_dir() else _member_name(info.filename)
            if name is None or not is_run_file(name):
                _skip(info.filename, info.is_dir(), staged)
                continue
            try:
                with archive.open(info) as member:
                    _write(name, member, staged)
            except (zipfile.BadZipFile, OSError, EOFError) as exc:
                raise UploadError(f"{info.filename}: cannot extract ({exc})") from None


def _check_zip_member(info: zipfile.ZipInfo) -> None:
    _member_name(info.filename)
    kind = stat.S_IFMT(info.external_attr >> 16)  # 0 when the archiver wrote no file type
    if kind == stat.S_IFLNK:
        raise UploadError(f"archive member {info.filename!r}: links are not allowed")
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise UploadError(f"archive member {info.filename!r}: not a regular file")
    if info.flag_bits & 0x1:
        raise UploadError(f"archive member {info.filename!r}: encrypted members are not allowed")


def _extract_tar(file_name: str, stream: IO[bytes], staged: _Staged) -> None:
    try:
        archive = tarfile.open(fileobj=stream, mode="r:*")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise UploadError(f"{file_name}: not a valid .tar.gz archive ({exc})") from None
    with archive:
        try:
            for count, member in enumerate(archive, start=1):
                if count > MAX_MEMBERS:
                    raise UploadError(f"{file_name}: more than {MAX_MEMBERS} entries")
                _extract_tar_member(archive, member, staged)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise UploadError(f"{file_name}: cannot extract ({exc})") from None


def _extract_tar_member(archive: tarfile.TarFile, member: tarfile.TarInfo, staged: _Staged) -> None:
    name = _member_name(member.name)
    if member.issym() or member.islnk():
        raise UploadError(f"archive member {member.name!r}: links are not allowed")
    if member.isdir():
        return
    if not member.isfile():
        raise UploadError(f"archive member {member.name!r}: device files and FIFOs are not allowed")
    staged.budget.declare(member.size, member.name)
    if name is None or not is_run_file(name):
        _skip(member.name, False, staged)
        return
    source = archive.extractfile(member)
    assert source is not None  # a regular file always has data
    with source:
        _write(name, source, staged)


def _skip(raw: str, is_dir: bool, staged: _Staged) -> None:
    if not is_dir:
        staged.skipped.append(raw)


def _validate(staged: _Staged, validate: Validator) -> None:
    if not any(is_trace_name(n) for n in staged.files):
        raise UploadError("no trace file (*.json, *.json.gz) in the upload")
    try:
        validate(staged.folder)
    except FsobsError as exc:
        message = str(exc).replace(f"{staged.folder}{os.sep}", "").replace(str(staged.folder), "")
        raise UploadError(message.strip(": ") or "the upload is not a valid run") from None


def _commit(staging: Path, uploads: Path, base: str) -> Path:
    """Rename the staging directory to the first free ``base``, ``base-2``, ..."""
    number = 0
    while True:
        number += 1
        final = uploads / (base if number == 1 else f"{base}-{number}")
        if final.exists() or final.is_symlink():
            continue
        try:
            os.rename(staging, final)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                continue
            raise
        os.chmod(final, 0o755)
        return final


def _mib(size: int) -> str:
    return f"{size / 2**20:g} MiB"
