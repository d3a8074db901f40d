"""Issue 26 in a real headless Chromium: the URL is the state, the defaults a user expects, and
several arms on one page.

The store is the demo's three arms (``demo/baseline`` with every toggle off, ``demo/balanced``,
``demo/freescale`` with every toggle that acts on this machine), synthetic 4-rank GPU runs on the
same global batches, plus a broken run. One Streamlit server and one Chromium for the module
(``tests/support/cdp.py``). Each test loads a URL, reloads it (``Page.reload``: a new session)
or clicks the sidebar, and reads back the URL, the pickers and the charts: a run, a control /
test pair and the rank filter survive load, reload and navigation; an unknown id is named and
nothing else is shown; ``/compare`` and ``/arms`` open on the run with every toggle off; an
uploaded run is selected and linked.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

import numpy as np
import pytest

from fsobs import analyze_path
from fsobs.analysis.comparison.ab import compare
from fsobs.runformat import RunMeta, ToggleStatus, write_run_json
from fsobs.simulate import write_gpu_run
from tests.support.cdp import PAGE_STATE_JS, Browser, StreamlitServer
from tests.support.stores import FIRST_STEP, NUM_RANKS, NUM_STEPS, small_run

pytestmark = pytest.mark.browser

BASELINE, BALANCED, FREESCALE = "demo/baseline", "demo/balanced", "demo/freescale"
NO_GPU = "no GPU: copy-engine transport unavailable"
# (arm, seed of its synthetic traces, toggles applied; sm_free is requested by freescale only)
ARMS = ((BASELINE, 0, ()), (BALANCED, 1, ("balance",)), (FREESCALE, 2, ("balance", "sync_gc")))
TOGGLES = ("balance", "priority_overlap", "sm_free", "sync_gc")

SELECTS_JS = (
    "Object.fromEntries(Array.from(document.querySelectorAll("
    '\'[data-testid="stSelectbox"] input[role="combobox"]\')).map((i) => [i.ariaLabel, i.value]))'
)
"""Label -> shown value of every selectbox."""
PICKERS = ("Run", "Baseline run", "Open a run", "Control", "Test")
ARMS_JS = (
    "(() => { const m = document.querySelector('[data-testid=\"stMultiSelect\"]');"
    " return m ? m.innerText.split('\\n').filter((l) => l.trim()).slice(1) : null; })()"
)
"""The chosen items of the page's multiselect (its first line is the label)."""
SIDEBAR_JS = (
    "Object.fromEntries(Array.from(document.querySelectorAll('[data-testid=\"stSidebar\"] a'))"
    ".map((a) => [a.innerText.trim().split('\\n').pop().trim(), a.getAttribute('href')]))"
)
"""Sidebar link label -> href."""
PLOT_JS = (
    "(() => { const p = Array.from(document.querySelectorAll('.js-plotly-plot')).find((p) =>"
    " p.querySelector('.main-svg') && ((p.querySelector('.gtitle') || {}).textContent || '')"
    ".startsWith(TITLE)); if (!p) return null; const d = p.data[0];"
    " return {x: Array.from(d.x).map(String), y: Array.from(d.y).map(Number),"
    " z: d.z ? Array.from(d.y).map(String) : null,"
    " up: d.error_y ? Array.from(d.error_y.array) : null,"
    " down: d.error_y ? Array.from(d.error_y.arrayminus) : null}; })()"
)
"""Plotly data of the drawn chart whose title starts with TITLE (replace it)."""


def _picked(browser: Browser) -> dict[str, str]:
    """The run pickers' values by label (the pages' other selectboxes left out)."""
    shown = browser.evaluate(SELECTS_JS)
    return {k: v for k, v in shown.items() if k in PICKERS}


def _assert_picked(browser: Browser, expected: dict[str, str]) -> None:
    """The run pickers show ``expected`` (waited for: a picker whose default analyzes runs is
    drawn a moment after the others)."""
    try:
        browser.wait_for(
            f"(() => {{ const s = {SELECTS_JS}; const want = {json.dumps(expected)};"
            " return Object.keys(want).every((k) => s[k] === want[k]); })()",
            timeout_s=30,
        )
    except TimeoutError:
        pass  # the assert says what is shown
    assert _picked(browser) == expected


def _plot(browser: Browser, title: str) -> dict | None:
    return browser.evaluate(PLOT_JS.replace("TITLE", json.dumps(title)))


