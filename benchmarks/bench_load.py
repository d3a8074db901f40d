"""Benchmark: load traces + temporal breakdown, fsobs against HTA 0.5.0, on the same files.

    .venv/bin/python benchmarks/bench_load.py            # reference traces + 8 ranks x ~100 MB
    .venv/bin/python benchmarks/bench_load.py --quick    # reference traces only, 1 repeat

Each measurement runs one tool in a fresh child process (this script with ``--worker``):

- fsobs: ``fsobs.analysis.analyze_path(dir)`` (what ``fsobs analyze`` runs: the streaming
  loader, the whole bubble analysis and the HTA metrics), then its ``hta.temporal_breakdown``
- HTA:   ``TraceAnalysis(trace_dir=dir)`` then ``get_temporal_breakdown(visualize=False)``

The child times the work after its imports (``work``) and its start-up: from the moment the
parent spawned it until the tool first opens a trace file of the set (an audit hook on the
``open`` event, installed before the tool is imported, prints the moment; fsobs: ``fsobs
analyze``'s arguments parsed, then ``analyze_path``; HTA: ``TraceAnalysis``). The parent
times the whole child from spawn to exit (``end-to-end``: interpreter start, imports, work,
exit), the two tools side by side in one run, and samples, every ~20 ms,
the summed RSS of the child and all its descendants (both tools parse ranks in forked worker
pools), keeping the peak; every ~0.2 s it also sums their PSS, which counts the pages a forked
worker shares with its parent once instead of twice. Every measurement is repeated and the
median reported. The two tools' temporal-breakdown numbers are compared too: they must be
identical. The machine may be shared: before each measurement the script waits until other
processes leave the CPUs idle, and it repeats (up to 3 times) a measurement during which they
used more than ``--max-foreign`` cores, keeping the least disturbed one; the tables show how
much they used.

The parse alone is timed in one more child per repeat (``--worker parse``): each trace file of
the set loaded in that process (:func:`fsobs.load_rank`, one core), its CPU time against the
JSON it read, in MB of JSON per second per core.

The synthetic set (8 ranks x ~100 MB of JSON, gzipped) is written once with
:func:`fsobs.simulate.write_gpu_run` to ``bench_data/`` (git-ignored) and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "traces" / "reference"
REFERENCE_SETS = (
    "hta_ddp_allreduce_rank1",
    "hta_recsys_a2a_trace_diff/control",
    "hta_recsys_a2a_rs_16rank_rank0",
)
SYNTHETIC = {"num_ranks": 8, "num_steps": 5, "target_bytes_per_rank": 100_000_000, "seed": 0}
TOOLS = ("fsobs", "hta")
SAMPLE_S = 0.02  # RSS sampling period
PSS_EVERY = 10  # PSS on every 10th sample (0.2 s)
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
GOAL_SPEEDUP = 5.0
GOAL_MEMORY = 1 / 3
GOAL_STARTUP_S = 0.3
"""``fsobs analyze`` starts reading within this long of its spawn."""
GOAL_PARSE_MB_S = 150.0
"""MB of JSON parsed per second on one core."""
GOAL_END_TO_END = 8.0


# ----------------------------------------------------------------------------- child side


def worker(tool: str, trace_dir: str) -> None:
    """Run one tool on ``trace_dir`` and print one JSON line with timings and the breakdown
    (``parse``: the parse alone), after the :data:`FIRST_OPEN` line."""
    if tool == "parse":
        parse_worker(trace_dir)
        return
    _report_first_open(trace_dir)
    t0 = time.perf_counter()
    if tool == "fsobs":
        import fsobs
        from fsobs.cli import build_parser

        build_parser("analyze").parse_args(["analyze", trace_dir])  # as `fsobs analyze` starts
        analyze_path = fsobs.analyze_path  # what it imports before it reads
        t1 = time.perf_counter()
        rss_after_import = _rss(os.getpid())
        breakdown = analyze_path(trace_dir).hta.temporal_breakdown
    else:
        import logging
        import warnings

        from hta.trace_analysis import TraceAnalysis

        t1 = time.perf_counter()
        logging.disable(logging.WARNING)  # HTA logs a warning per file and per step
        warnings.simplefilter("ignore")
        rss_after_import = _rss(os.getpid())
        analysis = TraceAnalysis(trace_dir=trace_dir)
        breakdown = analysis.get_temporal_breakdown(visualize=False)
        breakdown = breakdown.rename(columns=lambda c: c.replace("(us)", "_us"))
    t2 = time.perf_counter()
    rows = breakdown.sort_values("rank").to_dict(orient="records")
    result = {
        "import_s": t1 - t0,
        "work_s": t2 - t1,
        "rss_after_import": rss_after_import,
    }
    print(json.dumps(result | {"breakdown": rows}, default=float), flush=True)


FIRST_OPEN = "first trace open at "
"""The line the child prints (``time.time()`` after it) when the tool first opens a trace."""


def _report_first_open(trace_dir: str) -> None:
    """Print :data:`FIRST_OPEN` the first time this process (or a worker forked from it before
    then) opens a ``*.json`` / ``*.json.gz`` file under ``trace_dir``: the end of start-up."""
    root = os.path.realpath(trace_dir) + os.sep
    opened = False

    def hook(event: str, args: tuple) -> None:
        nonlocal opened
        if event != "open" or opened or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        path = os.fsdecode(args[0])
        if path.endswith((".json", ".json.gz")) and os.path.realpath(path).startswith(root):
            opened = True
            print(f"{FIRST_OPEN}{time.time()!r}", flush=True)

    sys.addaudithook(hook)


def parse_worker(trace_dir: str) -> None:
    """Parse each trace file of ``trace_dir`` here, one after the other; print the CPU seconds."""
    from fsobs import load_rank

    files = _trace_files(Path(trace_dir))
    load_rank(files[0])  # the first parse pays for lazy imports and the regexes
    start = time.process_time()
    for path in files:
        load_rank(path)
    print(json.dumps({"parse_cpu_s": time.process_time() - start}), flush=True)


# ---------------------------------------------------------------------------- parent side


@dataclass
class Measurement:
    work_s: float
    import_s: float
    startup_s: float
    """From the spawn until the tool first opened a trace file."""
    end_to_end_s: float
    peak_rss: int
    peak_pss: int
    rss_after_import: int
    breakdown: list[dict]
    foreign_cpu: float
    """CPU used meanwhile by processes outside this benchmark, in cores (2 = machine full)."""
    calibration_ms: float = float("nan")
    """A fixed Python loop timed just before: larger means a slower machine at that moment."""


@dataclass
class Result:
    name: str
    ranks: int
    gz_bytes: int
    json_bytes: int
    runs: dict[str, list[Measurement]] = field(default_factory=dict)
    parse_cpu_s: list[float] = field(default_factory=list)
    """CPU seconds of fsobs's parse of all the set's files, one entry per repeat."""

    def median(self, tool: str, attr: str) -> float:
        return statistics.median(getattr(m, attr) for m in self.runs[tool])

    def parse_mb_s(self) -> float:
        """MB of JSON fsobs parses per second on one core (median over the repeats)."""
        return self.json_bytes / 1e6 / statistics.median(self.parse_cpu_s)


def _tree_pids(pid: int) -> list[int]:
    """``pid`` and all its descendants, from ``/proc/<pid>/task/<tid>/children`` (Linux)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children") as fh:
                    todo.extend(int(child) for child in fh.read().split())
            except OSError:
                pass
    return found


