"""Write a simulated run in the run format (docs/design.md §3): one small GPU Kineto trace per rank,
the step sidecars, ``run.json`` (``simulated: true``) and ``truth.json`` (no torch).

A rank's step is about 40 events: the ``ProfilerStep#N`` range, one launch per GPU activity
(the link that puts the activity in its step), the activities of
:mod:`fsobs.simulate.schedule` (NCCL kernels with the collective's args: name, group, ``Seq``,
sizes) and FreeScale's role range around each collective's launch (with ``priority_overlap``,
torchrec's PEC ranges too), one compact line each (:mod:`fsobs.simulate.kineto_writer`). The
sidecars record PEC's overlapped share of every step (``id_overlap``), toggle on or off, and
the pause fields of :mod:`fsobs.collect.pauses` (the simulated GC pauses; a rank is on its CPU
whenever it is not blocked in a collective, never preempted). Ranks are rendered in parallel
processes, each file gzipped and written atomically. With :class:`SimWindows` the traces are
written in the live layout instead, a window at a time.
"""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from platform import python_version
from typing import Any

import numpy as np

from fsobs.analysis.whatif.priority import PEC_TABLES
from fsobs.runformat.atomic import write_atomic
from fsobs.runformat.names import TRUTH, trace_file_name
from fsobs.runformat.runmeta import RunMeta, ToggleStatus, write_run_json
from fsobs.runformat.steps import StepRecord, write_sidecar
from fsobs.runformat.windows import WindowNote, window_dir, write_note, write_schedule
from fsobs.simulate.config import SIM_TOGGLES, SimWindows
from fsobs.simulate.kineto_writer import (
    COMPACT,
    compact_event,
    footer,
    header,
    host_name,
    process_group,
)
from fsobs.simulate.schedule import START_NS, TRUTH_CLASSES, Schedule
from optim.markers import DENSE_DESC, EMB_DESC, PEC_MASK_RANGE, PEC_RANGES, comm_marker
from optim.plan import BalanceConfig, batch_digest

BASE_NS = START_NS - 1_000_000_000
COMPUTE, PREFETCH, COMM, DENSE_COMM = 7, 21, 20, 24
_A2A = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
_AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
_PEC = {role: name for name, role in PEC_RANGES.items()}
PEC_OL = (_PEC["pec_overlapped"],)
PEC_MASK = (_PEC["pec_mask"], PEC_MASK_RANGE)
PEC_DEFERRED = (_PEC["pec_deferred_grad"],)
PEC_AHEAD = (_PEC["pec_ahead"],)
PEC_OL_GRAD = (_PEC["pec_overlapped_grad"],)
"""torchrec's PEC ranges around the launch of each of PEC's collectives, outermost first."""
_SHARED: dict[str, Any] = {}
"""The schedule, for the forked writer processes."""


