"""The dashboard in a real headless Chromium: every page renders its charts, and an upload works.

One Streamlit server (``FSOBS_STORE`` = a copy of the store of ``stores.build_store``) and one
Chromium per module, driven over the DevTools Protocol (``tests/support/cdp.py``, the method
of ``shared/notes/browser_testing.md``). For each page: navigate, wait until the script has
finished, the page title and the expected Plotly charts are drawn and no skeleton placeholder is
left, then check through ``Runtime.evaluate`` that every visible chart has a title and data marks
and that no Streamlit exception box is shown; click the page's tabs and check their charts too;
save a screenshot to ``screenshots/<page>.png`` (git-ignored) that must decode and not be blank.
The upload test puts a 2-rank run into the runs page's real ``<input type=file>``
(``DOM.setFileInputFiles``), stores it and reads it back from the runs table. The big-run test
opens a 64-rank run (``stores.write_big_run``): the heatmap and the timeline show its top
stragglers, then the ranks typed into the rank filter's list; the class bars are folded. The
last test checks the shipped Streamlit config: no Deploy button, no developer menu items, and
the uploader states the 512 MiB rule.

Chromium comes from ``make test`` (apt-get); without it these tests skip, or fail when
``CI=true``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import pytest
from PIL import Image

from dashboard.ranks import DEFAULT_TOP_K, OTHERS, top_stragglers
from fsobs import analyze_path
from fsobs.simulate import write_gpu_run
from tests.support.cdp import (
    PAGE_STATE_JS,
    ROOT,
    Browser,
    StreamlitServer,
    page_ready_js,
)
from tests.support.stores import BIG_RUN_ID, RUN_IDS, write_big_run

pytestmark = pytest.mark.browser

SCREENSHOTS = ROOT / "screenshots"
CONTROL, TEST, GLOO = "sim/control", "sim/test", "reference/gloo_straggler_4rank"
UPLOADED_ID = "uploads/upload"
# Rows of the page's first st.dataframe, from the grid's accessible table (the grid is a canvas).
RUNS_TABLE_JS, RUNS_HEADER_JS = (
    "Array.from(document.querySelectorAll("
    f'\'[data-testid="stDataFrame"] table[role="grid"] {part} tr\'))'
    ".map((tr) => Array.from(tr.children).map((cell) => cell.textContent.trim()))"
    for part in ("tbody", "thead")
)


@dataclass(frozen=True)
class PageSpec:
    shot: str
    """Screenshot name (``screenshots/<shot>.png``) and test id."""
    path: str
    """URL path of the page (``st.navigation``)."""
    query: dict[str, str]
    title: str
    charts: tuple[str, ...]
    """Title starts of the charts that must be drawn when the page opens (visible ones only:
    charts in other tabs or closed expanders are not drawn yet)."""
    tabs: tuple[tuple[str, str], ...] = ()
    """(tab label, title start of a chart that must be drawn once the tab is clicked)."""


PAGES = (
    PageSpec("runs", "runs", {}, "Runs", ()),
    PageSpec(
        "bubbles",
        "bubbles",
        {"run": CONTROL},
        "Bubbles",
        (
            "Bubble per rank by class",
            "Straggler wait per rank and step",
            "Steps 10–11 across ranks",
        ),
        tabs=(
            ("Stragglers", "Straggler rank per step"),
            ("Data attribution", "Data cost against arrival"),
            ("HTA tables", "GPU temporal breakdown"),
        ),
    ),
    PageSpec(
        "bubbles-cpu",
        "bubbles",
        {"run": GLOO},
        "Bubbles",
        ("Bubble per rank by class", "Straggler wait per rank and step", "Steps 2–3 across ranks"),
    ),
    PageSpec(
        "compare",
        "compare",
        {"control": CONTROL, "test": TEST},
        "Compare",
        ("Bubble reduction", "Bubble classes", "Change per rank", "Step time distribution"),
    ),
    PageSpec(
        "optimizer",
        "optimizer",
        {"run": TEST},
        "Optimizer",
        ("Cost model", "Per-rank cost of the batch", "Imbalance per step"),
    ),
    PageSpec(
        "whatif",
        "whatif",
        {"run": CONTROL},
        "What-if",
        (
            "Bubble reduction, predicted and measured",
            "Bubble ratio against world size",
            "Bubble reduction at 256 ranks",
        ),
    ),
)


@pytest.fixture(scope="module")
def browser_store(shared_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A writable copy of the dashboard test store (``stores.build_store``) for this module,
    with the 64-rank run ``big/sim64`` added."""
    store = Path(shutil.copytree(shared_store, tmp_path_factory.mktemp("browser") / "store"))
    write_big_run(store)
    return store


