"""The dashboard tests' run store and upload payloads (the fixtures are in ``conftest.py``).

Store layout built by :func:`build_store` (ids are paths relative to the store)::

    broken/rank0.json                 a malformed trace: the app must show the loader's error
    reference/gloo_straggler_4rank/   copy of traces/reference/synthetic_gloo_a2a_straggler_4rank
                                      (real CPU gloo run, 4 ranks, 4 steps, rank 2 straggles)
    sim/control/                      synthetic NCCL GPU run, 4 ranks, steps 10-13, with run.json
                                      (simulated, sm_free requested but not applied) and step
                                      sidecars listing per-sample lengths
    sim/test/                         the same global batches, balanced (other seed): sidecars
                                      with imbalance_before/after and equal batch digests

``write_big_run(root)`` adds ``big/sim64`` (:data:`BIG_RUN_ID`): a synthetic 64-rank NCCL run, 3
steps of 10 kernels (about 1 MB), for the rank filter and the aggregated per-rank charts; it is
not in the shared store (only the tests that need it pay for its analysis).

Helpers: ``build_store(root)``, ``listing(root)`` (to compare a store before / after),
``run_files``, ``small_run``, ``zip_bytes``, ``zeros_zip``, ``tar_gz_bytes``,
``tar_gz_declaring`` (upload payloads, hostile ones included); ``APP``: the absolute path of
``dashboard/streamlit_app.py`` for ``AppTest.from_file``.
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
import zipfile
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

from fsobs.runformat import RunMeta, ToggleStatus, write_run_json
from fsobs.simulate.synthetic_kineto import write_gpu_run
from tests.support.kineto import REFERENCE, cpu_doc, cpu_op

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "dashboard" / "streamlit_app.py")
GLOO_REFERENCE = REFERENCE / "synthetic_gloo_a2a_straggler_4rank"
NUM_RANKS, FIRST_STEP, NUM_STEPS, SAMPLES_PER_RANK = 4, 10, 4, 8
RUN_IDS = ("broken", "reference/gloo_straggler_4rank", "sim/control", "sim/test")
BIG_RUN_ID, BIG_RANKS = "big/sim64", 64
MiB = 2**20


def global_batches(seed: int = 7) -> dict[int, np.ndarray]:
    """Per step, the lengths of the global batch (heavy-tailed, the same for both sim runs)."""
    rng = np.random.default_rng(seed)
    total = NUM_RANKS * SAMPLES_PER_RANK
    return {
        FIRST_STEP + i: np.maximum(1, rng.lognormal(4.0, 1.0, total).astype(np.int64))
        for i in range(NUM_STEPS)
    }


def _write_sidecars(run_dir: Path, balanced: bool) -> None:
    from optim.balance import CostModel, imbalance, partition

    model = CostModel(c0=0.0, a=1.0, b=1.0)
    lines: dict[int, list[str]] = {r: [] for r in range(NUM_RANKS)}
    for step, lengths in global_batches().items():
        costs = model(lengths)
        contiguous = np.array_split(np.arange(len(lengths)), NUM_RANKS)
        parts = partition(costs, NUM_RANKS, method="kk") if balanced else contiguous
        for rank, part in enumerate(parts):
            record = {
                "step": step,
                "num_samples": len(part),
                "seq_lengths": [int(v) for v in lengths[list(part)]],
                "est_cost": float(costs[list(part)].sum()),
                "batch_digest": f"batch-{step}",
            }
            if balanced:
                record["imbalance_before"] = imbalance(costs, contiguous)
                record["imbalance_after"] = imbalance(costs, parts)
            lines[rank].append(json.dumps(record))
    for rank, rows in lines.items():
        (run_dir / f"steps.rank{rank}.jsonl").write_text("\n".join(rows) + "\n")


def _write_sim_run(run_dir: Path, *, seed: int, balanced: bool) -> None:
    write_gpu_run(
        run_dir, num_ranks=NUM_RANKS, num_steps=NUM_STEPS, kernels_per_step=20, seed=seed, workers=1
    )
    meta = RunMeta.now(
        name=run_dir.name,
        world_size=NUM_RANKS,
        backend="nccl",
        device="cuda",
        hosts=("sim-host",),
        workload={"seed": 7, "batch_size": NUM_RANKS * SAMPLES_PER_RANK},
        toggles={
            "balance": ToggleStatus(requested=balanced, applied=balanced),
            "sm_free": ToggleStatus(
                requested=True, applied=False, reason="no GPU: copy-engine transport unavailable"
            ),
        },
        ranks_present=tuple(range(NUM_RANKS)),
        status="complete",
        simulated=True,
    )
    write_run_json(run_dir, meta)
    _write_sidecars(run_dir, balanced)


def build_store(root: Path) -> Path:
    """Build the store described in the module docstring under ``root``; returns ``root``."""
    (root / "broken").mkdir(parents=True)
    (root / "broken" / "rank0.json").write_text('{"traceEvents": [', encoding="utf-8")
    shutil.copytree(
        GLOO_REFERENCE,
        root / "reference" / "gloo_straggler_4rank",
        ignore=shutil.ignore_patterns("*.py"),
    )
    _write_sim_run(root / "sim" / "control", seed=0, balanced=False)
    _write_sim_run(root / "sim" / "test", seed=1, balanced=True)
    return root


def write_big_run(root: Path) -> Path:
    """Write the 64-rank run :data:`BIG_RUN_ID` into the store ``root``; returns its folder."""
    folder = root / BIG_RUN_ID
    write_gpu_run(folder, num_ranks=BIG_RANKS, num_steps=3, kernels_per_step=10, seed=3, workers=1)
    return folder


def listing(root: Path) -> list[tuple[str, int]]:
    """Every path under ``root`` with its size (directories: -1), to compare before / after;
    the analysis cache (``.fsobs-cache``, written whenever the app analyzes a run) left out."""
    return sorted(
        (p.relative_to(root).as_posix(), p.stat().st_size if p.is_file() else -1)
        for p in root.rglob("*")
        if ".fsobs-cache" not in p.relative_to(root).parts
    )


# ---- upload payloads: good and hostile archives, in memory ----
def run_files(run_dir: Path) -> dict[str, bytes]:
    """Every regular file of a run directory: name -> bytes."""
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir()) if p.is_file()}


def small_run() -> dict[str, bytes]:
    """A 1-rank gloo run of one step (an ``aten::mm`` on the main thread) with its sidecar, a
    few hundred bytes: the cheapest upload that validates."""
    doc = cpu_doc(0, [cpu_op("aten::mm", 10, 50)], world_size=1)
    record = {"step": 1, "num_samples": 2, "seq_lengths": [3, 4], "est_cost": 25.0}
    return {
        "rank0.json": json.dumps(doc).encode(),
        "steps.rank0.jsonl": (json.dumps(record) + "\n").encode(),
    }


def zip_bytes(members: dict[str, bytes], *, symlinks: dict[str, str] | None = None) -> bytes:
    """A .zip of ``members`` (names may contain folders) plus symbolic links name -> target."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.create_system = 3  # unix, so the mode bits count
            info.external_attr = 0o120777 << 16
            archive.writestr(info, target)
    return buffer.getvalue()


