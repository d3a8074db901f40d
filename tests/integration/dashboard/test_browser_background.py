"""A run analyzed in the background, in two real headless Chromium sessions (issue 35).

The run is a synthetic 8-rank NCCL run of ~24 MB of JSON per rank (``write_gpu_run``, the
benchmarks' generator): above ``dashboard.cache.INLINE_BYTES`` on disk, so the Bubbles page
analyzes it in the background, and big enough that the analysis takes a few seconds here.

- the first session opens it on the Bubbles page and sees the progress bar (ranks parsed of 8);
- a second session opens the Runs page, which completes while the first session still waits
  for its job (an ordering fact: the Runs page does not parse the run the job is parsing);
- the first page then completes by itself, with the bubble ratio ``analyze_path`` gives.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dashboard.background import LAST_STAGE
from dashboard.cache import INLINE_BYTES
from dashboard.widgets import format_kpi
from fsobs import analyze_path
from fsobs.simulate import write_gpu_run
from tests.support.cdp import PAGE_STATE_JS, Browser, StreamlitServer, page_ready_js

pytestmark = pytest.mark.browser

RUN_ID, RANKS = "big/synthetic8", 8
PROGRESS_JS = """(() => {
  const bar = document.querySelector('[data-testid="stProgress"]');
  return bar ? bar.innerText.trim() : null;
})()"""
METRICS_JS = (
    "Object.fromEntries(Array.from(document.querySelectorAll('[data-testid=\"stMetric\"]'))"
    ".map((m) => [m.querySelector('[data-testid=\"stMetricLabel\"]').innerText.trim(), "
    "m.querySelector('[data-testid=\"stMetricValue\"]').innerText.trim()]))"
)
BUBBLES_READY = page_ready_js("Bubbles", 3)


@pytest.fixture(scope="module")
def big_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("background") / "store"
    paths = write_gpu_run(
        store / RUN_ID, num_ranks=RANKS, num_steps=5, target_bytes_per_rank=24_000_000, seed=0
    )
    assert sum(p.stat().st_size for p in paths) > INLINE_BYTES
    return store


@pytest.fixture
def sessions(big_store: Path, chromium: str) -> Iterator[tuple[StreamlitServer, Browser, Browser]]:
    with (
        StreamlitServer(big_store) as server,
        Browser(chromium, timeout_s=300) as first,
        Browser(chromium, timeout_s=120) as second,
    ):
        yield server, first, second


def _progress(browser: Browser) -> str | None:
    """The text of the page's progress bar, None without one."""
    text = browser.evaluate(PROGRESS_JS)
    assert text is None or isinstance(text, str)
    return text


def _object(browser: Browser, js: str) -> dict[str, Any]:
    value = browser.evaluate(js)
    assert isinstance(value, dict)
    return value


def test_a_big_run_analyzes_in_the_background(
    sessions: tuple[StreamlitServer, Browser, Browser], big_store: Path
) -> None:
    server, first, second = sessions
    first.navigate(f"{server.url}/bubbles?run={RUN_ID}")
    first.wait_for(f"{PROGRESS_JS} !== null", timeout_s=120)
    seen = {_progress(first)}

    second.navigate(f"{server.url}/runs")
    second.wait_for(page_ready_js("Runs", 0), timeout_s=120)
    assert _object(second, PAGE_STATE_JS)["exceptions"] == []
    assert _progress(first) is not None  # the first session still waits for its job

    deadline = time.monotonic() + 300
    while not first.evaluate(BUBBLES_READY):
        seen.add(_progress(first))
        assert time.monotonic() < deadline, f"Bubbles not complete: {seen}\n{server.log()}"
        time.sleep(0.05)
    state = _object(first, PAGE_STATE_JS)
    assert state["exceptions"] == [], state["exceptions"]
    assert _progress(first) is None  # gone once the page renders

    stages = {text for text in seen if text}
    # the bar was seen; the page refreshes it every 0.5 s, so a fast parse can pass between two
    # looks (the totals the job reports are tested in test_background.py): any count seen
    # counts this run's ranks
    assert stages, seen
    totals = {int(m.group(1)) for t in stages if (m := re.search(r" of (\d+)$", t))}
    assert totals <= {RANKS}, stages
    assert stages <= {f"parsing rank traces: {k} of {RANKS}" for k in range(RANKS)} | {
        LAST_STAGE,
        "looking for the run's traces",
    }, stages
    summary = analyze_path(big_store / RUN_ID).summary
    metrics = _object(first, METRICS_JS)
    assert metrics["Bubble ratio"] == format_kpi(summary["bubble_ratio"], "pct"), metrics