def _rss(pid: int) -> int:
    """Resident set size of one process in bytes (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return 0


def _pss(pid: int) -> int:
    """Proportional set size of one process in bytes (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _tree_memory(pid: int, with_pss: bool) -> tuple[int, int]:
    """(RSS, PSS) in bytes summed over a process tree (PSS 0 unless ``with_pss``).

    RSS counts the pages a forked worker shares with its parent once per process; PSS splits
    them between the sharers, so its sum is the tree's real footprint. PSS costs a page-table
    walk (about 10 ms for a GB of small Python objects), so it is sampled less often.
    """
    pids = _tree_pids(pid)
    rss = sum(_rss(p) for p in pids)
    return rss, sum(_pss(p) for p in pids) if with_pss else 0


def _busy_cpu_s() -> float:
    """CPU seconds all processes of the machine have used since boot (``/proc/stat``)."""
    with open("/proc/stat") as fh:
        fields = [int(v) for v in fh.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def _own_cpu_s() -> float:
    """CPU seconds of this process plus its waited-for descendants."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def measure(tool: str, trace_dir: Path) -> Measurement:
    """Run ``tool`` on ``trace_dir`` in a fresh process, sampling the process tree's RSS."""
    env = os.environ | {"PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    busy0, own0 = _busy_cpu_s(), _own_cpu_s()
    start = time.perf_counter()
    cmd = [sys.executable, __file__, "--worker", tool, str(trace_dir)]
    spawned_at = time.time()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    peak_rss = peak_pss = samples = 0
    while child.poll() is None:
        rss, pss = _tree_memory(child.pid, with_pss=samples % PSS_EVERY == 0)
        peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
        samples += 1
        time.sleep(SAMPLE_S)
    end_to_end = time.perf_counter() - start
    out, err = child.communicate()
    foreign = max(0.0, (_busy_cpu_s() - busy0) - (_own_cpu_s() - own0))
    if child.returncode != 0:
        raise RuntimeError(f"{tool} on {trace_dir} failed:\n{err.decode()[-3000:]}")
    lines = out.decode().strip().splitlines()
    data = json.loads(lines[-1])
    first_open = next(float(x.removeprefix(FIRST_OPEN)) for x in lines if x.startswith(FIRST_OPEN))
    return Measurement(
        work_s=data["work_s"],
        import_s=data["import_s"],
        startup_s=first_open - spawned_at,
        end_to_end_s=end_to_end,
        peak_rss=peak_rss,
        peak_pss=peak_pss,
        rss_after_import=data["rss_after_import"],
        breakdown=data["breakdown"],
        foreign_cpu=foreign / end_to_end,
    )


def measure_parse(trace_dir: Path) -> float:
    """CPU seconds of fsobs's parse of ``trace_dir``'s files, in a fresh process."""
    env = os.environ | {"PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, __file__, "--worker", "parse", str(trace_dir)]
    out = subprocess.run(cmd, capture_output=True, env=env, check=True).stdout
    return float(json.loads(out.decode().strip().splitlines()[-1])["parse_cpu_s"])


def _trace_files(trace_dir: Path) -> list[Path]:
    return sorted(p for p in trace_dir.iterdir() if p.name.endswith((".json", ".json.gz")))


def _sizes(trace_dir: Path) -> tuple[int, int, int]:
    """(number of files, bytes on disk, bytes of JSON); also warms the page cache."""
    import gzip

    files = _trace_files(trace_dir)
    on_disk = sum(p.stat().st_size for p in files)
    plain = 0
    for path in files:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as fh:
            while chunk := fh.read(1 << 24):
                plain += len(chunk)
    return len(files), on_disk, plain


def ensure_synthetic(data_dir: Path, num_ranks: int = 8, mb_per_rank: int = 100) -> Path:
    """A synthetic run at :data:`SYNTHETIC`'s density (steps, seed) of ``num_ranks`` x
    ``mb_per_rank`` MB (default: the 8 x ~100 MB run), generated on first use (marker file
    outside the run dir)."""
    params = SYNTHETIC | {"num_ranks": num_ranks, "target_bytes_per_rank": mb_per_rank * 10**6}
    name = f"synthetic_{num_ranks}x{mb_per_rank}MB"
    run_dir = data_dir / name
    marker = data_dir / f"{name}.params.txt"
    if marker.exists() and marker.read_text() == json.dumps(params):
        return run_dir
    from fsobs.simulate import write_gpu_run

    print(f"generating {run_dir} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    write_gpu_run(run_dir, **params)
    print(f"  done in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    marker.write_text(json.dumps(params))
    return run_dir


def _foreign_cpu_now(seconds: float = 2.0) -> float:
    """Cores used by processes outside this benchmark over the next ``seconds``."""
    busy0, own0 = _busy_cpu_s(), _own_cpu_s()
    time.sleep(seconds)
    return max(0.0, (_busy_cpu_s() - busy0) - (_own_cpu_s() - own0)) / seconds


def _calibration_ms() -> float:
    """Time of a fixed pure-Python loop: shows when the (virtual) machine itself is slow."""
    start = time.perf_counter()
    total = 0
    for i in range(2_000_000):
        total += i & 7
    return (time.perf_counter() - start) * 1000


def _wait_until_quiet(max_foreign: float, max_wait_s: float = 300.0) -> None:
    """Wait (up to ``max_wait_s``) until other processes leave the CPUs to us."""
    deadline = time.monotonic() + max_wait_s
    while time.monotonic() < deadline:
        if _foreign_cpu_now() <= max_foreign:
            return
    print("  (machine still busy; measuring anyway)", file=sys.stderr, flush=True)


def measure_quietly(
    tool: str, trace_dir: Path, max_foreign: float, attempts: int = 3
) -> Measurement:
    """``measure``, retried when other processes took more than ``max_foreign`` cores meanwhile.

    The benchmark machine is shared (2 cores); a run disturbed by a test suite or an install
    says nothing about either tool. Keeps the least disturbed attempt.
    """
    best: Measurement | None = None
    for _ in range(attempts):
        _wait_until_quiet(max_foreign)
        calibration = _calibration_ms()
        m = measure(tool, trace_dir)
        m.calibration_ms = calibration
        if best is None or m.foreign_cpu < best.foreign_cpu:
            best = m
        if m.foreign_cpu <= max_foreign:
            break
        print(f"  (disturbed: {m.foreign_cpu:.2f} cores used by others; again)", file=sys.stderr)
    assert best is not None
    return best


def bench(name: str, trace_dir: Path, repeats: int, max_foreign: float) -> Result:
    ranks, gz_bytes, json_bytes = _sizes(trace_dir)
    result = Result(name, ranks, gz_bytes, json_bytes, {t: [] for t in TOOLS})
    for rep in range(repeats):
        for tool in TOOLS:  # interleaved, so drift hits both tools alike
            m = measure_quietly(tool, trace_dir, max_foreign)
            result.runs[tool].append(m)
            print(
                f"  {name} [{rep + 1}/{repeats}] {tool}: work {m.work_s:.2f} s, "
                f"end-to-end {m.end_to_end_s:.2f} s, peak RSS {m.peak_rss / 2**20:.0f} MiB, "
                f"PSS {m.peak_pss / 2**20:.0f} MiB, other processes {m.foreign_cpu:.2f} cores, "
                f"calibration {m.calibration_ms:.0f} ms",
                file=sys.stderr,
                flush=True,
            )
        _wait_until_quiet(max_foreign)
        result.parse_cpu_s.append(measure_parse(trace_dir))
        print(
            f"  {name} [{rep + 1}/{repeats}] fsobs parse: {result.parse_cpu_s[-1]:.2f} CPU s",
            file=sys.stderr,
            flush=True,
        )
    return result


def _same_numbers(result: Result) -> bool:
    ours, theirs = result.runs["fsobs"][0].breakdown, result.runs["hta"][0].breakdown
    return len(ours) == len(theirs) and all(
        {k: a[k] for k in b} == b for a, b in zip(ours, theirs, strict=True)
    )


def time_table(results: list[Result]) -> str:
    """Wall time, medians: the work after imports, and the whole child process end to end."""
    head = (
        "| trace set | ranks | gz / JSON MB | fsobs s | HTA s | HTA/fsobs "
        "| fsobs s end-to-end | HTA s end-to-end | HTA/fsobs | same numbers |\n"
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|:-:|\n"
    )
    lines = []
    for r in results:
        work = [r.median(t, "work_s") for t in TOOLS]
        e2e = [r.median(t, "end_to_end_s") for t in TOOLS]
        lines.append(
            f"| {r.name} | {r.ranks} | {r.gz_bytes / 1e6:.1f} / {r.json_bytes / 1e6:.1f} "
            f"| {work[0]:.2f} | {work[1]:.2f} | {work[1] / work[0]:.1f}x "
            f"| {e2e[0]:.2f} | {e2e[1]:.2f} | {e2e[1] / e2e[0]:.1f}x "
            f"| {'yes' if _same_numbers(r) else 'NO'} |"
        )
    return head + "\n".join(lines)


def memory_table(results: list[Result]) -> str:
    """Peak memory of the whole process tree, medians: summed RSS and summed PSS."""
    head = (
        "| trace set | fsobs peak RSS MiB | HTA peak RSS MiB | fsobs/HTA "
        "| fsobs peak PSS MiB | HTA peak PSS MiB | fsobs/HTA |\n"
        "|---|--:|--:|--:|--:|--:|--:|\n"
    )
    lines = []
    for r in results:
        rss = [r.median(t, "peak_rss") / 2**20 for t in TOOLS]
        pss = [r.median(t, "peak_pss") / 2**20 for t in TOOLS]
        lines.append(
            f"| {r.name} | {rss[0]:.0f} | {rss[1]:.0f} | {rss[0] / rss[1]:.2f} "
            f"| {pss[0]:.0f} | {pss[1]:.0f} | {pss[0] / pss[1]:.2f} |"
        )
    return head + "\n".join(lines)


def details(results: list[Result]) -> str:
    """Import time and RSS right after import (medians), to read the table with."""
    head = "| trace set | tool | import s | RSS after import MiB | work s (all runs) "
    head += "| other processes' CPU, cores (all runs) | calibration loop ms (all runs) |\n"
    head += "|---|---|--:|--:|---|---|---|\n"
    lines = []
    for r in results:
        for tool in TOOLS:
            runs = ", ".join(f"{m.work_s:.2f}" for m in r.runs[tool])
            foreign = ", ".join(f"{m.foreign_cpu:.2f}" for m in r.runs[tool])
            calibration = ", ".join(f"{m.calibration_ms:.0f}" for m in r.runs[tool])
            lines.append(
                f"| {r.name} | {tool} | {r.median(tool, 'import_s'):.2f} "
                f"| {r.median(tool, 'rss_after_import') / 2**20:.0f} | {runs} | {foreign} "
                f"| {calibration} |"
            )
    return head + "\n".join(lines)


def feel_table(results: list[Result]) -> str:
    """What a user feels, medians: start-up (spawn to the first open of a trace), the parse rate,
    and the end-to-end ratio of the two tools measured side by side."""
    head = (
        "| trace set | JSON MB | fsobs start-up s | HTA start-up s | fsobs parse MB/s per core "
        "| HTA/fsobs end-to-end |\n"
        "|---|--:|--:|--:|--:|--:|\n"
    )
    lines = []
    for r in results:
        startup = [r.median(t, "startup_s") for t in TOOLS]
        e2e = r.median("hta", "end_to_end_s") / r.median("fsobs", "end_to_end_s")
        lines.append(
            f"| {r.name} | {r.json_bytes / 1e6:.1f} | {startup[0]:.2f} | {startup[1]:.2f} "
            f"| {r.parse_mb_s():.0f} | {e2e:.1f}x |"
        )
    return head + "\n".join(lines)


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def goals(results: list[Result]) -> str:
    lines = []
    for r in results:
        startup = r.median("fsobs", "startup_s")
        e2e = r.median("hta", "end_to_end_s") / r.median("fsobs", "end_to_end_s")
        lines.append(
            f"- {r.name}: start-up {startup:.2f} s (goal <= {GOAL_STARTUP_S} s: "
            f"{_met(startup <= GOAL_STARTUP_S)}); parse {r.parse_mb_s():.0f} MB/s per core "
            f"(goal >= {GOAL_PARSE_MB_S:.0f}: {_met(r.parse_mb_s() >= GOAL_PARSE_MB_S)}); "
            f"end-to-end {e2e:.1f}x (goal >= {GOAL_END_TO_END:.0f}x: "
            f"{_met(e2e >= GOAL_END_TO_END)})"
        )
    for r in results:
        speed = r.median("hta", "work_s") / r.median("fsobs", "work_s")
        memory = r.median("fsobs", "peak_rss") / r.median("hta", "peak_rss")
        memory_pss = r.median("fsobs", "peak_pss") / r.median("hta", "peak_pss")
        ok_speed = "met" if speed >= GOAL_SPEEDUP else "MISSED"
        ok_mem = "met" if memory <= GOAL_MEMORY else "MISSED"
        lines.append(
            f"- {r.name}: speed {speed:.1f}x (goal >= {GOAL_SPEEDUP:.0f}x: {ok_speed}); "
            f"peak RSS {memory:.2f} of HTA (goal <= 1/3: {ok_mem}; PSS {memory_pss:.2f})"
        )
    return "\n".join(lines)


def _fmt_load(load: tuple[float, float, float]) -> str:
    return ", ".join(f"{v:.2f}" for v in load)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fsobs vs HTA: trace loading benchmark")
    parser.add_argument("--quick", action="store_true", help="reference traces only, 1 repeat")
    parser.add_argument("--repeats", type=int, default=None, help="default 3 (1 with --quick)")
    parser.add_argument("--data", type=Path, default=ROOT / "bench_data")
    parser.add_argument(
        "--max-foreign",
        type=float,
        default=0.2,
        help="retry a measurement when other processes used more cores than this (default 0.2)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write raw results here")
    parser.add_argument("--worker", nargs=2, metavar=("TOOL", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return 0
    repeats = args.repeats or (1 if args.quick else 3)
    sets = [(name, REFERENCE / name) for name in REFERENCE_SETS]
    if not args.quick:
        sets.append(("synthetic 8 x 100 MB", ensure_synthetic(args.data)))
    load_before = os.getloadavg()
    results = [bench(name, path, repeats, args.max_foreign) for name, path in sets]
    load_after = os.getloadavg()
    print(
        f"\nMedian of {repeats} run(s) per cell. Load average (1, 5, 15 min) before: "
        f"{_fmt_load(load_before)}; after: {_fmt_load(load_after)}.\n"
    )
    print(time_table(results))
    print()
    print(feel_table(results))
    print()
    print(memory_table(results))
    print()
    print(details(results))
    print()
    print(goals(results))
    if args.json:
        raw = [
            {
                "name": r.name,
                "runs": {t: [vars(m) for m in ms] for t, ms in r.runs.items()},
                "parse_cpu_s": r.parse_cpu_s,
            }
            for r in results
        ]
        args.json.write_text(json.dumps(raw, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
