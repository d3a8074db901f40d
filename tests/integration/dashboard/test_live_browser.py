"""The Live page in a real headless Chromium: it refreshes by itself, without a reload, and
keeps the user's place (issue 34, point 5).

A 2-rank job (:class:`tests.integration.dashboard.test_live_app.Job`) writes its sidecars while the
page is
open; the test types a number of steps to capture and opens an expander, lets the job
end more steps, and waits for the page to show them with no navigation (a mark left on the
document survives) and with the typed value, the button's label and the open expander kept.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.dashboard.test_live_app import LIVE, Job
from tests.support.cdp import PAGE_STATE_JS, ROOT, Browser, StreamlitServer, page_ready_js

pytestmark = pytest.mark.browser

STATUS_JS = (
    "(document.querySelector('[data-testid=\"stAlertContentSuccess\"]') || {}).innerText || ''"
)
NUMBER_JS = "document.querySelector('[data-testid=\"stNumberInput\"] input')"
BUTTON_JS = (
    "Array.from(document.querySelectorAll('[data-testid=\"stButton\"] button'))"
    ".map((b) => b.innerText.trim())"
)
EXPANDED_JS = "document.querySelector('[data-testid=\"stExpander\"] details').open"


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    running = Job(tmp_path / "store" / LIVE)
    running.step(3)
    yield running
    running.abandon()


def test_live_page_refreshes_in_place_and_keeps_the_widgets(
    chromium: str, job: Job, tmp_path: Path
) -> None:
    with (
        StreamlitServer(tmp_path / "store") as server,
        Browser(chromium, width=1400, height=1800) as browser,
    ):
        browser.navigate(f"{server.url}/live?run={LIVE}")
        browser.wait_for(page_ready_js("Live", 2), timeout_s=45)
        assert str(browser.evaluate(STATUS_JS)).startswith("Running: step 2, 2 ranks")

        browser.evaluate(f"{NUMBER_JS}.select()")
        browser.call("Input.insertText", text="9")
        for kind in ("keyDown", "keyUp"):
            browser.call(
                "Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
                windowsVirtualKeyCode=13,
            )  # fmt: skip
        browser.wait_for(f"{BUTTON_JS}.includes('Capture next 9 steps')", timeout_s=15)
        browser.click('[data-testid="stExpander"] summary')
        browser.wait_for(EXPANDED_JS)
        browser.evaluate("window.__fsobsNotReloaded = true")

        job.step(3)  # the page refreshes every 5 s by default
        browser.wait_for(
            f"({STATUS_JS}).startsWith('Running: step 5, 2 ranks') && {PAGE_STATE_JS}"
            ".charts.some((c) => c.title === 'Step time (steps 0-5 read)')",
            timeout_s=20,
            poll_s=0.2,
        )
        state = browser.evaluate(PAGE_STATE_JS)
        assert isinstance(state, dict) and state["exceptions"] == [], json.dumps(state)[:1500]
        assert browser.evaluate("window.__fsobsNotReloaded === true")
        assert browser.evaluate(f"{NUMBER_JS}.value") == "9"
        assert "Capture next 9 steps" in str(browser.evaluate(BUTTON_JS))
        assert browser.evaluate(EXPANDED_JS) is True
        browser.screenshot(ROOT / "screenshots" / "live.png")