def zeros_zip(name: str, size: int) -> bytes:
    """A .zip whose one member is ``size`` zero bytes (compresses ~1000:1)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open(name, "w", force_zip64=True) as member:
            for _ in range(size // MiB):
                member.write(bytes(MiB))
    return buffer.getvalue()


def tar_gz_bytes(
    members: dict[str, bytes],
    *,
    symlinks: dict[str, str] | None = None,
    hardlinks: dict[str, str] | None = None,
    devices: tuple[str, ...] = (),
) -> bytes:
    """A .tar.gz of ``members`` plus symbolic links, hard links and character devices."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for kind, links in ((tarfile.SYMTYPE, symlinks), (tarfile.LNKTYPE, hardlinks)):
            for name, target in (links or {}).items():
                info = tarfile.TarInfo(name)
                info.type, info.linkname = kind, target
                archive.addfile(info)
        for name in devices:
            info = tarfile.TarInfo(name)
            info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
            archive.addfile(info)
    return buffer.getvalue()


def tar_gz_declaring(name: str, size: int) -> bytes:
    """A tiny .tar.gz whose member header claims ``size`` bytes (a bomb, caught before reading)."""
    info = tarfile.TarInfo(name)
    info.size = size
    return gzip.compress(info.tobuf(format=tarfile.GNU_FORMAT) + bytes(1024))


def open_page(page: str = "runs", *, timeout: float = 60, **query: str) -> AppTest:
    """The app in AppTest on ``page`` (``app_pages/<page>.py``) with ``query`` in its URL, run
    once and without an exception."""
    at = AppTest.from_file(APP, default_timeout=timeout)
    for key, value in query.items():
        at.query_params[key] = value
    if page != "runs":
        at.switch_page(f"app_pages/{page}.py")
    at.run()
    assert not at.exception, at.exception
    return at
