"""The README's screenshots of the dashboard, taken in headless Chromium (``make screenshots``).

    .venv/bin/python -m dashboard.screenshots.take [--demo out/demo] [--out dashboard/screenshots]

The pictures show what a user sees on real runs: the demo's store (``make demo``: the
reference job on 2 gloo ranks in four arms with real toggles, 3 interleaved pairs), served as
``fsobs dashboard --store out/demo`` serves it, and driven over the DevTools Protocol
(``tests/support/cdp.py``, the browser tests' method):

- ``bubbles.png``: Bubbles of ``baseline-0``, the first view (the answer first);
- ``bubbles-classes.png``: the same page scrolled to its classes per rank and the
  straggler-wait heatmap;
- ``compare.png``: Compare, ``balanced-P`` against ``baseline-P``, where P is the pair whose
  reduction is the median of the pairs' (no pair picked for looking good);
- ``whatif.png``: What-if of ``baseline-P``: each toggle predicted from that baseline;
- ``arms.png``: Arms, every arm of pair P against its baseline;
- ``bubbles-64.png`` and ``live.png`` are **simulated** (``fsobs simulate``; the demo has 2
  ranks and no live run): a 64-rank run with rank 5 1.5x slower, and a 4-rank run in the live
  layout (rank 2 2.5x slower from step 30, rank 1 leaving one window unpublished) marked as
  still running.

Each shot waits until the page's script has finished and its charts are drawn; a page that
never gets there stops the script with the page named (exit 1).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlencode

import msgspec

from fsobs import analyze_path
from fsobs.analysis import compare
from fsobs.cli import main as fsobs_main
from fsobs.runformat import read_run_json, write_run_json
from tests.support.cdp import Browser, StreamlitServer, find_chromium, page_ready_js

ROOT = Path(__file__).resolve().parents[2]
ARMS = ("balanced", "pec", "freescale")
"""The demo's arms beside its baseline (``fsobs.workload.demo.ARMS``)."""
NOT_RUNNING = (
    "document.querySelector('[data-testid=\"stApp\"]').dataset.testScriptState === 'notRunning'"
)
NO_PROGRESS = "!document.querySelector('[data-testid=\"stProgress\"]')"


@dataclass(frozen=True)
class Shot:
    """One screenshot: the page, its URL parameters, the title and number of charts it must
    show, and what to scroll into view (a chart title's start) before the picture."""

    name: str
    page: str
    query: dict[str, str]
    title: str
    charts: int
    scroll_to: str | None = None
    height: int = 1000
    ready: str = "true"


def median_pair(demo: Path) -> int:
    """The pair whose balanced-vs-baseline bubble reduction is the median of the pairs'."""
    pairs = sorted(int(p.name.removeprefix("baseline-")) for p in demo.glob("baseline-*"))
    reductions = {
        i: compare(analyze_path(demo / f"baseline-{i}"), analyze_path(demo / f"balanced-{i}"))
        for i in pairs
    }
    for i, comp in reductions.items():
        lo, hi = comp.bubble_reduction_ci
        print(f"pair {i}: balanced removes {comp.bubble_reduction:.1%} ({lo:.1%} to {hi:.1%})")
    middle = statistics.median_low(c.bubble_reduction for c in reductions.values())
    return next(i for i, c in reductions.items() if c.bubble_reduction == middle)


def demo_shots(pair: int) -> list[Shot]:
    base = f"baseline-{pair}"
    bubbles = Shot("bubbles", "bubbles", {"run": "baseline-0"}, "Bubbles", 2, height=1250)
    return [
        bubbles,
        replace(bubbles, name="bubbles-classes", scroll_to="Bubble per rank", height=1100),
        Shot(
            "compare",
            "compare",
            {"control": base, "test": f"balanced-{pair}"},
            "Compare",
            3,
            height=1250,
        ),
        Shot("whatif", "whatif", {"run": base}, "What-if", 2, height=1400, ready=NO_PROGRESS),
        Shot(
            "arms",
            "arms",
            {"control": base, "runs": ",".join([base, *(f"{arm}-{pair}" for arm in ARMS)])},
            "Arms",
            1,
            height=1100,
        ),
    ]


