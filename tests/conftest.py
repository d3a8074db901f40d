"""pytest's detailed assertion messages in the shared helper modules too (they are not test
modules, so pytest would not rewrite their asserts otherwise); and every test leaves
``sys.modules["__main__"]`` as it found it."""

import sys
from collections.abc import Iterator

import pytest

pytest.register_assert_rewrite("tests.bubble_rows", "tests.dist", "tests.hta_check", "tests.kineto")


@pytest.fixture(autouse=True)
def _keep_main_module() -> Iterator[None]:
    """Streamlit's script runner (AppTest runs it in this process) installs the page as
    ``sys.modules["__main__"]`` and never puts the old one back; a later test that starts
    processes with multiprocessing's ``spawn`` then ran the dashboard's entry script in each
    child instead of pytest's ``__main__`` (the children exited with 1)."""
    main = sys.modules["__main__"]
    yield
    sys.modules["__main__"] = main