@pytest.fixture(scope="module")
def server(browser_store: Path, chromium: str) -> Iterator[StreamlitServer]:
    with StreamlitServer(browser_store) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(chromium: str, server: StreamlitServer) -> Iterator[Browser]:
    """Depends on ``server`` so that it closes first (the server then stops at once)."""
    with Browser(chromium, width=1400, height=1400, timeout_s=30) as chrome:
        yield chrome


def _open(browser: Browser, server: StreamlitServer, spec: PageSpec) -> dict:
    """Navigate to the page, wait until it is rendered, return its state."""
    query = f"?{urlencode(spec.query)}" if spec.query else ""
    browser.navigate(f"{server.url}/{spec.path}{query}")
    try:
        browser.wait_for(page_ready_js(spec.title, len(spec.charts)), timeout_s=45)
    except TimeoutError:
        pass  # the asserts below say what is missing
    return browser.evaluate(PAGE_STATE_JS)


def _check_charts(state: dict, expected: tuple[str, ...], context: str) -> None:
    """Every expected chart is drawn, and every drawn chart has a title and data marks."""
    drawn = [chart for chart in state["charts"] if chart["drawn"]]
    titles = [chart["title"] for chart in drawn]
    for start in expected:
        assert any(title.startswith(start) for title in titles), f"no {start!r}: {context}"
    for chart in drawn:
        assert chart["title"], context
        assert chart["marks"] > 0, f"chart {chart['title']!r} has no data marks: {context}"
        assert chart["titleMarkup"] == f"<b>{chart['title']}</b>", context  # bold, once


def _assert_not_blank(png: Path, width: int, height: int) -> None:
    """The PNG decodes, has the viewport's size and shows more than a background."""
    assert png.stat().st_size > 20_000, f"{png}: {png.stat().st_size} bytes, a blank page?"
    with Image.open(png) as image:
        image.verify()
    with Image.open(png) as image:
        assert image.size == (width, height)
        histogram = image.convert("L").histogram()
    foreground_share = 1 - max(histogram) / (width * height)
    shades = sum(1 for count in histogram if count > 0)
    assert foreground_share > 0.02, f"{png}: {foreground_share:.1%} of pixels off the background"
    assert shades > 32, f"{png}: only {shades} shades of gray"


@pytest.mark.parametrize("spec", PAGES, ids=[p.shot for p in PAGES])
def test_page_renders(browser: Browser, server: StreamlitServer, spec: PageSpec) -> None:
    state = _open(browser, server, spec)
    context = f"{spec.shot}: {json.dumps(state)[:1500]}\nserver log:\n{server.log(1500)}"
    assert state["exceptions"] == [], context
    assert state["title"] == spec.title, context
    assert state["skeletons"] == 0, context
    _check_charts(state, spec.charts, context)
    if spec.path == "runs":
        _check_runs_table(browser)
    png = browser.screenshot(SCREENSHOTS / f"{spec.shot}.png")
    _assert_not_blank(png, browser.width, browser.height)
    for tab, chart in spec.tabs:
        browser.click('[role="tab"]', tab)
        ready = (
            f"(() => {{ const s = {PAGE_STATE_JS}; return s.charts.some((c) => c.drawn && "
            f"c.marks > 0 && c.title.startsWith({json.dumps(chart)})); }})()"
        )
        try:
            browser.wait_for(ready, timeout_s=15)
        except TimeoutError:
            pass  # _check_charts says what is missing
        state = browser.evaluate(PAGE_STATE_JS)
        context = f"{spec.shot}, tab {tab}: {json.dumps(state)[:1500]}"
        assert state["exceptions"] == [], context
        _check_charts(state, (chart,), context)


def _runs_table(browser: Browser, header: bool = False) -> list[list[str]]:
    """Rows of the first ``st.dataframe`` as text."""
    return browser.evaluate(RUNS_HEADER_JS if header else RUNS_TABLE_JS)


