"""Benchmark: a big run analyzed in the background by the dashboard, in a real browser (issue 35).

    .venv/bin/python benchmarks/bench_dashboard_big.py [--ranks 64] [--mb-per-rank 100] [--peers 3]
    .venv/bin/python benchmarks/bench_dashboard_big.py --quick     # 8 ranks x 20 MB: a smoke check

The run is a synthetic NCCL run at ``bench_load.py``'s density (5 steps, seed 0, ``--ranks`` x
``--mb-per-rank`` MB of JSON per rank; 64 x 100 MB is 6.4 GB of JSON), written once to
``bench_data/`` by ``bench_load.ensure_synthetic`` and linked into a temporary store. The app is
served by ``streamlit run`` and driven in headless Chromium over the DevTools Protocol, as in
``bench_dashboard.py`` (whose helpers this reuses). Each of ``--cold`` rounds starts a fresh
server with no disk cache and measures, from the navigation to ``/bubbles?run=<id>``:

- **progress bar**: until the page shows the background analysis' progress bar;
- **progress bar last seen**: the job is done and the page reruns;
- **complete**: until the Bubbles page is complete (``page_ready_js``: script finished, its 3
  charts drawn), parsing and the disk-cache write included;
- **peak RSS / PSS** of the server's process tree (the parser processes included), sampled every
  20 ms (PSS every 0.2 s) from the navigation to the complete page;
- **peers**: meanwhile (from the progress bar on), ``--peers`` other sessions, one after the
  other (a fresh browser each), open the Runs page until complete: how long each took and
  whether the progress bar was still shown after it finished (the point of the background:
  other sessions are not held up).

Then a new server opens the same page from the disk cache (``bench_dashboard.cold_open``).
As there, the script waits until other processes leave the CPUs idle before each round and says
how many cores they used meanwhile.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench_dashboard import (  # noqa: E402  (benchmarks/ is this script's directory)
    BUBBLES_READY,
    ForeignCpu,
    cold_open,
    least_disturbed,
    link_run,
)
from bench_load import (  # noqa: E402
    PSS_EVERY,
    SAMPLE_S,
    _sizes,
    _tree_memory,
    _wait_until_quiet,
    ensure_synthetic,
)

from dashboard.disk_cache import CACHE_DIR  # noqa: E402
from tests.support.cdp import Browser, StreamlitServer, find_chromium, page_ready_js  # noqa: E402

PROGRESS_JS = "!!document.querySelector('[data-testid=\"stProgress\"]')"
RUNS_READY = page_ready_js("Runs", 0)
QUICK = {"ranks": 8, "mb_per_rank": 20}
TIMEOUT_S = 3600.0


class PeakMemory:
    """The largest RSS and PSS (bytes, summed over the process tree of ``pid``) sampled
    between ``__enter__`` and ``__exit__``, by a thread."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._stop = threading.Event()
        self.rss = self.pss = 0

    def _sample(self) -> None:
        count = 0
        while not self._stop.is_set():
            rss, pss = _tree_memory(self._pid, with_pss=count % PSS_EVERY == 0)
            self.rss, self.pss = max(self.rss, rss), max(self.pss, pss)
            count += 1
            time.sleep(SAMPLE_S)

    def __enter__(self) -> PeakMemory:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Round:
    """One cold open of the big run, with the peer sessions' Runs pages meanwhile."""

    progress_s: float
    analyzed_s: float
    """Until the progress bar was last seen (the job done, the page rerunning)."""
    complete_s: float
    peak_rss: int
    peak_pss: int
    foreign: float
    peers: list[tuple[float, bool]] = field(default_factory=list)
    """Per peer: seconds to its complete Runs page, and whether the analysis still ran then."""


def _wait(browser: Browser, js: str, start: float) -> float:
    """Poll (every 20 ms) until ``js`` holds; seconds since ``start``."""
    while not browser.evaluate(js):
        if time.perf_counter() - start > TIMEOUT_S:
            raise TimeoutError(f"not true after {TIMEOUT_S} s: {js[:80]}")
        time.sleep(0.02)
    return time.perf_counter() - start


def _peers(
    server: StreamlitServer, chromium: str, count: int, start: float
) -> list[tuple[float, float]]:
    """``count`` sessions opening the Runs page one after the other, each in a fresh browser:
    per session, when its page was complete (s since ``start``) and how long it took."""
    out = []
    for _ in range(count):
        with Browser(chromium, timeout_s=TIMEOUT_S) as peer:
            began = time.perf_counter()
            peer.navigate(f"{server.url}/runs")
            done = _wait(peer, RUNS_READY, start)
            out.append((done, time.perf_counter() - began))
    return out


def _follow(first: Browser, start: float) -> tuple[float, float, float]:
    """Poll the first session (every 20 ms) until its page is complete: when the progress bar
    was first seen, when it was last seen, and when the page was complete (s since ``start``)."""
    seen: list[float] = []
    while True:
        state = first.evaluate(f"[{PROGRESS_JS}, {BUBBLES_READY}]")
        assert isinstance(state, list)
        bar, ready = state
        now = time.perf_counter() - start
        if bar:
            seen.append(now)
        if ready and seen:
            return seen[0], seen[-1], now
        if now > TIMEOUT_S:
            raise TimeoutError(f"Bubbles not complete after {TIMEOUT_S} s")
        time.sleep(0.02)


