"""Benchmark: ``analyze_path`` on a 2-worker Dask LocalCluster against the local fork pool.

Synthetic NCCL runs (:func:`fsobs.simulate.write_gpu_run`, 20 steps, 200 kernels per step, the
64-rank run of ``bench_analyze.py`` scaled) of 32, 64, 128, 256 and 512 ranks are written once into
``bench_data/``. A ``LocalCluster(n_workers=2, threads_per_worker=1)`` is started here, warmed
up with one analysis, and kept for all measurements. Each measurement is one fresh client
process (this script with ``--worker``) that runs ``analyze_path(run, LoadConfig(scheduler=...))``
with either ``local`` (the fork pool: 2 parser processes on this 2-core machine) or the
cluster's address, and reports:

- ``work s``: the analysis, imports excluded (wall clock);
- ``CPU s``: CPU time of every process involved: the client and its fork pool, or the client,
  the scheduler (in this process) and the two Dask workers. On a shared machine it is the
  steadier measure of what each engine costs;
- ``client peak RSS``: the client process's own peak resident set (``VmHWM`` of
  ``/proc/self/status``; the parser processes, forked children or Dask workers, are not
  counted), and ``after imports``, its RSS before the analysis starts: the difference is what
  the analysis itself held. Not ``ru_maxrss``: Linux carries it over from the parent across
  ``fork`` and ``exec``, so a client started by a bigger process reports the parent's size;
- ``spilled MB``: the class intervals the analysis keeps on disk (``Analysis.bubbles.nbytes``).

Then, once per size, a third client (local pool) traces the Python heap (``tracemalloc``, not
timed: tracing slows allocation): what the analysis still holds when it returns, and its peak
during the analysis. These are the objects themselves, without the allocator's slack that
the peak RSS also counts.

The time ratio ``cluster / local`` is measured at the largest size, alternating the two engines
``--repeats`` times (median); the other sizes run once each, for the memory curve.

    .venv/bin/python benchmarks/bench_cluster.py [--repeats 3] [--sizes 32 64 128 256 512]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_analyze import RUN, ensure_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("local", "cluster")
HEAP = "heap"
"""``--worker DIR heap``: trace the Python heap of a local analysis instead of timing it."""


def worker(trace_dir: str, scheduler: str) -> None:
    import psutil

    from fsobs import LoadConfig, analyze_path

    if scheduler == HEAP:
        heap(trace_dir)
        return
    if scheduler != "local":
        import distributed  # noqa: F401 (imported by the analysis anyway: not its memory)
    after_imports = psutil.Process().memory_info().rss
    start = time.perf_counter()
    analysis = analyze_path(trace_dir, LoadConfig(scheduler=scheduler))
    work_s = time.perf_counter() - start
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # the fork pool's parsers
    peak = _peak_rss()
    result = {
        "work_s": work_s,
        "client_cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
        "peak_mib": peak / 2**20,
        "imports_mib": after_imports / 2**20,
        "ranks": len(analysis.run.ranks),
        "bubble_ratio": analysis.summary["bubble_ratio"],
        "spilled_mb": analysis.bubbles.nbytes / 1e6,
    }
    print(json.dumps(result))


def _peak_rss() -> int:
    """This process's peak resident set since it started (bytes): ``VmHWM``, which, unlike
    ``ru_maxrss``, starts afresh at ``exec``."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status")


def heap(trace_dir: str) -> None:
    """The Python heap the analysis holds when it returns and at its peak (MiB)."""
    import gc
    import tracemalloc

    from fsobs import LoadConfig, analyze_path

    tracemalloc.start()
    analysis = analyze_path(trace_dir, LoadConfig(scheduler="local"))
    gc.collect()
    held, peak = tracemalloc.get_traced_memory()
    print(json.dumps({"held_mib": held / 2**20, "peak_mib": peak / 2**20, "ok": bool(analysis)}))


