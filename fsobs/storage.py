"""Where run files live: local paths, or fsspec URLs (``s3://``, ``gs://``, ``http(s)://``, ...).

A local path stays a :class:`~pathlib.Path` and keeps the plain file calls. A URL (any
``protocol://``; ``file://`` is turned back into a local path) becomes a :class:`RemotePath`,
opened through fsspec, which is imported only then. Remote files are read as streams: nothing
here reads a whole remote file unless :func:`read_bytes` or :func:`read_text` is asked to (the
small ``run.json`` and sidecars; traces are read piece by piece, even when a layout that
defeats the streaming reader makes the worker that parses one gather its whole text).

Credentials and options come from each filesystem's own configuration: for ``s3://`` (s3fs)
the usual ``AWS_*`` variables and ``~/.aws``, for ``gs://`` (gcsfs) Google's default
credentials, and fsspec's ``FSSPEC_<PROTOCOL>_<OPTION>`` variables for any protocol.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Protocol, cast
from urllib.parse import unquote, urlparse

__all__ = [
    "Entry",
    "Location",
    "Readable",
    "RemotePath",
    "as_location",
    "is_url",
    "list_dir",
    "open_binary",
    "open_local",
    "read_bytes",
    "read_text",
]

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
_STREAMED = ("http", "https")  # opened as one streamed response: no range requests needed
_BLOCK = 8 * 2**20  # read-ahead block of the other filesystems


@dataclass(frozen=True)
class RemotePath:
    """A file or folder behind an fsspec URL. Pure: nothing is read until it is opened.

    It has the few :class:`~pathlib.Path` members the loader uses (``name``, ``parent``, ``/``),
    so a rank's ``path`` is either kind; ``str()`` gives the URL.
    """

    url: str
    """The URL, without a trailing ``/``."""

    def __post_init__(self) -> None:
        if not _URL.match(self.url):
            raise ValueError(f"not a URL: {self.url!r}")
        root = _URL.match(self.url).end()  # type: ignore[union-attr]  # matched just above
        if len(self.url) > root + 1 and self.url.endswith("/"):
            object.__setattr__(self, "url", self.url.rstrip("/"))

    def __str__(self) -> str:
        return self.url

    def __truediv__(self, name: str) -> RemotePath:
        return RemotePath(f"{self.url}/{name}")

    def __lt__(self, other: RemotePath) -> bool:
        return self.url < other.url

    @property
    def protocol(self) -> str:
        return _URL.match(self.url).group(1).lower()  # type: ignore[union-attr]  # by __post_init__

    @property
    def name(self) -> str:
        """The last segment, URL-decoded (``rank0.json.gz``)."""
        return unquote(self.url.rsplit("/", 1)[-1])

    @property
    def parent(self) -> RemotePath:
        head = self.url.rsplit("/", 1)[0]
        return self if head.endswith((":/", "://")) else RemotePath(head)

    def is_dir(self) -> bool:
        """Whether the URL lists as a folder (one request; over HTTP, a GET of the URL)."""
        fs, path = _fs(self)
        with _io_errors():
            return bool(fs.isdir(path))

    def is_file(self) -> bool:
        """Whether the URL is a file (one request)."""
        fs, path = _fs(self)
        with _io_errors():
            return bool(fs.isfile(path))


Location = Path | RemotePath
"""A local path or a remote URL."""


@dataclass(frozen=True)
class Entry:
    """One item of a folder listing."""

    location: Location
    is_dir: bool
    size: int | None
    """Bytes, None when the listing does not say (HTTP)."""
    mtime_ns: int | None
    """Last modification, None when the listing does not say."""


def is_url(text: str | Path) -> bool:
    """Whether ``text`` is a URL (``protocol://...``) rather than a local path."""
    return isinstance(text, str) and bool(_URL.match(text))


def as_location(source: str | Path | RemotePath) -> Location:
    """A local path for paths and ``file://`` URLs, a :class:`RemotePath` for other URLs."""
    if isinstance(source, (Path, RemotePath)):
        return source
    if not is_url(source):
        return Path(source)
    if source.lower().startswith("file://"):
        return Path(unquote(urlparse(source).path))
    return RemotePath(source)


class Readable(Protocol):
    """What :func:`open_binary` gives: a binary stream, read front to back."""

    def read(self, size: int = -1, /) -> bytes: ...


@contextmanager
def open_binary(location: Location) -> Iterator[Readable]:
    """The file, opened for reading as a stream (HTTP: one GET, no range requests).

    A local file must be a regular file: a FIFO, a device (``/dev/zero``) or a folder is an
    :class:`OSError` saying so, raised at once (a FIFO is opened without waiting for a writer).
    """
    if isinstance(location, Path):
        with open_local(location) as f:
            yield f
        return
    fs, path = _fs(location)
    block = 0 if location.protocol in _STREAMED else _BLOCK
    with _io_errors():
        handle = fs.open(path, "rb", block_size=block)
    try:
        yield _Checked(handle)
    finally:
        with suppress(Exception):  # closing a read stream: nothing to lose
            handle.close()


_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
}