class _Rank:
    """Renders one rank's events; owns its correlation ids and sequence numbers."""

    def __init__(self, sched: Schedule, rank: int) -> None:
        self.sched, self.rank = sched, rank
        self.pid, self.tid = 1000 + rank, 1000 + rank
        self.corr = 0
        self.seq: dict[str, int] = {}
        prio = "priority_overlap" in sched.toggles
        self.groups = {"embedding": "1" if prio else "0", "dense": "2" if prio else "0"}
        self.dense_stream = DENSE_COMM if prio else COMM

    def step(self, i: int) -> list[str]:
        s, r = self.sched, self.rank
        t = s.t
        t0, k1, k2 = int(t["t0"][i, r]), int(t["k1_end"][i, r]), int(t["k2_end"][i, r])
        last = i == s.cfg.steps - 1
        hi = int(t["k4_end"][i]) + 1000 if last else int(t["next_t0"][i, r]) - 1000
        lo = t0 - 1000
        self.lo, self.hi = lo, hi
        out = [self._range("user_annotation", f"ProfilerStep#{i}", lo, hi)]
        m = t0 + s.cfg.memcpy_ns
        out += self._gpu("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", COMPUTE, t0, m)
        lookup = m + int(s.gc[i, r])  # a GC pause holds the launch back
        out += self._gpu("kernel", "embedding_lookup_kernel", COMPUTE, lookup, k1)
        tokens = int(s.lengths[i][r].sum())
        pec = "priority_overlap" in s.toggles
        if pec:
            ef, em1, e1 = int(t["EF"][i]), int(t["EM1"][i]), int(t["E1"][i])
            out += self._coll("embedding", "all_to_allv", COMM, k1, ef, tokens, PEC_OL)
            out += self._coll("embedding", "all_to_allv", COMM, ef, em1, tokens, PEC_MASK)
            out += self._coll("embedding", "all_to_allv", COMM, em1, e1, tokens, PEC_MASK)
        else:
            out += self._coll("embedding", "all_to_allv", COMM, k1, int(t["E1"][i]), tokens)
        e0, eg = int(t["E0"][i]), int(t["EG"][i])
        out += self._coll("embedding", "all_to_allv", PREFETCH, int(t["A0"][i]), e0, tokens)
        if eg > e0:
            out += self._coll("embedding", "all_to_allv", PREFETCH, e0, eg, tokens, PEC_DEFERRED)
        for start, dur in zip(s.chunk_start[i].tolist(), s.chunk_dur[i].tolist(), strict=True):
            out += self._gpu("kernel", "fused_chunk_kernel", COMPUTE, start, start + dur)
        l_start, k2_start = int(t["L_start"][i]), int(t["k2_start"][i, r])
        if k2_start > l_start:
            out += self._gpu("kernel", "pec_nol_grad_apply_kernel", COMPUTE, l_start, k2_start)
        out += self._gpu("kernel", "hstu_fwd_bwd_kernel", COMPUTE, k2_start, k2)
        e2, e3, en = int(t["E2"][i]), int(t["E3"][i]), int(t["EN"][i])
        # with PEC, B is issued first at the same point: the all-reduce 1.5 µs after it
        dense = self._coll(
            "dense", "allreduce", self.dense_stream, k2, e2, 0, lead=1500 if pec else 3000
        )
        if pec:
            out += self._coll("embedding", "all_to_allv", COMM, k2, e3, tokens, PEC_OL_GRAD)
            out += dense
            if en > e3:
                out += self._coll("embedding", "all_to_allv", PREFETCH, e3, en, tokens, PEC_AHEAD)
        else:
            out += dense + self._coll("embedding", "all_to_allv", COMM, e2, e3, tokens)
        for start, dur in zip(s.upd_start[i].tolist(), s.upd_dur[i].tolist(), strict=True):
            out += self._gpu("kernel", "fused_chunk_kernel", COMPUTE, start, start + dur)
        out += self._gpu(
            "kernel", "optimizer_kernel", COMPUTE, int(t["k4_start"][i]), int(t["k4_end"][i])
        )
        return out

    def _range(self, cat: str, name: str, start: int, end: int) -> str:
        return compact_event(cat, name, self.pid, self.tid, start - BASE_NS, end - start)

    def _at(self, start: int, lead: int) -> int:
        """When the host launches an activity that starts at ``start`` (inside the step)."""
        return min(max(start - lead, self.lo + 500), self.hi - 1000)

    def _launch(self, start: int, cat: str, lead: int = 1000) -> str:
        """The runtime call that launches an activity at ``start``; takes a new correlation id."""
        at = self._at(start, lead)
        self.corr += 1
        name = "cudaMemcpyAsync" if cat == "gpu_memcpy" else "cudaLaunchKernel"
        args = f'"correlation":{self.corr}'
        return compact_event("cuda_runtime", name, self.pid, self.tid, at - BASE_NS, 500, args)

    def _gpu(
        self,
        cat: str,
        name: str,
        stream: int,
        start: int,
        end: int,
        extra: str = "",
        lead: int = 1000,
    ) -> list[str]:
        launch = self._launch(start, cat, lead)
        device = self.rank % self.sched.cfg.ranks_per_host
        args = f'"device":{device},"stream":{stream},"correlation":{self.corr}{extra}'
        event = compact_event(cat, name, device, stream, start - BASE_NS, end - start, args)
        return [launch, event]

    def _coll(
        self,
        role: str,
        coll: str,
        stream: int,
        start: int,
        end: int,
        tokens: int,
        pec: tuple[str, ...] = (),
        lead: int = 3000,
    ) -> list[str]:
        """A collective's kernel and launch, FreeScale's range around the launch and, for a
        PEC collective, torchrec's PEC ranges (``pec``, outermost first) around it too."""
        group = self.groups[role]
        self.seq[group] = self.seq.get(group, 0) + 1
        n = self.sched.cfg.world_size
        nelems = tokens * 64 if coll == "all_to_allv" else 1_048_576
        desc = {"0": "default_pg", "1": EMB_DESC, "2": DENSE_DESC}[group]
        args = (
            f',"Collective name":"{coll}","dtype":"Float","In msg nelems":{nelems},'
            f'"Out msg nelems":{nelems},"Group size":{n},"Process Group Name":"{group}",'
            f'"Process Group Description":"{desc}","Seq":{self.seq[group]}'
        )
        # issued ``lead`` (3 µs) ahead, so that the ranges around it hold no other launch
        at = self._at(start, lead)
        ranges = [self._range("user_annotation", comm_marker(role, group), at - 200, at + 700)]
        ranges += [
            self._range("user_annotation", name, at - 300 + 20 * k, at + 800 - 20 * k)
            for k, name in enumerate(pec)
        ]
        kernel = _A2A if coll == "all_to_allv" else _AR
        return [*ranges, *self._gpu("kernel", kernel, stream, start, end, args, lead=lead)]