def _check_runs_table(browser: Browser) -> None:
    """The table lists the store's runs with their facts (the broken one without any)."""
    browser.wait_for(f"{RUNS_TABLE_JS}.length >= {len(RUN_IDS)}")
    header = _runs_table(browser, header=True)[0]
    rows = {row[0]: dict(zip(header, row, strict=True)) for row in _runs_table(browser)}
    assert set(RUN_IDS) <= set(rows), sorted(rows)
    facts = {
        run_id: (row["world size"], row["device"], row["steps"]) for run_id, row in rows.items()
    }
    assert facts["sim/control"] == facts["sim/test"] == ("4", "gpu", "4")
    assert facts["reference/gloo_straggler_4rank"] == ("4", "cpu", "4")
    assert facts["broken"] == ("", "", "")


def test_upload_through_the_ui(
    browser: Browser, server: StreamlitServer, tmp_path: Path, browser_store: Path
) -> None:
    """Put a 2-rank run into the runs page's file input, store it, and see it listed."""
    files = write_gpu_run(tmp_path / "new", num_ranks=2, num_steps=3, kernels_per_step=40, seed=7)
    runs_page = PAGES[0]
    state = _open(browser, server, runs_page)
    assert state["title"] == runs_page.title, state
    assert UPLOADED_ID not in browser.evaluate("document.body.innerText")

    browser.set_input_files("input[type=file]", files)
    # Both file chips are shown and none has its upload spinner left; the script has rerun.
    names = json.dumps([f.name for f in files])
    uploaded = (
        "(() => { const chips = Array.from(document.querySelectorAll("
        "'[data-testid=\"stFileChip\"]')).map((c) => c.getAttribute('aria-label'));"
        f" return {names}.every((n) => chips.some((label) => label.startsWith(n + ',')))"
        " && !document.querySelector('[data-testid=\"stFileChipIconSpinner\"]'); })()"
    )
    browser.wait_for(f"{uploaded} && !{PAGE_STATE_JS}.running")
    browser.click("button", "Store the run")
    browser.wait_for(
        "Array.from(document.querySelectorAll('[data-testid=\"stAlert\"]'))"
        f".some((a) => a.innerText.includes({json.dumps(UPLOADED_ID)}))"
    )
    assert sorted(p.name for p in (browser_store / UPLOADED_ID).iterdir()) == sorted(
        f.name for f in files
    )
    # The runs table lists the new run (its accessible copy follows the canvas a moment later).
    browser.wait_for(f"{RUNS_TABLE_JS}.some((row) => row[0] === {json.dumps(UPLOADED_ID)})")
    rows = {row[0]: row for row in _runs_table(browser)}
    assert UPLOADED_ID in rows, sorted(rows)
    header = _runs_table(browser, header=True)[0]
    uploaded = dict(zip(header, rows[UPLOADED_ID], strict=True))
    assert (uploaded["world size"], uploaded["device"], uploaded["steps"]) == ("2", "gpu", "3")
    assert browser.evaluate(PAGE_STATE_JS)["exceptions"] == []
    browser.screenshot(SCREENSHOTS / "runs_after_upload.png")


# What the visible charts show: title, the heatmap's rows, the vertical bars' categories, the
# timeline's rank ticks (from Plotly's own data on the chart's element).
PLOTS_JS = r"""
(() => Array.from(document.querySelectorAll('.js-plotly-plot'))
  .filter((p) => p.getClientRects().length > 0 && p.querySelector('.main-svg'))
  .map((p) => {
    const first = (p.data || [])[0] || {};
    const axis = ((p._fullLayout || {}).yaxis) || {};
    return {
      title: (p.querySelector('.gtitle') || {}).textContent || '',
      rows: first.type === 'heatmap' ? Array.from(first.y).map(String) : null,
      bars: first.type === 'bar' && first.orientation !== 'h' ? Array.from(first.x).map(String)
        : null,
      ticks: axis.ticktext ? Array.from(axis.ticktext).map((t) => t.replace('rank ', '')) : null,
    };
  }))()
"""


def _shown(browser: Browser) -> dict[str, list[str] | None]:
    plots = browser.evaluate(PLOTS_JS)
    pick = {
        "heatmap": ("Straggler wait per rank", "rows"),
        "timeline": ("Steps ", "ticks"),
        "classes": ("Bubble per rank by class", "bars"),
    }
    return {
        name: next((p[field] for p in plots if p["title"].startswith(title)), None)
        for name, (title, field) in pick.items()
    }


