"""Every CLI output on every stored run and on simulated runs, written into one folder.

A refactor that must change no number is checked by running this before and after and
comparing the two folders::

    python benchmarks/outputs.py /tmp/before     # at the old commit
    python benchmarks/outputs.py /tmp/after      # at the new one
    diff -r /tmp/before /tmp/after               # empty: byte-identical

It runs ``fsobs analyze`` (text and ``--json``), ``fsobs export`` (decompressed),
``fsobs compare`` (text and ``--json``) and ``fsobs whatif --json`` on the committed runs and
reference traces, and ``fsobs simulate`` (every file decompressed, run.json's creation time
blanked) followed by the same analyses of what it wrote. What-if's planner timing is a wall
clock: here ``time.perf_counter`` advances by exactly 1 µs per call, so it is reproducible.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Every command runs in one scratch folder, where ``traces`` links to the repository's and
# the simulated runs are written, and names its runs by relative paths: the outputs of two
# checkouts (worktrees) compare equal.
SCRATCH = Path(tempfile.mkdtemp(prefix="fsobs-outputs-"))
REFERENCE = Path("traces") / "reference"
AB = Path("traces") / "ab_balance_2rank"

# `fsobs` in-process with a 1 µs-per-call perf_counter (what-if times the planner).
_PINNED = (
    "import itertools, sys, time; _c = itertools.count(); "
    "time.perf_counter = lambda: next(_c) * 1e-6; "
    "from fsobs.cli import main; sys.exit(main(sys.argv[1:]))"
)


def fsobs(out: Path, name: str, *args: str) -> None:
    """Run ``fsobs ARGS`` in the scratch folder and keep stdout, stderr and exit code."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", _PINNED, *args],
        capture_output=True,
        text=True,
        cwd=SCRATCH,
        env=env,
    )
    (out / f"{name}.stdout").write_text(proc.stdout)
    (out / f"{name}.stderr").write_text(proc.stderr)
    (out / f"{name}.rc").write_text(f"{proc.returncode}\n")


def decompressed(src: Path, dst: Path) -> None:
    """Copy every file under ``src`` to ``dst``, gunzipped; run.json without its time stamp."""
    for path in sorted(src.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(src)
        target = dst / str(rel).removesuffix(".gz")
        target.parent.mkdir(parents=True, exist_ok=True)
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        if path.name == "run.json":
            meta = json.loads(data)
            meta.pop("created", None)
            data = json.dumps(meta, indent=2, sort_keys=True).encode()
        target.write_bytes(data)


def analyses(out: Path, name: str, run: Path, *, whatif: bool) -> None:
    fsobs(out, f"{name}.analyze", "analyze", str(run))
    fsobs(out, f"{name}.analyze-json", "analyze", str(run), "--json")
    fsobs(out, f"{name}.export", "export", str(run), f"{name}.export")
    if (SCRATCH / f"{name}.export").exists():
        decompressed(SCRATCH / f"{name}.export", out / f"{name}.export")
    if whatif:
        fsobs(out, f"{name}.whatif-json", "whatif", str(run), "--json", "--draws", "50")


def reference_runs() -> list[Path]:
    """Each folder under traces/reference that holds trace files."""
    return sorted(d for d in REFERENCE.rglob("*") if d.is_dir() and any(d.glob("*.json*")))


def simulations(out: Path) -> None:
    for name, args in {
        "sim8": ["--world-size", "8", "--steps", "6", "--seed", "3"],
        "sim8-balance": [
            "--world-size",
            "8",
            "--steps",
            "6",
            "--seed",
            "3",
            "--toggles",
            "balance",
        ],
        "sim16-all": [
            "--world-size",
            "16",
            "--steps",
            "4",
            "--toggles",
            "balance,priority_overlap,sm_free",
        ],
        "sim4-calibrated": [
            "--world-size",
            "4",
            "--steps",
            "5",
            "--calibrate",
            str(AB / "control"),
        ],
    }.items():
        run = Path(name)
        fsobs(out, f"{name}.simulate", "simulate", *args, "--out", str(run), "--workers", "2")
        if (SCRATCH / run).exists():
            decompressed(SCRATCH / run, out / f"{name}.files")
            analyses(out, name, run, whatif=True)
    fsobs(out, "sim8.compare", "compare", "sim8", "sim8-balance")
    fsobs(
        out,
        "sim8.compare-json",
        "compare",
        "sim8",
        "sim8-balance",
        "--json",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to write (replaced)")
    out = parser.parse_args().out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (SCRATCH / "traces").symlink_to(ROOT / "traces")
    try:
        for side in ("control", "test"):
            analyses(out, f"ab.{side}", AB / side, whatif=side == "control")
        fsobs(out, "ab.compare", "compare", str(AB / "control"), str(AB / "test"))
        fsobs(out, "ab.compare-json", "compare", str(AB / "control"), str(AB / "test"), "--json")
        for run in reference_runs():
            name = "ref." + str(run.relative_to(REFERENCE)).replace("/", ".")
            analyses(out, name, run, whatif=False)
        diff = REFERENCE / "hta_recsys_a2a_trace_diff"
        fsobs(
            out,
            "ref.diff.compare-json",
            "compare",
            str(diff / "control"),
            str(diff / "test"),
            "--json",
        )
        simulations(out)
    finally:
        shutil.rmtree(SCRATCH, ignore_errors=True)
    print(f"{sum(1 for _ in out.rglob('*') if _.is_file())} files in {out}")


if __name__ == "__main__":
    main()
