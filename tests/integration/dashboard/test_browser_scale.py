"""A 256-rank run in a real headless Chromium (issue 26): correctness at scale, not timing.

The run is simulated (``fsobs.simulate``: 256 ranks, 4 steps, the run format with sidecars)
into a temporary store, served by ``streamlit run`` and driven over the DevTools Protocol
(``tests/support/cdp.py``), as in ``test_browser.py``:

- the Optimizer page folds its per-rank bars: the 16 ranks costliest before balancing (computed
  here from the sidecars' lengths and the cost model fsobs fits), then one bar ``others`` with
  the mean of the other 240, and the title says so; its cost fit draws every (rank, step)
  point (above 1000, their density);
- the Bubbles page's Stragglers tab names every rank on its axis only when the stragglers
  span at most 32 ranks (else Plotly's few ticks), and its Data attribution tab draws the
  density of the (rank, step) points, each counted once;
- the What-if page shows a progress bar while it predicts, and once done its caption and its
  draws selector name the same number of draws (fewer than the 50 asked: a run this big gets
  fewer, and the selector says so).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dashboard.ranks import DEFAULT_TOP_K, OTHERS
from fsobs import analyze_path
from fsobs.analysis.costfit import fit_cost
from fsobs.runformat.steps import read_step_lengths
from fsobs.simulate.simulator import SimConfig, simulate, write_run
from tests.support.cdp import PAGE_STATE_JS, Browser, StreamlitServer

pytestmark = pytest.mark.browser

RUN_ID, RANKS, STEPS = "sim256", 256, 4

# A chart of the page by its title's start: its title, its first trace's type, x and y.
CHART_JS = """((start) => {
  const plot = Array.from(document.querySelectorAll('.js-plotly-plot')).find((p) =>
    ((p.querySelector('.gtitle') || {}).textContent || '').startsWith(start));
  if (!plot || !plot.querySelector('.main-svg')) return null;
  const first = plot._fullData[0];
  return {title: plot.querySelector('.gtitle').textContent, type: first.type,
          x: Array.from(first.x).map(String), y: Array.from(first.y)};
})"""
BALANCE_JS = f"{CHART_JS}('Per-rank cost')"
# A density chart by its title's start: its first trace's type and the points its cells count.
DENSITY_JS = """((start) => {
  const plot = Array.from(document.querySelectorAll('.js-plotly-plot')).find((p) =>
    ((p.querySelector('.gtitle') || {}).textContent || '').startsWith(start));
  if (!plot || !plot.querySelector('.main-svg')) return null;
  const first = plot._fullData[0];
  let points = 0;
  for (const row of Array.from(first.z || [])) for (const v of Array.from(row)) points += v || 0;
  return {type: first.type, points: points};
})"""
# The stragglers chart's y axis: its tick mode and the tick labels Plotly drew.
STRAGGLER_TICKS_JS = """(() => {
  const plot = Array.from(document.querySelectorAll('.js-plotly-plot')).find((p) =>
    ((p.querySelector('.gtitle') || {}).textContent || '').startsWith('Straggler rank per step'));
  if (!plot || !plot.querySelector('.main-svg')) return null;
  return {mode: plot._fullLayout.yaxis.tickmode, y: Array.from(plot._fullData[0].y),
          labels: Array.from(plot.querySelectorAll('.ytick text')).map((t) => t.textContent)};
})()"""
COST_FIT_JS = f"{DENSITY_JS}('Cost model')"
# The What-if page: its progress bar (if any), the draws caption, the selector's shown value.
WHATIF_JS = """(() => {
  const bar = document.querySelector('[data-testid="stProgress"]');
  const caption = Array.from(document.querySelectorAll('[data-testid="stCaptionContainer"]'))
    .map((c) => c.innerText).find((t) => t.includes('draws of the residual noise'));
  const box = Array.from(document.querySelectorAll('[data-testid="stSelectbox"]'))
    .find((b) => b.innerText.includes('Noise draws'));
  const app = document.querySelector('[data-testid="stApp"]');
  return {progress: bar ? bar.innerText : null, caption: caption || null,
          selector: box ? box.querySelector('input[role="combobox"]').value : null,
          done: !!app && app.dataset.testScriptState === 'notRunning'};
})()"""


@pytest.fixture(scope="module")
def scale_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("scale") / "store"
    cfg = replace(SimConfig(), world_size=RANKS, steps=STEPS, seed=0)
    write_run(simulate(cfg, ()), store / RUN_ID, workers=1)
    return store


@pytest.fixture(scope="module")
def scale_browser(scale_store: Path, chromium: str) -> Iterator[tuple[Browser, StreamlitServer]]:
    with (
        StreamlitServer(scale_store) as server,
        Browser(chromium, width=1400, height=1400, timeout_s=120) as browser,
    ):
        yield browser, server


def test_the_optimizer_page_folds_256_ranks(
    scale_browser: tuple[Browser, StreamlitServer], scale_store: Path
) -> None:
    browser, server = scale_browser
    run_dir = scale_store / RUN_ID
    analysis = analyze_path(run_dir)
    model = fit_cost(analysis).model  # the page's default cost model: fitted on the run
    first_step = int(analysis.run.sidecar["step"].min())  # the page's default step
    lengths = read_step_lengths(run_dir, first_step)
    before = {r: float(np.sum(model(np.asarray(lengths[r], dtype=float)))) for r in lengths}
    top = sorted(before, key=lambda r: (-before[r], r))[:DEFAULT_TOP_K]
    rest = [before[r] for r in before if r not in top]

    browser.navigate(f"{server.url}/optimizer?run={RUN_ID}")
    # both charts drawn (Plotly draws each on its own time: the WebGL one can come last)
    browser.wait_for(
        f"!!{BALANCE_JS} && !!{COST_FIT_JS} && !{PAGE_STATE_JS}.running", timeout_s=120
    )
    state = browser.evaluate(PAGE_STATE_JS)
    assert state["exceptions"] == [], state["exceptions"]
    bars = browser.evaluate(BALANCE_JS)
    assert bars["x"] == [*map(str, top), OTHERS], bars["x"]
    np.testing.assert_allclose(bars["y"][:-1], [before[r] for r in top], rtol=1e-9)
    assert bars["y"][-1] == pytest.approx(float(np.mean(rest)), rel=1e-9)
    assert len(rest) == RANKS - DEFAULT_TOP_K
    assert f"the mean of the {RANKS - DEFAULT_TOP_K} others" in bars["title"], bars["title"]
    # the cost fit's (rank, step) points: above 1000, their density, each counted once
    fit = browser.evaluate(COST_FIT_JS)
    assert fit == {"type": "heatmap", "points": RANKS * STEPS}, fit


def _open_tab(browser: Browser, tab: str, chart_js: str) -> None:
    browser.click('[role="tab"]', tab)
    time.sleep(0.3)  # the click's rerun starts
    browser.wait_for(f"!!{chart_js} && !{PAGE_STATE_JS}.running", timeout_s=120)
    assert browser.evaluate(PAGE_STATE_JS)["exceptions"] == []


def test_the_bubbles_tabs_at_256_ranks(
    scale_browser: tuple[Browser, StreamlitServer], scale_store: Path
) -> None:
    browser, server = scale_browser
    per_step = analyze_path(scale_store / RUN_ID).stragglers.per_step.dropna(subset=["rank"])
    stragglers = [int(r) for r in per_step["rank"]]
    browser.navigate(f"{server.url}/bubbles?run={RUN_ID}")
    browser.wait_for(f"!!{PAGE_STATE_JS}.drawn && !{PAGE_STATE_JS}.running", timeout_s=120)
    _open_tab(browser, "Stragglers", STRAGGLER_TICKS_JS)
    ticks = browser.evaluate(STRAGGLER_TICKS_JS)
    assert ticks["y"] == stragglers, ticks
    span = max(stragglers) - min(stragglers) + 1
    if span <= 32:  # a tick per rank from the lowest to the highest straggler
        assert ticks["mode"] == "linear" and len(ticks["labels"]) >= span, ticks
    else:  # Plotly's own few ticks, whole ranks
        assert ticks["mode"] == "auto" and len(ticks["labels"]) < 32, ticks
        assert all(label.replace("\u2212", "-").lstrip("-").isdigit() for label in ticks["labels"])
    _open_tab(browser, "Data attribution", f"{CHART_JS}('Data cost against')")
    density = browser.evaluate(f"{DENSITY_JS}('Data cost against')")
    # one point per rank and step: 1024 > 1000, so their density, every point counted once
    assert density["type"] == "heatmap", density
    assert density["points"] == RANKS * STEPS, density


def test_whatif_shows_progress_and_one_number_of_draws(
    scale_browser: tuple[Browser, StreamlitServer],
) -> None:
    browser, server = scale_browser
    browser.navigate(f"{server.url}/whatif?run={RUN_ID}")
    seen: set[str] = set()
    deadline = time.monotonic() + 300
    while True:
        state = browser.evaluate(WHATIF_JS)
        if state["progress"]:
            seen.add(state["progress"])
        if state["done"] and state["caption"]:
            break
        assert time.monotonic() < deadline, f"What-if not done: {state}"
        time.sleep(0.05)
    assert any(text.startswith("Predicting") for text in seen), seen
    assert state["progress"] is None, state  # gone once the predictions are drawn
    assert browser.evaluate(PAGE_STATE_JS)["exceptions"] == []
    used = int(re.search(r"\((\d+) draws of the residual noise", state["caption"]).group(1))
    assert used < 50  # 256 ranks: the replays' budget allows fewer than the 50 asked
    assert state["selector"] == f"{used} (of 50: capped)", json.dumps(state)