def _header(sched: Schedule, rank: int) -> str:
    n = sched.cfg.world_size
    names = [("0", "default_pg")]
    if "priority_overlap" in sched.toggles:
        names += [("1", EMB_DESC), ("2", DENSE_DESC)]
    return header(
        COMPACT,
        rank=rank,
        world_size=n,
        groups=[process_group(name, desc, n) for name, desc in names],
        devices='[{"id":0,"name":"simulated GPU"}]',
        host=host_name(rank, sched.cfg.ranks_per_host),
    )


def render_rank(sched: Schedule, rank: int) -> bytes:
    """The whole trace file of one rank (uncompressed)."""
    return _trace(sched, rank, [e for step in _steps(sched, rank) for e in step])


def _steps(sched: Schedule, rank: int) -> list[list[str]]:
    """Each step's events of one rank, in step order."""
    writer = _Rank(sched, rank)
    return [writer.step(i) for i in range(sched.cfg.steps)]


def _trace(sched: Schedule, rank: int, events: list[str]) -> bytes:
    return (_header(sched, rank) + ",\n".join(events) + footer(COMPACT, BASE_NS)).encode()


def _write_ranks(ranks: list[int], out: str) -> int:
    sched: Schedule = _SHARED["schedule"]
    windows: SimWindows | None = _SHARED["windows"]
    size = 0
    for rank in ranks:
        if windows is None:
            raw = render_rank(sched, rank)
            size += len(raw)
            write_atomic(Path(out) / trace_file_name(rank), gzip.compress(raw, 1, mtime=0))
        else:
            size += _write_windows(sched, rank, out, windows)
        write_sidecar(out, rank, _sidecar(sched, rank))
    return size


def _write_windows(sched: Schedule, rank: int, out: str, windows: SimWindows) -> int:
    """Publish each window of one rank as a live job does: its trace, then its note."""
    steps = _steps(sched, rank)
    size = 0
    for first, last in windows.spans(sched.cfg.steps):
        if (first, rank) in windows.unpublished:
            continue
        raw = _trace(sched, rank, [e for step in steps[first : last + 1] for e in step])
        size += len(raw)
        folder = window_dir(out, first)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / trace_file_name(rank), gzip.compress(raw, 1, mtime=0))
        closed = int(sched.t["k4_end"][last])
        note = WindowNote(
            rank=rank, first_step=first, last_step=last, trigger="schedule", closed_ns=closed
        )
        write_note(out, note)
    return size


