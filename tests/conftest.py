"""Fixtures of every test, and pytest's detailed assertion messages in the shared helper modules
(they are not test modules, so pytest would not rewrite their asserts otherwise).

- ``_keep_main_module`` (autouse): every test leaves ``sys.modules["__main__"]`` as it found it.
- ``shared_store``: the dashboard's test store that :func:`tests.support.stores.build_store`
  writes (its layout is described there), built once per session; **read-only** but for the
  app's analysis cache (``.fsobs-cache``): tests share the dashboard's caches through it.
- ``store``: a fresh copy of it in ``tmp_path`` for tests that write (uploads).
- ``app_env``: sets ``FSOBS_STORE`` to ``store``; ``shared_app_env`` to ``shared_store``.
- ``chromium``: the headless browser of the real-browser tests; without one they skip, or fail
  when ``CI=true``.
- ``pytest_runtest_setup``: once Streamlit is imported, its scan of the installed packages for
  components (0.35 s at every AppTest's first run) is done once per session.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.register_assert_rewrite(
    "tests.support.bubble_rows",
    "tests.support.dist",
    "tests.support.hta_check",
    "tests.support.kineto",
)

from tests.support.cdp import find_chromium  # noqa: E402  (after the assert rewrite)
from tests.support.stores import build_store  # noqa: E402


def pytest_runtest_setup(item: pytest.Item) -> None:
    """The installed packages do not change during a session: scan them for Streamlit
    components once (Streamlit imports the scanner by name at each use, so the module's
    attribute is what it calls)."""
    scanner = sys.modules.get("streamlit.components.v2.manifest_scanner")
    if scanner is not None and not hasattr(scanner.scan_component_manifests, "cache_info"):
        scanner.scan_component_manifests = functools.cache(scanner.scan_component_manifests)


@pytest.fixture(autouse=True)
def _keep_main_module() -> Iterator[None]:
    """Streamlit's script runner (AppTest runs it in this process) installs the page as
    ``sys.modules["__main__"]`` and never puts the old one back; a later test that starts
    processes with multiprocessing's ``spawn`` then ran the dashboard's entry script in each
    child instead of pytest's ``__main__`` (the children exited with 1)."""
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