def simulated_store(root: Path) -> Path:
    """``sim64``: 64 ranks, rank 5 slower; ``live``: 4 ranks in the live layout, marked as a
    job still writing it (``run.json`` incomplete, reason running; ``.partial`` sidecars)."""
    sim = ("simulate", "--workers", "2")
    big = ("--world-size", "64", "--steps", "4", "--slow-rank", "5", "--slow-factor", "1.5")
    assert fsobs_main([*sim, *big, "--out", str(root / "sim64")]) == 0
    live = root / "live"
    slow = ("--slow-rank", "2", "--slow-from", "30", "--slow-factor", "2.5")
    windows = ("--window-every", "5", "--window-steps", "4", "--unpublished", "16:1")
    assert (
        fsobs_main(
            [*sim, "--world-size", "4", "--steps", "60", *slow, *windows, "--out", str(live)]
        )
        == 0
    )
    meta = read_run_json(live)
    assert meta is not None
    write_run_json(live, msgspec.structs.replace(meta, status="incomplete", reason="running"))
    for sidecar in live.glob("steps.rank*.jsonl"):
        sidecar.rename(sidecar.with_name(sidecar.name + ".partial"))
    return root


def take(server: StreamlitServer, chromium: str, shot: Shot, out: Path) -> Path:
    with Browser(chromium, width=1400, height=shot.height, timeout_s=60) as browser:
        url = f"{server.url}/{shot.page}?{urlencode(shot.query)}"
        browser.navigate(url)
        try:
            browser.wait_for(page_ready_js(shot.title, shot.charts), timeout_s=300, poll_s=0.2)
            browser.wait_for(f"({shot.ready}) && {NOT_RUNNING}", timeout_s=300, poll_s=0.2)
        except TimeoutError as exc:
            raise SystemExit(f"{shot.name}: {url} did not finish rendering ({exc})") from None
        if shot.scroll_to is not None:
            browser.evaluate(
                "Array.from(document.querySelectorAll('.js-plotly-plot')).find((p) => "
                f"(p.querySelector('.gtitle') || {{}}).textContent?.startsWith('{shot.scroll_to}'))"
                ".scrollIntoView({block: 'start'})"
            )
        time.sleep(1.0)  # Plotly's transitions
        return browser.screenshot(out / f"{shot.name}.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--demo", type=Path, default=ROOT / "out" / "demo")
    parser.add_argument("--out", type=Path, default=ROOT / "dashboard" / "screenshots")
    args = parser.parse_args(argv)
    chromium = find_chromium()
    if chromium is None:
        print("chromium not found (make browser installs it, or set CHROMIUM)", file=sys.stderr)
        return 2
    if not (args.demo / "baseline-0").is_dir():
        print(f"no demo store in {args.demo}: run make demo first", file=sys.stderr)
        return 2
    pair = median_pair(args.demo)
    print(f"Compare, What-if and Arms show pair {pair} (the median reduction)")
    with StreamlitServer(args.demo.resolve(), startup_timeout_s=120) as server:
        for shot in demo_shots(pair):
            print(f"wrote {take(server, chromium, shot, args.out)}")
    with tempfile.TemporaryDirectory(prefix="fsobs-screenshots-") as tmp:
        store = simulated_store(Path(tmp))
        with StreamlitServer(store, startup_timeout_s=120) as server:
            for shot in (
                Shot("bubbles-64", "bubbles", {"run": "sim64"}, "Bubbles", 3, height=1300),
                Shot("live", "live", {"run": "live"}, "Live", 2, height=2000),
            ):
                print(f"wrote {take(server, chromium, shot, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
