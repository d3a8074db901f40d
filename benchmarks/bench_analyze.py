"""Benchmark: what the bubble analysis costs on top of loading, on a 64-rank x 20-step GPU run.

Three measurements, each in a fresh child process (imports excluded from the time, peak RSS and
PSS of the child's whole process tree sampled from here):

- ``parse``: every rank parsed into its event table and dropped (the load alone);
- ``analyze``: ``fsobs.analysis.analyze_path`` (what ``fsobs analyze`` runs: parse, per-rank
  reduction in the workers, collective matching, bubbles, stragglers, KPIs, HTA metrics);
- ``one_rank``: one rank parsed and reduced in-process: "one rank's worth" of memory.

Goals: analyze <= 2x parse; analyze's peak memory near one rank's worth.
The run is generated once with :func:`fsobs.simulate.write_gpu_run` into ``bench_data/``.

    .venv/bin/python benchmarks/bench_analyze.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_load import _tree_memory, _wait_until_quiet  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUN = {"num_ranks": 64, "num_steps": 20, "kernels_per_step": 200, "seed": 0}
MODES = ("parse", "analyze", "one_rank")


@dataclass
class _Parsed:
    """What the ``parse`` mode keeps of a rank: its identity only."""

    rank: int
    world_size: int
    path: Path
    warnings: list[str]


def _drop_events(trace) -> _Parsed:  # noqa: ANN001 (a RankTrace)
    return _Parsed(trace.rank, trace.world_size, trace.path, list(trace.warnings))


def worker(mode: str, trace_dir: str) -> None:
    from fsobs.analysis import analyze_path, summarize_rank
    from fsobs.trace import load_rank
    from fsobs.trace.loader import map_run

    start = time.perf_counter()
    if mode == "parse":
        run = map_run(trace_dir, _drop_events)
        facts = {"ranks": len(run.ranks)}
    elif mode == "analyze":
        analysis = analyze_path(trace_dir)
        facts = {"ranks": len(analysis.run.ranks), "steps": len(analysis.run.steps)}
        facts["bubble_ratio"] = analysis.summary["bubble_ratio"]
        facts["straggler"] = analysis.stragglers.culprit
    else:
        first = sorted(Path(trace_dir).glob("*.json.gz"))[0]
        summary = summarize_rank(load_rank(first))
        facts = {"ranks": 1, "steps": len(summary.steps)}
    print(json.dumps({"work_s": time.perf_counter() - start, **facts}))


def measure(mode: str, trace_dir: Path) -> dict[str, float]:
    child = subprocess.Popen(
        [sys.executable, __file__, "--worker", mode, str(trace_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )
    peaks = {"rss": 0, "pss": 0}

    def sample() -> None:
        n = 0
        while child.poll() is None:
            rss, pss = _tree_memory(child.pid, with_pss=n % 10 == 0)
            peaks["rss"] = max(peaks["rss"], rss)
            peaks["pss"] = max(peaks["pss"], pss)
            n += 1
            time.sleep(0.02)

    thread = threading.Thread(target=sample)
    thread.start()
    out, _ = child.communicate()
    thread.join()
    if child.returncode:  # its stderr went to ours as it ran: the reason is just above
        raise SystemExit(f"the {mode} worker on {trace_dir} failed with {child.returncode}")
    result = json.loads(out.strip().splitlines()[-1])
    return result | {"rss_mib": peaks["rss"] / 2**20, "pss_mib": peaks["pss"] / 2**20}


def ensure_run(data_dir: Path, num_ranks: int = RUN["num_ranks"]) -> Path:
    """``data_dir/synthetic_<N>x<steps>``: the run of :data:`RUN` with ``num_ranks`` ranks,
    written unless all its files are there."""
    out = data_dir / f"synthetic_{num_ranks}x{RUN['num_steps']}"
    if len(list(out.glob("*.json.gz"))) != num_ranks:
        from fsobs.simulate import write_gpu_run

        print(f"  writing {out} ...", file=sys.stderr, flush=True)
        write_gpu_run(out, **(RUN | {"num_ranks": num_ranks}))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", type=Path, default=ROOT / "bench_data")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return 0
    trace_dir = ensure_run(args.data)
    size_mb = sum(p.stat().st_size for p in trace_dir.glob("*.json.gz")) / 1e6
    results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for _ in range(args.repeats):
        for mode in MODES:
            _wait_until_quiet(max_foreign=0.3)
            results[mode].append(measure(mode, trace_dir))
            print(f"  {mode}: {results[mode][-1]}", file=sys.stderr)
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in results.items()}
    print(f"Run: {RUN} ({size_mb:.1f} MB gzipped), median of {args.repeats}.\n")
    print("| measurement | work s | peak RSS MiB | peak PSS MiB |")
    print("|---|--:|--:|--:|")
    for mode in MODES:
        m = med[mode]
        print(f"| {mode} | {m['work_s']:.2f} | {m['rss_mib']:.0f} | {m['pss_mib']:.0f} |")
    ratio = med["analyze"]["work_s"] / med["parse"]["work_s"]
    mem = med["analyze"]["pss_mib"] / med["one_rank"]["pss_mib"]
    verdict = "met" if ratio <= 2 else "MISSED"
    print(f"\n- analyze / parse time: {ratio:.2f}x (goal <= 2x: {verdict})")
    print(f"- analyze peak PSS / one rank's: {mem:.2f}x")
    print(f"- straggler found: rank {results['analyze'][0]['straggler']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
