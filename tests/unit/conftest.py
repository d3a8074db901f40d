"""The unit lane (``make test-fast``): tests that run in this one process, in seconds.

A unit test starts no process group, no torchrun, no browser and no server; tests that do, or
that run HTA live or a long corpus, live in ``tests/integration``. This conftest holds the lane
to it: a unit test marked ``browser`` or ``multiprocess``, or asking for Chromium, is refused at
collection, and one that initializes ``torch.distributed`` or launches torchrun or Chromium
fails.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

UNIT = Path(__file__).resolve().parent
FORBIDDEN_MARKS = ("browser", "multiprocess")
FORBIDDEN_PROGRAMS = ("torchrun", "chromium", "chrome", "streamlit")
_launched: list[str] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """Record the programs of the processes started (``subprocess.Popen`` and ``os.exec*``)."""
    if event in ("subprocess.Popen", "os.posix_spawn", "os.exec"):
        argv = args[1] if len(args) > 1 and isinstance(args[1], Sequence) else ()
        words = [str(a) for a in argv if isinstance(a, str | bytes | Path)]
        if any(Path(w).name.startswith(FORBIDDEN_PROGRAMS) for w in words[:1]) or any(
            w in ("torch.distributed.run", "streamlit") for w in words[1:3]
        ):
            _launched.append(" ".join(words[:4]))


sys.addaudithook(_audit)


def _in_unit(item: pytest.Item) -> bool:
    return UNIT in Path(str(item.path)).resolve().parents


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    wrong = [
        f"{item.nodeid} ({why})"
        for item in items
        if _in_unit(item)
        for why in [
            *(f"marked {m}" for m in FORBIDDEN_MARKS if item.get_closest_marker(m)),
            *(["uses Chromium"] if "chromium" in getattr(item, "fixturenames", ()) else []),
        ]
    ]
    if wrong:
        raise pytest.UsageError("belongs in tests/integration: " + "; ".join(wrong))


@pytest.fixture(autouse=True)
def _one_process() -> Iterator[None]:
    _launched.clear()
    yield
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        pytest.fail("a unit test initialized torch.distributed: move it to tests/integration")
    if _launched:
        pytest.fail(f"a unit test launched {_launched[0]!r}: move it to tests/integration")
