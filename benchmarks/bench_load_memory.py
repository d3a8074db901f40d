"""Benchmark: peak memory of loading one trace file, against the size of its text.

    .venv/bin/python benchmarks/bench_load_memory.py            # traces of 128 MiB of text
    .venv/bin/python benchmarks/bench_load_memory.py --mib 32   # smaller and faster

Each case is one file, written to a temporary folder and loaded by
:func:`fsobs.trace.load_rank` in a fresh child process (this script with ``--worker``), with
the default limit of 16 GiB per trace unless the case says otherwise. The child reports its
resident memory after its imports and its peak (``VmHWM``) after loading; the table gives the
peak above the first, against the decompressed size of the file's text:

- ``trace``: a synthetic GPU trace (:func:`fsobs.simulate.write_gpu_run`), gzipped: the
  streaming reader, a few MB of text at a time;
- ``whole-file``: the same events after a 72 MiB key before ``traceEvents``, which the
  streaming reader does not look past, so the whole text is read at once (the fallback);
- ``whitespace``: a gzip of 4x the text's size of spaces and nothing else (refused: empty);
- ``padded``: those spaces, then the trace;
- ``over-limit``: the spaces again, then a second gzip member (so that the trailer tells
  little), with a limit of a quarter of them: refused in one line while decompressing.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MiB = 2**20
HEADER = 72 * MiB  # past the streaming reader's 64 MiB look-ahead for traceEvents


def worker(path: str, max_bytes: int) -> None:
    """Load ``path`` and print one JSON line: RSS after imports, peak RSS, the outcome."""
    from fsobs.errors import FsobsError
    from fsobs.trace import LoadConfig, load_rank

    base = _status_bytes("VmRSS")
    try:
        outcome = f"{len(load_rank(path, LoadConfig(max_trace_bytes=max_bytes)).events)} events"
    except FsobsError as exc:
        outcome = f"refused: {str(exc).split(': ', 1)[1]}"
    print(json.dumps({"base": base, "peak": _status_bytes("VmHWM"), "outcome": outcome}))


def _status_bytes(key: str) -> int:
    """A size from ``/proc/self/status`` (``VmHWM``: this process's peak RSS since it started;
    ``ru_maxrss`` would also count the parent's, which a child inherits across exec)."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(key + ":"))
    return int(line.split()[1]) * 1024


def synthetic_text(mib: int) -> bytes:
    """The JSON text of one synthetic rank of about ``mib`` MiB."""
    from fsobs.simulate import write_gpu_run

    with tempfile.TemporaryDirectory() as folder:
        (path,) = write_gpu_run(
            folder, num_ranks=1, num_steps=4, target_bytes_per_rank=mib * MiB, gzip=False
        )
        return path.read_bytes()


def write_cases(folder: Path, mib: int) -> list[tuple[str, Path, int, int]]:
    """(case, file, text bytes, limit) of every case."""
    text = synthetic_text(mib)
    spaces = b" " * (4 * len(text))
    assert text.startswith(b"{")
    whole = b'{"padding": "' + b"x" * HEADER + b'", ' + text[1:]
    limit = 16 * 2**30
    cases = [
        ("trace", text, limit),
        ("whole-file", whole, limit),
        ("whitespace", spaces, limit),
        ("padded", spaces + text, limit),
        ("over-limit", spaces, len(spaces) // 4),
    ]
    out = []
    for name, data, max_bytes in cases:
        path = folder / f"{name}.trace.json.gz"
        packed = gzip.compress(data, compresslevel=1)
        if name == "over-limit":  # a second member: the trailer tells only its size
            packed += gzip.compress(b"{}")
        path.write_bytes(packed)
        out.append((name, path, len(data), max_bytes))
    return out


def measure(path: Path, max_bytes: int) -> dict[str, object]:
    child = subprocess.run(
        [sys.executable, __file__, "--worker", str(path), str(max_bytes)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    result: dict[str, object] = json.loads(child.stdout.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=128, help="MiB of trace text (default 128)")
    parser.add_argument("--worker", nargs=2, metavar=("PATH", "MAX_BYTES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]))
        return
    print("| case | gzip MiB | text MiB | peak RSS above imports, MiB | peak / text | outcome |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for name, path, size, max_bytes in write_cases(Path(folder), args.mib):
            got = measure(path, max_bytes)
            above = (int(str(got["peak"])) - int(str(got["base"]))) / MiB
            print(
                f"| {name} | {path.stat().st_size / MiB:.1f} | {size / MiB:.0f} | {above:.0f} "
                f"| {above * MiB / size:.2f} | {got['outcome']} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
