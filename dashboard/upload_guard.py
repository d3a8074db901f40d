"""Who may send files to the server, and how many: refused before the server reads them.

A browser sends each file chosen in a ``st.file_uploader`` to ``PUT
/_stcore/upload_file/<session id>/<file id>``, and Streamlit keeps it in the server's memory
for that session. Streamlit accepts such a request from any connected session, one that has
not passed the login gate (:mod:`dashboard.auth`) included, and caps only each file
(``server.maxUploadSize``), not how many a session or the server holds. :class:`UploadGuard`,
an ASGI middleware that ``fsobs dashboard``'s server puts in front of Streamlit's routes
(:func:`install`, called by ``dashboard/serve.py``), answers such a request before its body is
read:

- **403** unless the session was shown the uploader (:func:`allow_uploads`, called by the Runs
  page's upload form, which is drawn only past the gate and only for a writable store);
- **411** without a ``Content-Length`` (a browser's uploader always sends one, and the server
  reads no more body than it says);
- **413** when the session would hold more than :data:`MAX_HELD_FILES` files or
  :data:`MAX_HELD_BYTES` bytes, counting the requests still arriving;
- **503** when every session together would hold more than :data:`MAX_SERVER_HELD_BYTES`.

A refused file is counted for its session, and the Runs page says so (:func:`refused_note`).
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from streamlit.runtime import Runtime

from dashboard.upload import MAX_UPLOAD_BYTES

MAX_HELD_FILES = 1024
"""Most files a session's uploader holds (a run of 256 ranks with its sidecars has 513)."""
MAX_HELD_BYTES = MAX_UPLOAD_BYTES
"""Most bytes a session's uploader holds, all files together: a valid upload is no larger
(its limit counts the files' text, which their compression only makes smaller)."""
MAX_SERVER_HELD_BYTES = 4 * MAX_HELD_BYTES
"""Most bytes the uploaders of every session hold together."""
FRAMING_BYTES = 64 * 2**10
"""What a request may carry beyond its file: the multipart form's boundaries and headers."""
UPLOAD_ROUTE = "/_stcore/upload_file/"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Held = Callable[[], dict[str, tuple[int, int]]]
"""Per session id, the files and bytes its uploader holds now."""


@dataclass
class _Ledger:
    """The sessions allowed to upload, the requests in flight and the files refused."""

    allowed: set[str] = field(default_factory=set)
    arriving: dict[str, tuple[int, int]] = field(default_factory=dict)
    refused: dict[str, tuple[int, str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_LEDGER = _Ledger()


def allow_uploads(session_id: str) -> None:
    """Let this session send files (its page shows the uploader)."""
    with _LEDGER.lock:
        _LEDGER.allowed.add(session_id)


def forget(session_ids: set[str]) -> None:
    """Drop what is known of sessions that ended."""
    with _LEDGER.lock:
        _LEDGER.allowed -= session_ids
        for session_id in session_ids:
            _LEDGER.refused.pop(session_id, None)


def known_sessions() -> set[str]:
    """The sessions allowed to upload or with refused files (for :func:`forget`)."""
    with _LEDGER.lock:
        return _LEDGER.allowed | set(_LEDGER.refused)


def refused_note(session_id: str) -> str | None:
    """The line that says which of this session's files the server refused since it was last
    asked (then forgotten), or None."""
    with _LEDGER.lock:
        count, reason = _LEDGER.refused.pop(session_id, (0, ""))
    return f"{count} file(s) refused by the server: {reason}" if count else None


def held_in_runtime() -> dict[str, tuple[int, int]]:
    """Per session, the files and bytes Streamlit's uploaded-file store holds (empty before
    the runtime starts)."""
    if not Runtime.exists():
        return {}
    storage = getattr(Runtime.instance().uploaded_file_mgr, "file_storage", {})
    return {
        sid: (len(files), sum(len(f.data) for f in files.values()))
        for sid, files in list(storage.items())
    }


class UploadGuard:
    """The ASGI middleware (see the module's docstring)."""

    def __init__(self, app: ASGIApp, held: Held = held_in_runtime) -> None:
        self.app = app
        self.held = held

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope["type"] != "http" or scope.get("method") != "PUT" or UPLOAD_ROUTE not in path:
            await self.app(scope, receive, send)
            return
        session_id = path.split(UPLOAD_ROUTE, 1)[1].split("/", 1)[0]
        refusal = self._admit(session_id, _content_length(scope))
        if refusal is not None:
            await _answer(send, *refusal)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self._arrived(session_id, _content_length(scope) or 0)

    def _admit(self, session_id: str, length: int | None) -> tuple[int, str] | None:
        """None, the request's length reserved for the session; else the refusal."""
        held = self.held()
        with _LEDGER.lock:
            if session_id not in _LEDGER.allowed:
                return 403, "this session may not upload (not signed in, or uploads are off)"
            if length is None:
                return 411, "an upload needs a Content-Length"
            files, size = held.get(session_id, (0, 0))
            coming_files, coming = _LEDGER.arriving.get(session_id, (0, 0))
            refusal: tuple[int, str] | None = None
            if files + coming_files + 1 > MAX_HELD_FILES:
                refusal = 413, f"the uploader holds at most {MAX_HELD_FILES} files"
            elif size + coming + length > MAX_HELD_BYTES + FRAMING_BYTES:
                refusal = 413, f"the uploader holds at most {MAX_HELD_BYTES // 2**20} MiB in all"
            else:
                total = sum(b for _, b in held.values())
                total += sum(b for _, b in _LEDGER.arriving.values())
                if total + length > MAX_SERVER_HELD_BYTES:
                    refusal = 503, "the server holds too many uploads now; try again later"
            if refusal is not None:
                count, _ = _LEDGER.refused.get(session_id, (0, ""))
                _LEDGER.refused[session_id] = (count + 1, refusal[1])
                return refusal
            _LEDGER.arriving[session_id] = (coming_files + 1, coming + length)
            return None

    def _arrived(self, session_id: str, length: int) -> None:
        """The request is over: its bytes are held by Streamlit now (or were refused there)."""
        with _LEDGER.lock:
            files, size = _LEDGER.arriving.pop(session_id, (0, 0))
            if files > 1:
                _LEDGER.arriving[session_id] = (files - 1, size - length)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                length = int(value)
            except ValueError:
                return None
            return length if length >= 0 else None
    return None


async def _answer(send: Send, status: int, text: str) -> None:
    body = text.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install() -> None:
    """Put :class:`UploadGuard` in front of Streamlit's routes in this process (before the
    server starts; ``dashboard/serve.py``)."""
    from starlette.middleware import Middleware
    from streamlit.web.server.starlette import starlette_app

    streamlit_middleware = starlette_app.create_streamlit_middleware
    if getattr(streamlit_middleware, "fsobs_guarded", False):
        return

    def guarded() -> list[Middleware]:
        return [Middleware(UploadGuard), *streamlit_middleware()]

    guarded.fsobs_guarded = True  # type: ignore[attr-defined]
    starlette_app.create_streamlit_middleware = guarded
