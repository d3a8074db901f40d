"""Store an uploaded run safely (plain functions, no Streamlit).

An upload is several run files (Kineto traces ``*.json`` / ``*.json.gz``, ``run.json``, step
sidecars ``steps.rank<R>.jsonl``) or one ``.zip`` / ``.tar.gz`` / ``.tgz`` archive of them. Steps:

1. create a hidden staging directory ``<store>/uploads/.upload-XXXX`` (the store never lists it);
2. copy the files in, or extract the archive's members **flattened to their base names**, only
   the allowed types (other members are skipped and reported). An archive is refused whole if a
   member has an absolute path or ``..``, is a symbolic or hard link, a device or FIFO, or is
   encrypted; two files with the same name are refused;
3. count bytes against :data:`MAX_UPLOAD_BYTES` (uncompressed, all files together): the sizes the
   archive declares before extracting, and the text of the files actually written while
   streaming, a gzip trace's (``.json.gz``, uploaded or in an archive) inflated to count it
   (:class:`_Text`), so a decompression bomb of either layer stops at the limit. What the
   archive readers would hold in memory is refused by its declared size before it is read: a
   zip's central directory beyond :data:`MAX_ZIP_DIRECTORY_BYTES`, tar extension headers (GNU
   long names, pax) beyond :data:`MAX_TAR_METADATA_BYTES` in all (global pax headers, applied
   to every member, beyond :data:`MAX_TAR_GLOBAL_BYTES`) or more than
   :data:`MAX_TAR_HEADERS_IN_A_ROW` before one member, and GNU sparse members (their maps are
   read whole);
4. validate: load and analyze the staged run with fsobs, no trace read past the limit
   (:func:`analyze_upload`); any :class:`~fsobs.errors.FsobsError` becomes an
   :class:`UploadError` with its one-line message;
5. ``os.rename`` the staging directory to ``uploads/<name>``, ``<name>-2``, ``<name>-3``, ... (the
   first that does not exist: a stored run is never overwritten).

On any failure the staging directory is removed (and ``uploads/`` too if this upload created
it and it is empty), so the store is left as it was; a failure of the store itself (a full disk,
no permission) is an :class:`UploadError` too, naming the file. Uploads may run concurrently:
each stages in its own folder, and one that finds ``uploads/`` removed by a failed upload
between creating it and staging in it creates it again (a concurrent failure may leave an empty
``uploads/`` behind; it holds no run).

Every message is one line: archive readers' multi-line messages are joined.
"""

from __future__ import annotations

import errno
import io
import lzma
import os
import re
import shutil
import stat
import struct
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO

from fsobs import Analysis, FsobsError, LoadConfig, analyze_path
from fsobs.runformat import is_run_file, is_trace_name
from fsobs.trace import GZIP_MAGIC

