"""In a real headless Chromium, a hostile run's text and a hostile URL show as text.

One Streamlit server over the store of ``test_escape.py`` (a run in a folder named with a
Markdown link, an image and HTML, its ``run.json`` reason and toggle reason forging a "Session
expired: sign in" link and outside images). On the Bubbles page of that run, on a page opened
with a forged ``?run=`` / ``control=`` / ``runs=``, and on the Runs page (whose table is a
canvas), the DOM must hold no
link to and no image from the forged host (the app's own links carry
the forged id URL-encoded in their query), no element made by the forged HTML, and show the
forged text itself, character for character (but for the invisible zero-width spaces that
:func:`dashboard.text.esc` puts where a bare link would start).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest

from fsobs.runformat import RunMeta, ToggleStatus, write_run_json
from tests.integration.dashboard.test_escape import FORGED, HOSTILE_ID
from tests.support.cdp import PAGE_STATE_JS, Browser, StreamlitServer
from tests.support.stores import GLOO_REFERENCE

pytestmark = pytest.mark.browser

FORGED_DOM_JS = """(() => ({
  links: Array.from(document.querySelectorAll('a[href]')).map((a) => a.href)
    .filter((h) => new URL(h).hostname.includes('evil')),
  images: Array.from(document.querySelectorAll('img[src]')).map((i) => i.src)
    .filter((s) => new URL(s, location.href).hostname.includes('evil')),
  text: document.querySelector('[data-testid="stMain"]').innerText.replaceAll('\u200b', ''),
}))()"""


@pytest.fixture(scope="module")
def server(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamlitServer]:
    store = tmp_path_factory.mktemp("escape") / "store"
    shutil.copytree(GLOO_REFERENCE, store / "reference" / "gloo")
    run = Path(shutil.copytree(GLOO_REFERENCE, store / HOSTILE_ID))
    toggle = ToggleStatus(requested=True, applied=False, reason=FORGED)
    meta = RunMeta(world_size=4, status="incomplete", reason=FORGED, toggles={"balance": toggle})
    write_run_json(run, meta)
    with StreamlitServer(store) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(chromium: str, server: StreamlitServer) -> Iterator[Browser]:
    with Browser(chromium, width=1400, height=1400, timeout_s=60) as chrome:
        yield chrome


def _page(browser: Browser, server: StreamlitServer, path: str, expect: str, **query: str) -> dict:
    """Open the page, wait until its script is done and it shows ``expect``; its forged DOM."""
    browser.navigate(f"{server.url}/{path}?{urlencode(query)}")
    shown = (
        "document.querySelector('[data-testid=\"stMain\"]')"
        f".innerText.replaceAll('\\u200b', '').includes({json.dumps(expect)})"
    )
    browser.wait_for(f"!{PAGE_STATE_JS}.running && {shown}")
    assert browser.evaluate(PAGE_STATE_JS)["exceptions"] == []
    found = browser.evaluate(FORGED_DOM_JS)
    assert isinstance(found, dict)
    assert found["links"] == [] and found["images"] == [], found
    return found


def test_a_hostile_run_shows_its_folder_and_reason_as_text(
    browser: Browser, server: StreamlitServer
):
    found = _page(browser, server, "bubbles", f"Incomplete run: {FORGED}", run=HOSTILE_ID)
    assert f"{HOSTILE_ID} · CPU" in found["text"]
    assert f"balance was requested but not applied: {FORGED}" in found["text"]


@pytest.mark.parametrize(
    ("path", "key"), [("bubbles", "run"), ("compare", "control"), ("arms", "runs")]
)
def test_a_forged_run_id_in_the_url_shows_as_text(
    browser: Browser, server: StreamlitServer, path: str, key: str
):
    _page(
        browser, server, path, f"No run {FORGED} in the store ({key}= in the URL).", **{key: FORGED}
    )


def test_the_runs_page_lists_the_hostile_folder_as_text(browser: Browser, server: StreamlitServer):
    """The runs table is a canvas; the page around it holds no forged link or image."""
    _page(browser, server, "runs", "Run store:")