def _client(trace_dir: Path, scheduler: str) -> dict[str, float]:
    """What one fresh client process (``--worker``) reports."""
    out = subprocess.run(
        [sys.executable, __file__, "--worker", str(trace_dir), scheduler],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure(trace_dir: Path, scheduler: str) -> dict[str, float]:
    """One client process; ``cpu_s`` adds what this process (the LocalCluster's scheduler) and
    the Dask workers used meanwhile to the client's own CPU time (with its fork pool's)."""
    before = _cluster_cpu_s()
    result = _client(trace_dir, scheduler)
    result["cpu_s"] = result.pop("client_cpu_s") + _cluster_cpu_s() - before
    return result


def _cluster_cpu_s() -> float:
    """CPU seconds of this process and its live descendants (the Dask workers)."""
    import psutil

    total = 0.0
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed pairs at the largest size")
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 128, 256, 512])
    parser.add_argument("--data", type=Path, default=ROOT / "bench_data")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return 0
    from distributed import LocalCluster

    runs = {n: ensure_run(args.data, n) for n in sorted(args.sizes)}
    largest = max(runs)
    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=":0",
        worker_dashboard_address=None,
    ) as cluster:
        address = {"local": "local", "cluster": cluster.scheduler_address}
        measure(runs[min(runs)], address["cluster"])  # warm-up: workers import fsobs
        rows: dict[tuple[int, str], list[dict[str, float]]] = {}
        for n, trace_dir in runs.items():
            for _ in range(args.repeats if n == largest else 1):
                for engine in ENGINES:
                    m = measure(trace_dir, address[engine])
                    rows.setdefault((n, engine), []).append(m)
                    print(f"  {n} ranks, {engine}: {m}", file=sys.stderr, flush=True)
    heaps = {n: _client(trace_dir, HEAP) for n, trace_dir in runs.items()}
    print(f"  heap: {heaps}", file=sys.stderr, flush=True)
    _report(rows, heaps, runs, largest, args.repeats)
    return 0


def _report(
    rows: dict[tuple[int, str], list[dict[str, float]]],
    heaps: dict[int, dict[str, float]],
    runs: dict[int, Path],
    largest: int,
    repeats: int,
) -> None:
    med = {k: {f: statistics.median(m[f] for m in v) for f in v[0]} for k, v in rows.items()}
    print(
        f"Runs: N ranks x {RUN['num_steps']} steps, {RUN['kernels_per_step']} kernels per step, "
        f"seed {RUN['seed']}.\n"
    )
    print(
        "| ranks | MB gzipped | engine | work s | CPU s (all processes) "
        "| client peak RSS MiB | after imports MiB | spilled MB |"
    )
    print("|--:|--:|---|--:|--:|--:|--:|--:|")
    for n, trace_dir in runs.items():
        size_mb = sum(p.stat().st_size for p in trace_dir.glob("*.json.gz")) / 1e6
        for engine in ENGINES:
            m = med[(n, engine)]
            print(
                f"| {n} | {size_mb:.0f} | {engine} | {m['work_s']:.2f} | {m['cpu_s']:.1f} "
                f"| {m['peak_mib']:.0f} | {m['imports_mib']:.0f} | {m['spilled_mb']:.0f} |"
            )
    print("\n| ranks | heap held after the analysis MiB | heap peak during it MiB |")
    print("|--:|--:|--:|")
    for n, h in heaps.items():
        print(f"| {n} | {h['held_mib']:.1f} | {h['peak_mib']:.1f} |")
    ratio = med[(largest, "cluster")]["work_s"] / med[(largest, "local")]["work_s"]
    cpu = med[(largest, "cluster")]["cpu_s"] / med[(largest, "local")]["cpu_s"]
    print(f"\n- {largest} ranks, cluster / local time: {ratio:.2f}x (median of {repeats} pairs)")
    print(f"- {largest} ranks, cluster / local CPU seconds: {cpu:.2f}x")
    for engine in ENGINES:
        held = [med[(n, engine)]["peak_mib"] - med[(n, engine)]["imports_mib"] for n in runs]
        curve = ", ".join(f"{n}: {h:.0f}" for n, h in zip(runs, held, strict=True))
        print(f"- {engine}: client peak minus imports, MiB by ranks: {curve}")
    same = {round(med[(n, e)]["bubble_ratio"], 12) for n in runs for e in ENGINES if n == largest}
    print(f"- same bubble ratio on both engines at {largest} ranks: {len(same) == 1}")


if __name__ == "__main__":
    sys.exit(main())