def _sidecar(sched: Schedule, rank: int) -> list[StepRecord]:
    records = []
    truth = sched.truth
    for i, parts in enumerate(sched.lengths):
        ids = np.arange(sum(len(p) for p in parts)) + i * 10**7  # the step's global batch
        start, end = int(sched.t["t0"][i, rank]), int(sched.t["k4_end"][i])
        blocked = int(truth["straggler_wait"][i, rank] + truth["exposed_comm"][i, rank])
        gc_ns = int(sched.gc[i, rank])
        record = StepRecord.of(
            i,
            parts[rank],
            float(sched.est_cost[i, rank]),
            start,
            end,
            imbalance_before=float(sched.imbalance_before[i]),
            imbalance_after=float(sched.imbalance_after[i]),
            batch_digest=batch_digest(ids),
            id_overlap=dict.fromkeys(PEC_TABLES, float(sched.overlap[i])),
            # never preempted: on the CPU whenever not blocked in a collective
            gc_count=int(gc_ns > 0),
            gc_max_gen=2 if gc_ns else -1,
            gc_ms=gc_ns / 1e6,
            cpu_ms=(end - start - blocked) / 1e6,
            nivcsw=0,
        )
        records.append(record)
    return records


def write_run(
    sched: Schedule,
    out: str | Path,
    workers: int | None = None,
    windows: SimWindows | None = None,
) -> int:
    """Write every rank's trace and sidecar, ``run.json`` and ``truth.json`` into ``out`` (with
    ``windows``, the traces in the live layout: :class:`SimWindows`); the uncompressed trace
    bytes written."""
    if windows is not None:
        windows.check(sched.cfg)
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    if windows is not None:
        write_schedule(root, windows.schedule)  # as rank 0 does when profiling starts
    n = sched.cfg.world_size
    workers = max(1, min(n, workers or os.cpu_count() or 1))
    chunks = [list(range(r, n, workers)) for r in range(workers)]
    _SHARED.update(schedule=sched, windows=windows)
    try:
        if workers == 1:
            size = _write_ranks(chunks[0], str(root))
        else:
            context = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
                size = sum(pool.map(_write_ranks, chunks, [str(root)] * len(chunks)))
    finally:
        _SHARED.clear()
    write_atomic(root / TRUTH, json.dumps(truth_json(sched, windows)).encode())
    write_run_json(root, run_meta(sched, root.name))
    return size


def truth_json(sched: Schedule, windows: SimWindows | None = None) -> dict[str, Any]:
    """``{"steps": [{rank, step, window_ms, busy_ms, straggler_wait_ms, ...}], "toggles",
    "config", "degradation", "windows"}`` (:meth:`SimConfig.degradation`; ``windows``: the
    live layout written, null without)."""
    truth = sched.truth
    steps, ranks = truth["window"].shape
    rows = []
    for i in range(steps):
        for r in range(ranks):
            row: dict[str, Any] = {"rank": r, "step": i}
            for key in ("window", *TRUTH_CLASSES, "contention"):
                row[f"{key}_ms"] = int(truth[key][i, r]) / 1e6
            rows.append(row)
    return {
        "steps": rows,
        "toggles": sorted(sched.toggles),
        "config": sched.cfg.describe(),
        "degradation": sched.cfg.degradation(),
        "windows": None if windows is None else windows.describe(),
    }


def run_meta(sched: Schedule, name: str) -> RunMeta:
    """``run.json`` of a simulated run (``simulated: true``; no torch ran it)."""
    n = sched.cfg.world_size
    hosts = sorted({host_name(r, sched.cfg.ranks_per_host) for r in range(n)})
    balance = sched.cfg.balance_config(enabled="balance" in sched.toggles)
    toggles = {
        t: ToggleStatus(
            requested=t in sched.toggles,
            applied=t in sched.toggles,
            reason="simulated policy" if t in sched.toggles else None,
        )
        for t in SIM_TOGGLES
    }
    return RunMeta(
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        name=name,
        world_size=n,
        backend="nccl",
        device="gpu",
        hosts=tuple(hosts),
        workload={
            "simulator": sched.cfg.describe(),
            # the paths of a real run's job config (fsobs.workload.config): steps and the
            # balance toggle, off as BalanceConfig's defaults
            "steps": sched.cfg.steps,
            "freescale": {"balance": asdict(balance if balance.enabled else BalanceConfig())},
        },
        toggles=toggles,
        simulated=True,
        versions={"python": python_version(), "torch": None, "torchrec": None},
        status="complete",
        reason=None,
        ranks_present=tuple(range(n)),
    )
