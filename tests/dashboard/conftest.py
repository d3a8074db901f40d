"""Shared fixtures of the dashboard tests (also used by the real-browser test), over the store
that :func:`tests.dashboard.stores.build_store` writes (its layout is described there).

Fixtures:

- ``shared_store``: that store, built once per session; **read-only** but for the app's
  analysis cache (``.fsobs-cache``): tests share the dashboard's caches through it, which keeps
  the suite fast.
- ``store``: a fresh copy of it in ``tmp_path`` for tests that write (uploads).
- ``app_env``: sets ``FSOBS_STORE`` to ``store``; ``shared_app_env`` to ``shared_store``.
- ``chromium``: the headless browser of the real-browser tests; without one they skip, or
  fail when ``CI=true``.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dashboard.cdp import find_chromium
from tests.dashboard.stores import build_store


@pytest.fixture(autouse=True)
def _keep_main_module() -> Iterator[None]:
    """Streamlit's script runner (AppTest) makes the app script ``sys.modules["__main__"]`` and
    leaves it there; a later test's spawned process (multiprocessing, torch's gloo ranks) would
    then run the app as its main module. Put the real one back after each test."""
    main = sys.modules["__main__"]
    yield
    sys.modules["__main__"] = main


@pytest.fixture(scope="session")
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test store, built once; read-only."""
    return build_store(tmp_path_factory.mktemp("dashboard") / "store")


@pytest.fixture
def store(shared_store: Path, tmp_path: Path) -> Path:
    """A private, writable copy of the test store."""
    return Path(shutil.copytree(shared_store, tmp_path / "store"))


@pytest.fixture
def app_env(store: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``FSOBS_STORE`` pointing at a writable store; returns it."""
    monkeypatch.setenv("FSOBS_STORE", str(store))
    return store


@pytest.fixture
def shared_app_env(shared_store: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``FSOBS_STORE`` pointing at the shared read-only store; returns it."""
    monkeypatch.setenv("FSOBS_STORE", str(shared_store))
    return shared_store


@pytest.fixture(scope="session")
def chromium() -> str:
    path = find_chromium()
    if path is None:
        reason = "chromium not found on PATH (make test installs it with apt-get; or set CHROMIUM)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return path
