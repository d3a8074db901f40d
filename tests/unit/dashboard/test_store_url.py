"""A run store behind an fsspec URL: listed like a local one, read-only."""

from __future__ import annotations

import functools
import http.server
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dashboard.store import (
    folder_signature,
    is_read_only,
    list_runs,
    resolve_store,
)
from fsobs import analyze_path
from fsobs.report import to_json
from fsobs.storage import RemotePath
from tests.support.stores import RUN_IDS

fsspec = pytest.importorskip("fsspec")


def _copy_to_memory(local: Path, root: str) -> None:
    """The store's files (hidden folders, i.e. the analysis cache, left out) under ``root``."""
    fs = fsspec.filesystem("memory")
    for path in local.rglob("*"):
        rel = path.relative_to(local)
        if path.is_file() and not any(part.startswith(".") for part in rel.parts):
            fs.pipe(f"{root}/{rel.as_posix()}", path.read_bytes())


@pytest.fixture
def memory_store(shared_store: Path) -> Iterator[RemotePath]:
    root = f"/fsobs-store-{uuid.uuid4().hex[:8]}"
    _copy_to_memory(shared_store, root)
    yield RemotePath(f"memory:/{root}")
    fsspec.filesystem("memory").rm(root, recursive=True)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


@pytest.fixture
def http_store(shared_store: Path) -> Iterator[RemotePath]:
    """The store served by ``http.server`` on 127.0.0.1 (loopback only)."""
    handler = functools.partial(_Quiet, directory=str(shared_store))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield RemotePath(f"http://127.0.0.1:{server.server_port}/")
    server.shutdown()
    server.server_close()
    thread.join()


def test_resolve_store_takes_urls_and_they_are_read_only(tmp_path: Path) -> None:
    store = resolve_store(["--store", "s3://bucket/runs/"], {})
    assert store == RemotePath("s3://bucket/runs") and is_read_only(store)
    assert resolve_store([], {"FSOBS_STORE": f"file://{tmp_path}"}) == tmp_path.resolve()
    assert not is_read_only(resolve_store([], {"FSOBS_STORE": str(tmp_path)}))


@pytest.mark.parametrize("kind", ["memory", "http"])
def test_url_store_lists_the_runs_of_the_local_one(
    kind: str, shared_store: Path, request: pytest.FixtureRequest
) -> None:
    remote: RemotePath = request.getfixturevalue(f"{kind}_store")
    local = {e.run_id: e for e in list_runs(shared_store)}
    entries = list_runs(remote)
    assert tuple(e.run_id for e in entries) == RUN_IDS
    for entry in entries:
        want = local[entry.run_id]
        assert entry.path == remote / entry.run_id
        assert (entry.trace_files, entry.meta, entry.meta_error) == (
            want.trace_files,
            want.meta,
            want.meta_error,
        )
        if kind == "memory":  # HTTP listings tell no sizes
            assert entry.trace_bytes == want.trace_bytes


def test_url_store_run_analyzes_like_the_local_one(
    http_store: RemotePath, shared_store: Path
) -> None:
    entry = next(e for e in list_runs(http_store) if e.run_id == "sim/control")
    got, want = (
        to_json(analyze_path(entry.path)),
        to_json(analyze_path(shared_store / "sim/control")),
    )
    assert got["run"].pop("path") == str(http_store / "sim/control")
    want["run"].pop("path")
    assert got == want


def test_url_store_signature_follows_the_files(memory_store: RemotePath) -> None:
    folder = memory_store / "sim/control"
    before = folder_signature(folder)
    assert before == next(e for e in list_runs(memory_store) if e.path == folder).signature
    fsspec.filesystem("memory").pipe(
        f"{folder.url.removeprefix('memory:/')}/rank0.trace.json.gz", b"{}"
    )
    assert folder_signature(folder) != before


def test_the_app_on_a_url_store_lists_analyzes_and_offers_no_upload(
    http_store: RemotePath, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole app on an HTTP store (loopback): the Runs page lists the runs and says the
    store is read-only; the Bubbles and Optimizer pages analyze a run from it; nothing is
    written (no cache folder in a URL store)."""
    from streamlit.testing.v1 import AppTest

    from tests.support.stores import APP

    monkeypatch.setenv("FSOBS_STORE", str(http_store))
    at = AppTest.from_file(APP, default_timeout=90)
    at.run()
    assert not at.exception, at.exception
    texts = [m.value for m in (*at.info, *at.caption, *at.markdown)]
    assert any("read-only" in t for t in texts), texts
    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params["run"] = "reference/gloo_straggler_4rank"
    at.switch_page("app_pages/bubbles.py")
    at.run()
    assert not at.exception and not at.error, (at.exception, at.error)
    assert at.selectbox(key="run").value == "reference/gloo_straggler_4rank"
    assert any(m.label == "Bubble ratio" for m in at.metric)