MAX_UPLOAD_BYTES = 512 * 2**20
"""Largest upload, uncompressed, all files together."""
UPLOADER_MB = -(-MAX_UPLOAD_BYTES // 10**6)
"""The uploader widget's per-file limit, in Streamlit's megabytes, which browsers count as
10**6 bytes (2**20 on Windows): the smallest that admits a file of :data:`MAX_UPLOAD_BYTES`
everywhere. The server's own cap is ``server.maxUploadSize`` (MiB) in
``dashboard/.streamlit/config.toml``; this module applies the rule itself."""
MAX_MEMBERS = 4096
"""Most entries an archive may have (directories and skipped members included)."""
MAX_ZIP_DIRECTORY_BYTES = 8 * 2**20
"""Largest central directory of a .zip (zipfile reads it whole, then makes an object per entry)."""
MAX_TAR_METADATA_BYTES = 2**20
"""Most bytes of tar extension headers (GNU long names and links, pax headers), all together
(4096 members with 256 bytes each): tarfile reads each one whole into memory, keeps every pax
record as a Python string, and parses pax headers slowly."""
MAX_TAR_GLOBAL_BYTES = 2**10
"""Most bytes of global pax headers, all together (tarfile copies them into every member)."""
MAX_TAR_HEADERS_IN_A_ROW = 8
"""Most extension headers before one member (tarfile reads each chain recursively)."""
UPLOADS = "uploads"
ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz")
_CHUNK = 1 << 20
_MAX_NAME = 64
_STAGING_TRIES = 100
_ARCHIVE_ERRORS = (
    zipfile.BadZipFile,
    tarfile.TarError,
    OSError,
    EOFError,
    zlib.error,
    lzma.LZMAError,
    NotImplementedError,  # a zip compression method zipfile lacks
    ValueError,  # a name that is not UTF-8, a pax number too long for int(), ...
)
"""What zipfile, tarfile and their decompressors raise on a damaged archive."""

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
            raise UploadError(f"{what}: the upload is larger than {_size(self.limit)} uncompressed")

    def take(self, size: int, what: str) -> None:
        self.written += size
        if self.written > self.limit:
            raise UploadError(f"{what}: the upload is larger than {_size(self.limit)} uncompressed")


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


def is_archive(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def store_upload(
    store: Path,
    files: Sequence[tuple[str, IO[bytes]]],
    name: str | None = None,
    *,
    limit: int = MAX_UPLOAD_BYTES,
    validate: Validator | None = None,
) -> StoredUpload:
    """Validate the uploaded files (name, binary stream) and store them as a new run;
    ``validate`` (default :func:`analyze_upload` under ``limit``) is given the staged folder.

    Raises :class:`UploadError` (and leaves the store unchanged) when anything is wrong,
    the store itself included (a full disk, no permission).
    """
    if not files:
        raise UploadError("no file was uploaded")
    archives = [n for n, _ in files if is_archive(n)]
    if archives and len(files) > 1:
        raise UploadError("upload either trace files or one archive, not both")
    base = sanitize_name(name or (files[0][0] if archives else "upload"))
    uploads = store / UPLOADS
    try:
        folder, created = _make_staging(uploads)
    except OSError as exc:
        raise _store_error(UPLOADS, exc) from None
    staged = _Staged(folder, _Budget(limit))
    try:
        if archives:
            _extract_archive(files[0], staged)
        else:
            for file_name, stream in files:
                _copy_file(file_name, stream, staged)
        _validate(staged, validate or partial(analyze_upload, limit=limit))
        final = _commit(staged.folder, uploads, base)
    except OSError as exc:  # the store's own failures: renaming, validating what was written
        _discard(staged.folder, uploads if created else None)
        raise _store_error(UPLOADS, exc) from None
    except BaseException:
        _discard(staged.folder, uploads if created else None)
        raise
    return StoredUpload(
        run_id=f"{UPLOADS}/{final.name}",
        path=final,
        files=tuple(sorted(staged.files)),
        skipped=tuple(staged.skipped),
    )


def analyze_upload(folder: Path, limit: int = MAX_UPLOAD_BYTES) -> Analysis:
    """The analysis of a staged upload, no trace read past ``limit`` bytes of text (the
    upload's own limit: the loader's default is for the user's own runs)."""
    return analyze_path(folder, LoadConfig(max_trace_bytes=limit))


def _make_staging(uploads: Path) -> tuple[Path, bool]:
    """A new hidden staging folder in ``uploads``, and whether this call created ``uploads``.

    A failed upload removes the ``uploads`` it created once it is empty; when that happens
    between this call's creating (or finding) ``uploads`` and staging in it, both are tried again.
    """
    uploads.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(_STAGING_TRIES):
        try:
            uploads.mkdir()
            created = True
        except FileExistsError:
            created = False
        try:
            return Path(tempfile.mkdtemp(prefix=".upload-", dir=uploads)), created
        except FileNotFoundError:
            continue
    raise UploadError(f"{UPLOADS}: keeps vanishing while the upload is staged; try again")


def _discard(staging: Path, created_uploads: Path | None) -> None:
    """Remove a failed upload's staging folder, and ``uploads`` if it created it and it is empty
    (``rmdir`` refuses a folder that another upload has staged in meanwhile)."""
    shutil.rmtree(staging, ignore_errors=True)
    if created_uploads is not None:
        try:
            created_uploads.rmdir()
        except OSError:
            pass


def _store_error(what: str, exc: OSError) -> UploadError:
    """The store could not take the upload (``exc.strerror``, not the path: the staging folder
    is not the user's business)."""
    reason = exc.strerror or _one_line(exc)
    return UploadError(f"{what}: the run store refused it ({reason}); nothing was stored")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _copy_file(raw_name: str, stream: IO[bytes], staged: _Staged) -> None:
    name = raw_name.replace("\\", "/").rsplit("/", 1)[-1]
    if not is_run_file(name):
        raise UploadError(
            f"{name}: not a run file (expected *.json, *.json.gz traces, run.json or "
            "steps.rank<R>.jsonl), or upload one .zip / .tar.gz archive"
        )
    _write(name, stream, staged)


def _write(name: str, stream: IO[bytes], staged: _Staged) -> None:
    """Stream into ``folder/name``, counting every byte against the budget. A failure to write
    (a full disk) is an :class:`UploadError` naming the file; one to read is the caller's."""
    target = staged.folder / name
    if target.exists():
        raise UploadError(f"{name}: two files of the upload have this name")
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as exc:
        raise _store_error(name, exc) from None
    text = _Text(name, staged.budget)
    try:
        while chunk := stream.read(_CHUNK):
            text.count(chunk)
            _write_all(fd, chunk, name)
    finally:
        os.close(fd)
    staged.files.append(name)


class _Text:
    """Counts the text a file holds against the budget as its bytes arrive: a gzip file (by its
    first bytes, as the loader tells one) is inflated a piece at a time just to count its text,
    every member of it; any other file counts as it is. A file whose gzip is damaged stops
    being counted: the loader refuses it, reading no more than the limit either."""

    def __init__(self, name: str, budget: _Budget) -> None:
        self._name = name
        self._budget = budget
        self._inflater: zlib._Decompress | None = None
        self._kind: str | None = None  # "gzip", "plain" or "damaged", from the first bytes

    def count(self, data: bytes) -> None:
        if self._kind is None:
            self._kind = "gzip" if data.startswith(GZIP_MAGIC) else "plain"
        if self._kind == "plain":
            self._budget.take(len(data), self._name)
        elif self._kind == "gzip":
            self._inflate(data)

    def _inflate(self, data: bytes) -> None:
        while data:
            if self._inflater is None or self._inflater.eof:
                data = data.lstrip(b"\x00")  # padding between members
                if not data:
                    return
                self._inflater = zlib.decompressobj(wbits=31)
            try:
                text = self._inflater.decompress(data, _CHUNK)
            except zlib.error:
                self._kind = "damaged"
                return
            self._budget.take(len(text), self._name)
            data = self._inflater.unconsumed_tail or self._inflater.unused_data


def _write_all(fd: int, data: bytes, name: str) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except OSError as exc:
            raise _store_error(name, exc) from None


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
        _check_zip_directory(file_name, stream)
        archive = zipfile.ZipFile(stream)
    except UploadError:
        raise
    except _ARCHIVE_ERRORS as exc:
        raise UploadError(f"{file_name}: not a valid .zip archive ({_one_line(exc)})") from None
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
            except UploadError:
                raise
            except _ARCHIVE_ERRORS as exc:
                raise UploadError(f"{info.filename}: cannot extract ({_one_line(exc)})") from None


def _check_zip_directory(file_name: str, stream: IO[bytes]) -> None:
    """Refuse a zip whose end record declares more than :data:`MAX_MEMBERS` entries or a central
    directory over :data:`MAX_ZIP_DIRECTORY_BYTES`, before zipfile reads it
    (:func:`_zip_end_record`: the numbers zipfile goes by)."""
    end = _zip_end_record(stream)
    if end is None:
        return  # zipfile.ZipFile says why
    entries, size = end
    if entries > MAX_MEMBERS:
        raise UploadError(f"{file_name}: more than {MAX_MEMBERS} entries")
    if size > MAX_ZIP_DIRECTORY_BYTES:
        raise UploadError(
            f"{file_name}: its central directory declares {_size(size)} "
            f"(at most {_size(MAX_ZIP_DIRECTORY_BYTES)})"
        )


_EOCD = struct.Struct("<4s4H2LH")
"""End of central directory record (APPNOTE 4.3.16): signature, disk numbers, entries on this
disk, entries in all, directory size, directory offset, comment length."""
_EOCD64_LOCATOR = struct.Struct("<4sLQL")
"""Zip64 end of central directory locator (4.3.15): signature, disk, record offset, disks
(zipfile finds the record just before the locator, not at the offset)."""
_EOCD64 = struct.Struct("<4sQ2H2L4Q")
"""Zip64 end of central directory record (4.3.14): signature, record size, versions, disk
numbers, entries on this disk, entries in all, directory size, directory offset."""
_MAX_COMMENT = 2**16 - 1


def _zip_end_record(stream: IO[bytes]) -> tuple[int, int] | None:
    """(entries in all, central directory bytes) as a zip's end record declares them, found the
    way zipfile finds it (``zipfile._EndRecData``): the record at the very end, else the last
    signature in the last 64 KiB + 22 bytes; a zip64 record just before its locator, just
    before that record, takes its place. None when there is no end record (not a zip)."""
    file_size = stream.seek(0, io.SEEK_END)
    start = max(file_size - _MAX_COMMENT - _EOCD.size, 0)
    stream.seek(start)
    tail = stream.read()
    at = len(tail) - _EOCD.size
    if not (at >= 0 and tail[at : at + 4] == b"PK\x05\x06" and tail[-2:] == b"\0\0"):
        at = tail.rfind(b"PK\x05\x06")  # a record followed by a comment
        if at < 0 or len(tail) - at < _EOCD.size:
            return None
    fields = _EOCD.unpack_from(tail, at)
    entries, size = fields[4], fields[5]
    record_at = start + at - _EOCD64_LOCATOR.size - _EOCD64.size
    if record_at >= 0:
        stream.seek(record_at)
        record, locator = stream.read(_EOCD64.size), stream.read(_EOCD64_LOCATOR.size)
        if locator[:4] == b"PK\x06\x07" and record[:4] == b"PK\x06\x06":
            entries, size = _EOCD64.unpack(record)[7:9]
    stream.seek(0)
    return entries, size


def _check_zip_member(info: zipfile.ZipInfo) -> None:
    _member_name(info.filename)
    kind = stat.S_IFMT(info.external_attr >> 16)  # 0 when the archiver wrote no file type
    if kind == stat.S_IFLNK:
        raise UploadError(f"archive member {info.filename!r}: links are not allowed")
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise UploadError(f"archive member {info.filename!r}: not a regular file")
    if info.flag_bits & 0x1:
        raise UploadError(f"archive member {info.filename!r}: encrypted members are not allowed")


_TAR_EXTENSIONS = {
    tarfile.GNUTYPE_LONGNAME: "GNU long name",
    tarfile.GNUTYPE_LONGLINK: "GNU long link",
    tarfile.XHDTYPE: "pax",
    tarfile.SOLARIS_XHDTYPE: "pax",
    tarfile.XGLTYPE: "global pax",
}


class _TarFile(tarfile.TarFile):
    """A reader that refuses, by their declared sizes and before reading them, the headers that
    tarfile would hold in memory or parse slowly (see :class:`_TarInfo`)."""

    metadata: int = 0
    """Bytes of extension headers declared so far."""
    global_metadata: int = 0
    in_a_row: int = 0
    """Extension headers being read before the current member."""


class _TarInfo(tarfile.TarInfo):
    """tarfile's member header, with limits: :data:`MAX_TAR_METADATA_BYTES`,
    :data:`MAX_TAR_GLOBAL_BYTES`, :data:`MAX_TAR_HEADERS_IN_A_ROW`; no negative size, no GNU
    sparse member. ``_proc_member`` is the hook tarfile documents for subclasses."""

    def _base_member(self, archive: tarfile.TarFile) -> tarfile.TarInfo:
        """tarfile's own ``_proc_member`` (typeshed leaves the documented hook out)."""
        member: tarfile.TarInfo = super()._proc_member(archive)  # type: ignore[misc]
        return member

    def _proc_member(self, archive: tarfile.TarFile) -> tarfile.TarInfo:
        assert isinstance(archive, _TarFile)
        if self.size < 0:  # base-256 sizes can be negative: tarfile would then read to the end
            raise UploadError(f"archive member {self.name!r}: its header declares a negative size")
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise _sparse(self.name)
        kind = _TAR_EXTENSIONS.get(self.type)
        if kind is None:
            return self._base_member(archive)
        archive.metadata += self.size
        if self.type == tarfile.XGLTYPE:
            archive.global_metadata += self.size
        if archive.metadata > MAX_TAR_METADATA_BYTES or (
            archive.global_metadata > MAX_TAR_GLOBAL_BYTES
        ):
            over_global = archive.global_metadata > MAX_TAR_GLOBAL_BYTES
            limit = MAX_TAR_GLOBAL_BYTES if over_global else MAX_TAR_METADATA_BYTES
            raise UploadError(
                f"archive member {self.name!r}: its {kind} header declares {_size(self.size)} "
                f"(at most {_size(limit)} of such headers in all)"
            )
        archive.in_a_row += 1
        try:
            if archive.in_a_row > MAX_TAR_HEADERS_IN_A_ROW:
                raise UploadError(
                    f"archive member {self.name!r}: more than {MAX_TAR_HEADERS_IN_A_ROW} "
                    "long-name or pax headers in a row"
                )
            return self._base_member(archive)
        finally:
            archive.in_a_row -= 1

    # pax headers of GNU sparse members: the 1.0 map is read from the data, unbounded
    def _proc_gnusparse_00(self, member: tarfile.TarInfo, *_: object) -> None:
        raise _sparse(member.name)

    def _proc_gnusparse_01(self, member: tarfile.TarInfo, *_: object) -> None:
        raise _sparse(member.name)

    def _proc_gnusparse_10(self, member: tarfile.TarInfo, *_: object) -> None:
        raise _sparse(member.name)


def _sparse(name: str) -> UploadError:
    return UploadError(f"archive member {name!r}: sparse files are not allowed")


def _extract_tar(file_name: str, stream: IO[bytes], staged: _Staged) -> None:
    try:  # gzip only: "r:*" would try four methods and join their four messages
        archive = _TarFile.open(fileobj=stream, mode="r:gz", tarinfo=_TarInfo)
    except UploadError:
        raise
    except _ARCHIVE_ERRORS as exc:
        raise UploadError(f"{file_name}: not a valid .tar.gz archive ({_one_line(exc)})") from None
    with archive:
        try:
            for count, member in enumerate(archive, start=1):
                if count > MAX_MEMBERS:
                    raise UploadError(f"{file_name}: more than {MAX_MEMBERS} entries")
                _extract_tar_member(archive, member, staged)
        except UploadError:
            raise
        except _ARCHIVE_ERRORS as exc:
            raise UploadError(f"{file_name}: cannot extract ({_one_line(exc)})") from None


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


def _size(size: int) -> str:
    """Bytes as people read them: ``1000 MiB``, ``64 KiB``, ``300 bytes``."""
    if size >= 2**20:
        return f"{size / 2**20:.4g} MiB"
    if size >= 2**10:
        return f"{size / 2**10:.4g} KiB"
    return f"{size} bytes"