def open_local(path: Path) -> IO[bytes]:
    """``path`` opened for reading, if it is a regular file (checked on the open file, so that
    nothing can swap it in between); else OSError naming what it is."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "a special file")
            raise OSError(errno.EINVAL, f"not a regular file ({kind})", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(location: Location) -> bytes:
    """The whole file (OSError when it cannot be read, or is not a regular file)."""
    with open_binary(location) as f:
        return f.read()


def read_text(location: Location) -> str:
    """The whole file as UTF-8 text (OSError, UnicodeDecodeError)."""
    return read_bytes(location).decode("utf-8")


def list_dir(folder: RemotePath, *, fresh: bool = False) -> list[Entry]:
    """The URL folder's files and subfolders, sorted by name (FileNotFoundError when missing);
    ``fresh`` drops fsspec's cached listing first. (A local folder is listed by
    :func:`fsobs.runformat.run_files`, which also sorts out its links and special files.)"""
    fs, path = _fs(folder)
    with _io_errors():
        if fresh:
            fs.invalidate_cache(path)
        listed = fs.ls(path + "/" if folder.protocol in _STREAMED else path, detail=True)
    entries = {}
    for item in listed:
        name = str(item["name"]).rstrip("/").rsplit("/", 1)[-1]
        if not name or name in (".", ".."):
            continue
        entries[name] = Entry(
            location=folder / name,
            is_dir=item.get("type") == "directory",
            size=item.get("size"),
            mtime_ns=_mtime_ns(item),
        )
    return [entries[n] for n in sorted(entries)]


def _mtime_ns(item: dict[str, Any]) -> int | None:
    """The modification time of a listing entry: the key differs across filesystems."""
    for key in ("mtime", "LastModified", "updated", "last_modified", "created"):
        value: object = item.get(key)
        if isinstance(value, (int, float)):
            return int(value * 1e9)
        if hasattr(value, "timestamp"):
            return int(value.timestamp() * 1e9)
        if isinstance(value, str):
            try:
                return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1e9)
            except ValueError:
                continue
    return None


def check_protocol(location: RemotePath) -> None:
    """ImportError, saying what to install, when the URL's filesystem is not available here."""
    _fs(location)


def _fs(location: RemotePath) -> tuple[Any, str]:
    """(fsspec filesystem, path within it); a clear ImportError when fsspec is missing."""
    try:
        from fsspec.core import url_to_fs
    except ImportError as exc:
        raise ImportError(
            f"reading {location.protocol}:// URLs needs fsspec: pip install 'freescale[cluster]'"
        ) from exc
    try:
        return cast(tuple[Any, str], url_to_fs(location.url))  # fsspec is untyped
    except ImportError as exc:  # the protocol's own package (s3fs, gcsfs, ...) is missing
        raise ImportError(f"{location.protocol}:// URLs: {exc}") from exc
    except ValueError as exc:  # "Protocol not known"
        raise ImportError(f"{location.protocol}:// URLs are not supported: {exc}") from exc


@contextmanager
def _io_errors() -> Iterator[None]:
    """Filesystems raise their own types (aiohttp, botocore, ...): make every failure an
    OSError, so callers handle remote and local files alike."""
    try:
        yield
    except OSError:
        raise
    except ImportError:
        raise
    except Exception as exc:
        raise OSError(f"{type(exc).__name__}: {exc}") from exc


class _Checked:
    """A remote file whose read errors are OSErrors (see :func:`_io_errors`)."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f

    def read(self, size: int = -1) -> bytes:
        with _io_errors():
            return self._f.read(size)
