"""Shared fixtures of the dashboard tests (also used by the real-browser test), over the store
that :func:`tests.dashboard.stores.build_store` writes (its layout is described there).

Fixtures:

- ``shared_store``: that store, built once per session; **read-only** but for the app's
  analysis cache (``.fsobs-cache``): tests share the dashboard's caches through it, which keeps
  the suite fast.
- ``store``: a fresh copy of it in ``tmp_path`` for tests that write (uploads).
- ``app_env``: sets ``FSOBS_STORE`` to ``store``; ``shared_app_env`` to ``shared_store``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.dashboard.stores import build_store


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
