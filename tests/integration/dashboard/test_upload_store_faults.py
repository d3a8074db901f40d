"""The store under faults (issue 25, point 8): a full disk during an upload, on its own and on
the Runs page, and uploads racing into a store that has no ``uploads/`` yet.

The full disk is the kernel's own refusal: ``RLIMIT_FSIZE`` makes every write beyond the limit
fail (``EFBIG``; Python ignores the ``SIGXFSZ`` that comes with it), as a full disk fails
``ENOSPC``; the upload must treat both alike.
"""

from __future__ import annotations

import contextlib
import errno
import io
import multiprocessing
import os
import resource
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.text import esc
from dashboard.upload import UploadError, store_upload
from tests.support.stores import APP, listing, run_files, small_run, zip_bytes

GLOO = "reference/gloo_straggler_4rank"
FULL = 8 * 2**10
"""The disk is full after this many bytes of a file (the gloo traces are ~11 KiB each)."""


@contextlib.contextmanager
def disk_full_after(limit: int) -> Iterator[None]:
    """Every write of this process beyond ``limit`` bytes of a file fails, until the end."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def _streams(files: dict[str, bytes]) -> list[tuple[str, io.BytesIO]]:
    return [(name, io.BytesIO(data)) for name, data in files.items()]


REFUSED = (
    f"rank0.json.gz: the run store refused it ({os.strerror(errno.EFBIG)}); nothing was stored"
)
"""The first file of the gloo run, the first that does not fit."""


@pytest.mark.parametrize("kind", ["files", "zip"])
def test_a_full_disk_refuses_the_upload_in_one_line_and_loses_nothing(store, kind):
    files = run_files(store / GLOO)
    assert min(len(data) for data in files.values()) > FULL
    kept = store_upload(store, _streams(files), name="kept")  # a stored upload, then the disk fills
    before = listing(store)
    payload = _streams(files) if kind == "files" else [("r.zip", io.BytesIO(zip_bytes(files)))]
    with disk_full_after(FULL), pytest.raises(UploadError) as info:
        store_upload(store, payload, name="late")
    assert str(info.value) == REFUSED
    assert listing(store) == before  # no staging folder, no half-written file
    assert run_files(kept.path) == files


def test_a_full_disk_in_a_store_without_uploads_leaves_none(store):
    before = listing(store)
    assert not (store / "uploads").exists()
    with disk_full_after(FULL), pytest.raises(UploadError, match="File too large"):
        store_upload(store, _streams(run_files(store / GLOO)))
    assert listing(store) == before


def test_the_runs_page_shows_a_full_disk_as_a_message(app_env):
    """The issue: a traceback replaced the Runs page. Now: one error line, the table stays."""
    files = run_files(app_env / GLOO)
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    before = listing(app_env)
    rows = len(at.dataframe[0].value)
    mime = "application/octet-stream"
    at.file_uploader(key="upload_files").set_value([(n, d, mime) for n, d in files.items()])
    with disk_full_after(FULL):
        at.button(key="upload_store").click().run()
    assert not at.exception, at.exception
    assert [e.value for e in at.error] == [f"Upload refused: {esc(REFUSED)}"]
    assert len(at.dataframe[0].value) == rows
    assert listing(app_env) == before


# ---- uploads racing into a store without uploads/ ----
def _racer(root: Path, rounds: int, good: bool, barrier: Any, results: Any) -> None:
    """One uploader: in each round, into a fresh store (no ``uploads/``), a good upload or one
    refused right after it was staged; every outcome is put on ``results``."""
    files = small_run()
    for number in range(rounds):
        barrier.wait(timeout=120)  # a racer that died breaks the barrier: no hang
        store = root / f"store{number}"
        payload = _streams(files) if good else [("notes.txt", io.BytesIO(b"not a run"))]
        try:
            store_upload(store, payload, name="race")
            outcome = "stored"
        except UploadError as exc:
            outcome = "refused" if "not a run file" in str(exc) else f"UploadError: {exc}"
        except Exception as exc:  # the issue: FileNotFoundError / OSError now and then
            outcome = f"{type(exc).__name__}: {exc}"
        results.put((good, outcome))


def test_racing_uploads_into_a_store_without_uploads_never_fail(tmp_path):
    """Four processes, 60 rounds, each round one fresh store: one good upload and three that
    are refused after staging (each of which removes the ``uploads/`` it created, once empty).
    Every good upload is stored, every bad one refused for its own reason, nothing else."""
    rounds, racers = 60, 4
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(racers), context.Queue()
    processes = [
        context.Process(target=_racer, args=(tmp_path, rounds, number == 0, barrier, results))
        for number in range(racers)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=300) for _ in range(rounds * racers)]
    for process in processes:
        process.join(timeout=60)
    assert [p.exitcode for p in processes] == [0] * racers
    assert sorted(set(outcomes)) == [(False, "refused"), (True, "stored")]
    assert outcomes.count((True, "stored")) == rounds
    for number in range(rounds):
        uploads = tmp_path / f"store{number}" / "uploads"
        assert sorted(p.name for p in uploads.iterdir()) == ["race"]
        assert run_files(uploads / "race") == small_run()