def _write_sidecars(run_dir: Path) -> None:
    """The same global batch on every arm: 8 samples per rank and step, one digest per step."""
    rng = np.random.default_rng(11)
    for rank in range(NUM_RANKS):
        lines = []
        for step in range(FIRST_STEP, FIRST_STEP + NUM_STEPS):
            lengths = [int(v) for v in rng.integers(1, 200, 8)]
            record = {
                "step": step,
                "num_samples": len(lengths),
                "seq_lengths": lengths,
                "est_cost": float(sum(v + v * v for v in lengths)),
                "batch_digest": f"batch-{step}-{rank}",
            }
            lines.append(json.dumps(record))
        (run_dir / f"steps.rank{rank}.jsonl").write_text("\n".join(lines) + "\n")


def _toggle(name: str, applied: tuple[str, ...], arm: str) -> ToggleStatus:
    if name in applied:
        return ToggleStatus(requested=True, applied=True)
    if name == "sm_free" and arm == FREESCALE:
        return ToggleStatus(requested=True, applied=False, reason=NO_GPU)
    return ToggleStatus(requested=False, applied=False)


def _write_arm(root: Path, arm: str, seed: int, applied: tuple[str, ...]) -> None:
    folder = root / arm
    write_gpu_run(
        folder, num_ranks=NUM_RANKS, num_steps=NUM_STEPS, kernels_per_step=20, seed=seed, workers=1
    )
    meta = RunMeta.now(
        name=folder.name,
        world_size=NUM_RANKS,
        backend="nccl",
        device="cuda",
        hosts=("sim-host",),
        workload={"seed": 7},
        toggles={name: _toggle(name, applied, arm) for name in TOGGLES},
        ranks_present=tuple(range(NUM_RANKS)),
        status="complete",
        simulated=True,
    )
    write_run_json(folder, meta)
    _write_sidecars(folder)


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("browser-state") / "store"
    for arm, seed, applied in ARMS:
        _write_arm(root, arm, seed, applied)
    (root / "broken").mkdir()
    (root / "broken" / "rank0.json").write_text('{"traceEvents": [', encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def server(demo_store: Path, chromium: str) -> Iterator[StreamlitServer]:
    with StreamlitServer(demo_store) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(chromium: str, server: StreamlitServer) -> Iterator[Browser]:
    with Browser(chromium, width=1400, height=1200, timeout_s=30) as chrome:
        yield chrome


def _settled(browser: Browser, title: str) -> None:
    """Until the script has finished on a page titled ``title``, with no skeleton left."""
    browser.wait_for(
        f"(() => {{ const s = {PAGE_STATE_JS}; return !s.running && s.title === "
        f"{json.dumps(title)} && s.skeletons === 0 && s.stale === 0; }})()",
        timeout_s=60,
    )


def _open(browser: Browser, server: StreamlitServer, path: str, title: str, **query: str) -> None:
    suffix = f"?{urlencode(query)}" if query else ""
    browser.navigate(f"{server.url}/{path}{suffix}")
    _settled(browser, title)


def _reload(browser: Browser, title: str) -> None:
    """Reload the page: a new Streamlit session, which knows only the URL."""
    browser.evaluate("window.__fsobsOldDocument = true")
    browser.call("Page.reload")
    browser.wait_for("window.__fsobsOldDocument !== true")
    _settled(browser, title)


def _click_sidebar(browser: Browser, label: str, title: str) -> None:
    browser.evaluate("window.__fsobsLeft = location.href")
    browser.click('[data-testid="stSidebar"] a', label)
    browser.wait_for("location.href !== window.__fsobsLeft")
    _settled(browser, title)


def _where(browser: Browser) -> tuple[str, dict[str, str]]:
    """The page's path and query parameters, as the address bar has them."""
    url = urlsplit(browser.evaluate("location.href"))
    return url.path, dict(parse_qsl(url.query))


def _href_query(href: str) -> dict[str, str]:
    return dict(parse_qsl(urlsplit(href).query))


def _wait_heatmap(browser: Browser, rows: list[str]) -> list[str] | None:
    """The rows of the straggler-wait heatmap once they are ``rows`` (or after 60 s)."""
    try:
        browser.wait_for(
            f"JSON.stringify(({PLOT_JS.replace('TITLE', json.dumps('Straggler wait'))} || {{}}).z)"
            f" === {json.dumps(json.dumps(rows, separators=(',', ':')))}",
            timeout_s=60,
        )
    except TimeoutError:
        pass
    plot = _plot(browser, "Straggler wait")
    return None if plot is None else plot["z"]


@pytest.mark.parametrize(
    ("path", "title", "query"),
    [
        ("bubbles", "Bubbles", {"run": FREESCALE}),
        ("optimizer", "Optimizer", {"run": BALANCED}),
        ("compare", "Compare", {"control": BALANCED, "test": FREESCALE}),
        ("arms", "Arms", {"control": BALANCED, "runs": f"{BALANCED},{FREESCALE}"}),
    ],
)
def test_the_url_keeps_the_runs_through_load_and_reload(
    browser: Browser, server: StreamlitServer, path: str, title: str, query: dict[str, str]
) -> None:
    """None of these is the page's default: the URL used to lose them right after loading,
    and a reload showed the default instead."""
    _open(browser, server, path, title, **query)
    for when in ("load", "reload"):
        assert _where(browser) == (f"/{path}", query), when
        shown = _picked(browser)
        if "run" in query:
            assert shown == {"Run": query["run"]}, (when, shown)
        else:
            assert shown["Control"] == query["control"], (when, shown)
        if "test" in query:
            assert shown["Test"] == query["test"], (when, shown)
        if "runs" in query:
            assert browser.evaluate(ARMS_JS) == query["runs"].split(","), when
        assert browser.evaluate(PAGE_STATE_JS)["exceptions"] == [], when
        if when == "load":
            _reload(browser, title)


def test_the_sidebar_carries_the_run_and_the_rank_filter(
    browser: Browser, server: StreamlitServer
) -> None:
    """Bubbles of one run -> What-if -> Optimizer -> Bubbles stays on that run, and Bubbles
    comes back with the ranks of its filter; the sidebar's links say so in their hrefs."""
    filtered = {"run": FREESCALE, "ranks": "List", "rank_list": "1,3"}
    _open(browser, server, "bubbles", "Bubbles", **filtered)
    assert _wait_heatmap(browser, ["1", "3"]) == ["1", "3"]
    links = browser.evaluate(SIDEBAR_JS)
    assert _href_query(links["What-if"]) == {"run": FREESCALE}, links
    assert _href_query(links["Optimizer"]) == {"run": FREESCALE}, links
    assert _href_query(links["Bubbles"]) == filtered, links
    for label, title, path in (
        ("What-if", "What-if", "/whatif"),
        ("Optimizer", "Optimizer", "/optimizer"),
    ):
        _click_sidebar(browser, label, title)
        assert _where(browser) == (path, {"run": FREESCALE}), label
        # the browser tab names the page
        browser.wait_for(f"document.title === {json.dumps(title + ' · FreeScale')}")
        _assert_picked(browser, {"Baseline run" if title == "What-if" else "Run": FREESCALE})
    _click_sidebar(browser, "Bubbles", "Bubbles")
    assert _where(browser) == ("/bubbles", filtered)
    assert _wait_heatmap(browser, ["1", "3"]) == ["1", "3"]
    _reload(browser, "Bubbles")
    assert _wait_heatmap(browser, ["1", "3"]) == ["1", "3"]
    # The Runs page opens on the session's run, and Compare keeps its pair across pages.
    _click_sidebar(browser, "Runs", "Runs")
    _assert_picked(browser, {"Open a run": FREESCALE})
    pair = {"control": BALANCED, "test": FREESCALE}
    _open(browser, server, "compare", "Compare", **pair)
    _click_sidebar(browser, "Bubbles", "Bubbles")
    _click_sidebar(browser, "Compare", "Compare")
    assert _where(browser) == ("/compare", pair)
    _assert_picked(browser, {"Control": BALANCED, "Test": FREESCALE})


@pytest.mark.parametrize(
    ("path", "title", "query", "named"),
    [
        ("bubbles", "Bubbles", {"run": "nonexistent"}, "`nonexistent` in the store (run="),
        ("whatif", "What-if", {"run": "demo/nope"}, "`demo/nope` in the store (run="),
        (
            "compare",
            "Compare",
            {"control": BASELINE, "test": "../etc"},
            "`../etc` in the store (test=",
        ),
        ("arms", "Arms", {"runs": f"{BASELINE},nope"}, "`nope` in the store (runs="),
    ],
)
def test_an_unknown_id_says_so_and_shows_nothing_else(
    browser: Browser, server: StreamlitServer, path: str, title: str, query: dict, named: str
) -> None:
    _open(browser, server, path, title, **query)
    alerts_js = (
        "Array.from(document.querySelectorAll('[data-testid=\"stAlert\"]')).map((a) => a.innerText)"
    )
    try:
        browser.wait_for(f"{alerts_js}.length > 0", timeout_s=30)
    except TimeoutError:
        pass  # the assert says what is shown
    alerts = browser.evaluate(alerts_js)
    assert len(alerts) == 1 and f"No run {named.split('`')[1]} in the store" in alerts[0], alerts
    assert named.split("(")[1] in alerts[0], alerts
    state = browser.evaluate(PAGE_STATE_JS)
    assert state["charts"] == [] and state["exceptions"] == [], state
    assert not browser.evaluate("!!document.querySelector('[data-testid=\"stMetric\"]')")
    assert not browser.evaluate("!!document.querySelector('[data-testid=\"stDataFrame\"]')")


def test_compare_and_arms_open_on_the_run_with_every_toggle_off(
    browser: Browser, server: StreamlitServer, demo_store: Path
) -> None:
    """Bare ``/compare``: control = the baseline (every toggle off), test = the arm of its
    folder with the most toggles applied; bare ``/arms``: the three arms against the baseline,
    each bar the reduction ``1 - bubble(arm) / bubble(baseline)`` with its bootstrap interval."""
    _open(browser, server, "compare", "Compare")
    _assert_picked(browser, {"Control": BASELINE, "Test": FREESCALE})
    assert _where(browser) == ("/compare", {"control": BASELINE, "test": FREESCALE})
    _reload(browser, "Compare")
    _assert_picked(browser, {"Control": BASELINE, "Test": FREESCALE})

    _open(browser, server, "arms", "Arms")
    browser.wait_for(f"!!{PLOT_JS.replace('TITLE', json.dumps('Bubble reduction of each'))}")
    assert browser.evaluate(ARMS_JS) == [BASELINE, BALANCED, FREESCALE]
    _assert_picked(browser, {"Control": BASELINE})
    assert _where(browser) == (
        "/arms",
        {"control": BASELINE, "runs": f"{BASELINE},{BALANCED},{FREESCALE}"},
    )
    plot = _plot(browser, "Bubble reduction of each arm against demo/baseline")
    assert plot is not None and plot["x"] == [BALANCED, FREESCALE], plot
    base = analyze_path(demo_store / BASELINE)
    for i, arm in enumerate((BALANCED, FREESCALE)):
        test = analyze_path(demo_store / arm)
        reduction = 1 - test.summary["bubble_ms_per_step"] / base.summary["bubble_ms_per_step"]
        assert plot["y"][i] == pytest.approx(100 * reduction), arm
        lo, hi = compare(base, test).bubble_reduction_ci
        assert not math.isnan(lo) and lo <= reduction <= hi, (arm, lo, reduction, hi)
        assert plot["up"][i] == pytest.approx(100 * (hi - reduction)), arm
        assert plot["down"][i] == pytest.approx(100 * (reduction - lo)), arm
    rows_js = (
        'Array.from(document.querySelectorAll(\'[data-testid="stDataFrame"] table[role="grid"]'
        " tbody tr')).map((tr) => tr.children[0].textContent.trim())"
    )
    try:  # the grid's accessible copy follows its canvas a moment later
        browser.wait_for(f"{rows_js}.length === 3", timeout_s=30)
    except TimeoutError:
        pass  # the assert says what is shown
    rows = browser.evaluate(rows_js)
    assert rows == [BASELINE, BALANCED, FREESCALE], rows
    _reload(browser, "Arms")
    assert browser.evaluate(ARMS_JS) == [BASELINE, BALANCED, FREESCALE]


def test_an_upload_is_selected_and_linked(
    browser: Browser, server: StreamlitServer, demo_store: Path, tmp_path: Path
) -> None:
    """After "Store the run", "Open a run" shows the new run and a link opens its Bubbles."""
    files = []
    for name, data in small_run().items():
        (tmp_path / name).write_bytes(data)
        files.append(tmp_path / name)
    _open(browser, server, "runs", "Runs", run=BALANCED)
    browser.set_input_files("input[type=file]", files)
    browser.wait_for(
        "document.querySelectorAll('[data-testid=\"stFileChip\"]').length === 2 && "
        f"!document.querySelector('[data-testid=\"stFileChipIconSpinner\"]') && !{PAGE_STATE_JS}"
        ".running"
    )
    browser.click("button", "Store the run")
    stored = "uploads/upload"
    browser.wait_for(
        "Array.from(document.querySelectorAll('[data-testid=\"stAlert\"]'))"
        f".some((a) => a.innerText.includes({json.dumps(stored)}))"
    )
    _settled(browser, "Runs")
    assert (demo_store / stored).is_dir()
    _assert_picked(browser, {"Open a run": stored})
    assert _where(browser) == ("/runs", {"run": stored})
    hrefs = browser.evaluate(
        "Array.from(document.querySelectorAll('[data-testid=\"stMain\"] a'))"
        ".map((a) => a.getAttribute('href'))"
    )
    bubbles = [h for h in hrefs if h.startswith("bubbles?")]
    assert bubbles and all(_href_query(h) == {"run": stored} for h in bubbles), hrefs
    browser.evaluate("window.__fsobsLeft = location.href")
    browser.evaluate(
        "Array.from(document.querySelectorAll('[data-testid=\"stMain\"] a'))"
        ".find((a) => a.getAttribute('href').startsWith('bubbles?')).click()"
    )
    browser.wait_for("location.href !== window.__fsobsLeft")
    _settled(browser, "Bubbles")
    assert _where(browser) == ("/bubbles", {"run": stored})
    _assert_picked(browser, {"Run": stored})
    shutil.rmtree(demo_store / stored)