def _wait_shown(browser: Browser, ranks: list[str]) -> None:
    """Until the heatmap and the timeline both show ``ranks``."""
    want = json.dumps(ranks)
    try:
        browser.wait_for(
            f"(() => {{ const s = {PLOTS_JS}; const want = {want};"
            " const same = (a) => !!a && JSON.stringify(a) === JSON.stringify(want);"
            " return same(s.find((p) => p.title.startsWith('Straggler wait'))?.rows)"
            " && same(s.find((p) => p.title.startsWith('Steps '))?.ticks); })()",
            timeout_s=60,
        )
    except TimeoutError:
        pass  # the assert says what is shown


def test_a_64_rank_run_with_a_rank_filter(
    browser: Browser, server: StreamlitServer, browser_store: Path
) -> None:
    """A big run opens on its top stragglers (heatmap, timeline) with folded class bars; ranks
    typed into the filter's list, or given in the URL, are the only ones drawn."""
    top = top_stragglers(
        analyze_path(browser_store / BIG_RUN_ID).stragglers.per_rank, DEFAULT_TOP_K
    )
    spec = PageSpec("bubbles-64", "bubbles", {"run": BIG_RUN_ID}, "Bubbles", ("Bubble",) * 3)
    state = _open(browser, server, spec)
    context = f"{json.dumps(state)[:1500]}\nserver log:\n{server.log(1500)}"
    assert state["exceptions"] == [] and state["skeletons"] == 0, context
    _check_charts(state, ("Bubble per rank", "Straggler wait per rank", "Steps 10–11"), context)
    shown = _shown(browser)
    assert shown["heatmap"] == shown["timeline"] == [str(r) for r in top], shown
    assert len(shown["classes"]) == DEFAULT_TOP_K + 1 and shown["classes"][-1] == OTHERS, shown
    png = browser.screenshot(SCREENSHOTS / "bubbles-64.png")
    _assert_not_blank(png, browser.width, browser.height)

    browser.click('[data-testid="stButtonGroup"] button', "List")
    browser.wait_for("!!document.querySelector('[data-testid=\"stTextInput\"] input')")
    browser.evaluate("document.querySelector('[data-testid=\"stTextInput\"] input').focus()")
    browser.call("Input.insertText", text="0-3, 60")
    for kind in ("keyDown", "keyUp"):
        browser.call(
            "Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
            windowsVirtualKeyCode=13,
        )  # fmt: skip
    wanted = ["0", "1", "2", "3", "60"]
    _wait_shown(browser, wanted)
    shown = _shown(browser)
    assert shown["heatmap"] == shown["timeline"] == wanted, shown
    assert browser.evaluate(PAGE_STATE_JS)["exceptions"] == []
    browser.screenshot(SCREENSHOTS / "bubbles-64-list.png")

    url = PageSpec(
        "bubbles-64-url",
        "bubbles",
        {"run": BIG_RUN_ID, "ranks": "Range"},
        "Bubbles",
        ("Bubble",) * 3,
    )
    _open(browser, server, url)
    _wait_shown(browser, [str(r) for r in range(DEFAULT_TOP_K)])
    shown = _shown(browser)
    assert shown["heatmap"] == shown["timeline"] == [str(r) for r in range(DEFAULT_TOP_K)], shown


def test_viewers_see_no_deploy_button_or_developer_menu(
    browser: Browser, server: StreamlitServer
) -> None:
    """The config shipped next to the app (``dashboard/.streamlit/config.toml``) is in effect."""
    state = _open(browser, server, PAGES[0])
    assert state["title"] == "Runs", state
    assert not browser.evaluate("!!document.querySelector('[data-testid=\"stAppDeployButton\"]')")
    browser.click('[data-testid="stMainMenuButton"]')
    browser.wait_for("!!document.querySelector('[data-testid=\"stMainMenuList\"]')")
    items = browser.evaluate(
        "Array.from(document.querySelectorAll('[data-testid^=\"stMainMenuItem-\"]'))"
        ".map((e) => e.dataset.testid)"
    )
    assert "stMainMenuItem-print" in items, items  # the menu is there, for viewers
    assert not [i for i in items if "rerun" in i.lower() or "cache" in i.lower()], items
    # Streamlit would state the per-file limit as "1GB": hidden, the caption states the rule
    hidden = browser.evaluate(
        "Array.from(document.querySelectorAll("
        "'[data-testid=\"stFileUploaderDropzoneInstructions\"]'))"
        ".every((e) => e.getClientRects().length === 0)"
    )
    assert hidden
    assert "at most 512 MiB in all, uncompressed" in browser.evaluate("document.body.innerText")
