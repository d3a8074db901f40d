"""Files sent to ``/_stcore/upload_file`` are refused before they are read unless the session
was shown the uploader, and only so many are held (issue 35, point 1: a session that had not
passed the login could still fill the server's memory).

The middleware is driven as the server drives it (ASGI calls, here through Starlette's test
client over a small app that keeps what it is sent the way Streamlit's route does), and once
through the real ``fsobs dashboard --auth token`` server."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from dashboard import upload_guard
from dashboard.upload_guard import (
    MAX_HELD_BYTES,
    MAX_HELD_FILES,
    MAX_SERVER_HELD_BYTES,
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    UploadGuard,
)
from tests.support.launcher import FsobsDashboard

MiB = 2**20


class Kept:
    """The app behind the guard: it keeps what it is sent, per session, the way Streamlit's
    uploaded-file store holds it (plus files said to be held already: ``preset``)."""

    def __init__(self) -> None:
        self.files: dict[str, list[int]] = {}
        self.preset: dict[str, tuple[int, int]] = {}

    def held(self) -> dict[str, tuple[int, int]]:
        out = {}
        for sid in set(self.files) | set(self.preset):
            files, size = self.preset.get(sid, (0, 0))
            sizes = self.files.get(sid, [])
            out[sid] = (files + len(sizes), size + sum(sizes))
        return out

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        session = str(scope["path"]).split("/upload_file/")[1].split("/")[0]
        self.files.setdefault(session, []).append(len(body))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


@pytest.fixture
def kept() -> Iterator[Kept]:
    yield Kept()
    upload_guard.forget(upload_guard.known_sessions())


def put(
    app: ASGIApp, path: str, body: bytes, *, length: int | None = -1, method: str = "PUT"
) -> tuple[int, str]:
    """One request through ``app`` as the server makes it; its status and text. ``length``:
    the Content-Length header (default: the body's; None: no header)."""
    return asyncio.run(call(app, path, body, length=length, method=method))


async def call(
    app: ASGIApp, path: str, body: bytes, *, length: int | None = -1, method: str = "PUT"
) -> tuple[int, str]:
    length = len(body) if length == -1 else length
    headers = [] if length is None else [(b"content-length", str(length).encode())]
    scope = {"type": "http", "method": method, "path": path, "headers": headers}
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    text = b"".join(m.get("body", b"") for m in sent[1:]).decode()
    return int(sent[0]["status"]), text


ROUTE = "/_stcore/upload_file"


def test_a_session_not_shown_the_uploader_is_refused_unread(kept: Kept):
    status, text = put(UploadGuard(kept, held=kept.held), f"{ROUTE}/s1/f1", b"x" * 1000)
    assert (status, "may not upload" in text) == (403, True)
    assert kept.files == {}  # the app behind never saw it
    # another method is not the guard's business
    assert put(UploadGuard(kept, held=kept.held), f"{ROUTE}/s1/f1", b"", method="GET")[0] == 204


def test_a_session_shown_the_uploader_may_send_files(kept: Kept):
    upload_guard.allow_uploads("s1")
    guard = UploadGuard(kept, held=kept.held)
    assert put(guard, f"{ROUTE}/s1/f1", b"x" * 1000)[0] == 204
    assert put(guard, f"{ROUTE}/s1/f2", b"y" * 10)[0] == 204
    assert kept.files == {"s1": [1000, 10]}
    assert upload_guard.refused_note("s1") is None
    # a base URL path in front of the route changes nothing
    assert put(guard, f"/team{ROUTE}/s2/f1", b"z")[0] == 403
    assert put(guard, f"/team{ROUTE}/s1/f3", b"z")[0] == 204


def test_the_files_past_the_sessions_cap_are_refused_and_said(kept: Kept):
    upload_guard.allow_uploads("s1")
    kept.preset["s1"] = (MAX_HELD_FILES - 1, 0)
    guard = UploadGuard(kept, held=kept.held)
    assert put(guard, f"{ROUTE}/s1/a", b"1")[0] == 204  # the 1024th
    assert put(guard, f"{ROUTE}/s1/b", b"2")[0] == 413
    assert put(guard, f"{ROUTE}/s1/c", b"3")[0] == 413
    assert upload_guard.refused_note("s1") == (
        f"2 file(s) refused by the server: the uploader holds at most {MAX_HELD_FILES} files"
    )
    assert upload_guard.refused_note("s1") is None  # said once


def test_the_bytes_past_the_sessions_cap_are_refused(kept: Kept):
    upload_guard.allow_uploads("s1")
    # 64 KiB of multipart framing is allowed beyond the cap: 4096 bytes are left here
    kept.preset["s1"] = (1, MAX_HELD_BYTES + 64 * 2**10 - 4096)
    guard = UploadGuard(kept, held=kept.held)
    assert put(guard, f"{ROUTE}/s1/a", b"x" * 1000)[0] == 204  # 3096 left
    assert put(guard, f"{ROUTE}/s1/b", b"x" * 3097)[0] == 413
    assert upload_guard.refused_note("s1") == (
        f"1 file(s) refused by the server: the uploader holds at most {MAX_HELD_BYTES // MiB} "
        "MiB in all"
    )
    assert put(guard, f"{ROUTE}/s1/c", b"x" * 3096)[0] == 204


def test_the_servers_cap_counts_every_session(kept: Kept):
    upload_guard.allow_uploads("s1")
    kept.preset = {"other": (3, MAX_SERVER_HELD_BYTES - 500)}  # another session's files
    status, text = put(UploadGuard(kept, held=kept.held), f"{ROUTE}/s1/a", b"x" * 501)
    assert (status, "try again later" in text) == (503, True)
    assert put(UploadGuard(kept, held=kept.held), f"{ROUTE}/s1/a", b"x" * 500)[0] == 204


def test_requests_still_arriving_count_and_no_length_is_refused(kept: Kept):
    """Requests of one session at once: each counts the bytes of those still arriving, before
    they are held; a request without Content-Length is refused (411)."""
    upload_guard.allow_uploads("s1")
    kept.preset["s1"] = (0, MAX_HELD_BYTES - 6 * MiB)
    first_inside, release = asyncio.Event(), asyncio.Event()

    async def slow(scope: Scope, receive: Receive, send: Send) -> None:
        first_inside.set()
        await release.wait()
        await kept(scope, receive, send)

    guard = UploadGuard(slow, held=kept.held)

    async def together() -> tuple[int, ...]:
        first = asyncio.create_task(call(guard, f"{ROUTE}/s1/a", b"", length=4 * MiB))
        await first_inside.wait()
        second = await call(guard, f"{ROUTE}/s1/b", b"", length=4 * MiB)  # 4 + 4 > 6 MiB left
        small = asyncio.create_task(call(guard, f"{ROUTE}/s1/c", b"", length=MiB))  # 4 + 1 fits
        await asyncio.sleep(0)
        unsized = await call(guard, f"{ROUTE}/s1/d", b"", length=None)
        release.set()
        return (await first)[0], second[0], (await small)[0], unsized[0]

    assert asyncio.run(together()) == (204, 413, 204, 411)


@pytest.mark.slow
def test_the_real_server_refuses_a_session_that_has_not_signed_in(tmp_path: Path):
    """``fsobs dashboard --auth token``: a PUT for a session that never passed the gate is
    answered 403 at once, before the server reads its (announced 600 MiB) body."""
    with FsobsDashboard(tmp_path, "--auth", "token") as app:
        request = urllib.request.Request(
            f"{app.url}/_stcore/upload_file/some-session/some-file",
            data=b"x" * 4096,
            method="PUT",
            headers={"Content-Length": str(600 * MiB)},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 403
        assert "may not upload" in refused.value.read().decode()