def cold_round(store: Path, chromium: str, url_path: str, peers: int, max_foreign: float) -> Round:
    """A fresh server, no disk cache: the big run's Bubbles page until complete, while peer
    sessions (in a thread, once the progress bar shows) open the Runs page."""
    shutil.rmtree(store / CACHE_DIR, ignore_errors=True)
    during: list[tuple[float, float]] = []
    with StreamlitServer(store) as server, Browser(chromium, timeout_s=TIMEOUT_S) as first:
        _wait_until_quiet(max_foreign)
        with ForeignCpu(server.pid, first.pid) as foreign, PeakMemory(server.pid) as memory:
            start = time.perf_counter()
            first.navigate(f"{server.url}{url_path}")
            _wait(first, PROGRESS_JS, start)
            walk = threading.Thread(
                target=lambda: during.extend(_peers(server, chromium, peers, start))
            )
            walk.start()
            progress_s, analyzed_s, complete_s = _follow(first, start)
            walk.join()
    peers_done = [(took, done < analyzed_s) for done, took in during]
    return Round(
        progress_s, analyzed_s, complete_s, memory.rss, memory.pss, foreign.cores, peers_done
    )


def report(rounds: list[Round], disks: list[float]) -> str:
    """The Markdown table of the rounds' medians."""

    def row(name: str, values: list[float], unit: str) -> str:
        every = ", ".join(f"{v:.2f}" for v in values)
        return f"| {name} | {statistics.median(values):.2f} {unit} | {every} |"

    lines = ["| measurement | median | every round |", "|---|--:|---|"]
    lines.append(row("navigate -> progress bar", [r.progress_s for r in rounds], "s"))
    lines.append(row("navigate -> progress bar last seen", [r.analyzed_s for r in rounds], "s"))
    lines.append(row("navigate -> Bubbles complete (cold)", [r.complete_s for r in rounds], "s"))
    lines.append(row("Bubbles via the disk cache (new server)", disks, "s"))
    lines.append(row("server peak RSS (tree)", [r.peak_rss / 2**30 for r in rounds], "GiB"))
    lines.append(row("server peak PSS (tree)", [r.peak_pss / 2**30 for r in rounds], "GiB"))
    peers = [p for r in rounds for p in r.peers]
    if peers:
        lines.append(
            row("a peer's Runs page (opened during the analysis)", [t for t, _ in peers], "s")
        )
        still = sum(running for _, running in peers)
        lines.append(f"| peers done while the analysis still ran | {still} of {len(peers)} | |")
    lines.append(
        f"\nOther processes' CPU during each round, cores: {[round(r.foreign, 2) for r in rounds]}."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--mb-per-rank", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="8 ranks x 20 MB (a smoke check)")
    parser.add_argument("--peers", type=int, default=3, help="Runs-page sessions meanwhile")
    parser.add_argument("--cold", type=int, default=1, help="rounds, each a fresh server")
    parser.add_argument("--data", type=Path, default=ROOT / "bench_data")
    parser.add_argument("--max-foreign", type=float, default=0.2)
    args = parser.parse_args(argv)
    if args.quick:
        args.ranks, args.mb_per_rank = QUICK["ranks"], QUICK["mb_per_rank"]
    chromium = find_chromium()
    if chromium is None:
        raise SystemExit("chromium not found: run `make browser` (or set CHROMIUM)")
    run_dir = ensure_synthetic(args.data, args.ranks, args.mb_per_rank)
    ranks, gz_bytes, json_bytes = _sizes(run_dir)
    url_path = f"/bubbles?run={quote(run_dir.name, safe='')}"
    rounds, disks = [], []
    with tempfile.TemporaryDirectory(prefix="fsobs-bench-store-") as tmp:
        store = Path(tmp)
        link_run(run_dir, store, run_dir.name)
        for i in range(args.cold):

            def take() -> dict[str, Any]:
                done = cold_round(store, chromium, url_path, args.peers, args.max_foreign)
                return {"round": done, "foreign": done.foreign}

            rounds.append(least_disturbed(take, args.max_foreign)["round"])
            disk = cold_open(store, chromium, url_path, args.max_foreign, disk_cache=True)
            disks.append(disk["phases"].total)
            print(f"  [{i + 1}/{args.cold}] {rounds[-1]}", file=sys.stderr, flush=True)
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(
        f"\nRun: {ranks} ranks, {gz_bytes / 1e6:.1f} MB gzipped / {json_bytes / 1e6:.1f} MB of "
        f"JSON; {args.peers} peer session(s) per round; {os.cpu_count()} CPUs, load average "
        f"{load}; Dask scheduler: {os.environ.get('FSOBS_DASK_SCHEDULER') or 'none'}.\n"
    )
    print(report(rounds, disks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
