"""The one way a page gets the analyses of the runs it shows (:func:`loaded_runs`).

A run small on disk (:data:`dashboard.cache.INLINE_BYTES`) or analyzed already is loaded in the
page's own script run, as it always was. A bigger one is analyzed in the background
(:mod:`dashboard.background`): the page shows what is known of the run without parsing it and a
progress bar, refreshed by a fragment that the browser reruns every :data:`REFRESH_S` (nothing
waits in a script thread: no session is held up), and reruns the whole page once every job it
waits for is done: the page then renders as usual.
"""

from __future__ import annotations

from collections.abc import Sequence

import streamlit as st

from dashboard import background, cache
from dashboard.background import Job
from dashboard.cache import Loaded
from dashboard.store import RunEntry, toggles_summary
from dashboard.text import code, esc
from fsobs.storage import Location

REFRESH_S = 0.5
"""Seconds between two looks at the jobs a page waits for."""


def loaded_runs(store: Location, entries: Sequence[RunEntry]) -> list[Loaded]:
    """The analyses of ``entries``, in order; while one of them is analyzed in the background
    the page shows the pending view and ends there (it reruns by itself when all are done)."""
    jobs = {e.run_id: (e, job) for e in entries if (job := cache.job_for(store, e)) is not None}
    waiting = [(e, job) for e, job in jobs.values() if not job.snapshot().finished]
    if waiting:
        show_pending(waiting)
        st.stop()
    return [cache.load(store, e) for e in entries]  # a finished job's result, taken


def show_pending(waiting: Sequence[tuple[RunEntry, Job]]) -> None:
    """What the page shows while its runs are analyzed: per run, what ``run.json`` and the
    file listing say, then the jobs' progress (:func:`_progress`)."""
    where = background.scheduler()
    place = f"on the Dask scheduler {code(where)}" if where else "on this machine's processes"
    st.info(
        f"Analyzing in the background, {place}: this page completes by itself when done; "
        "the other pages, and other sessions, can be used meanwhile."
    )
    for entry, _ in waiting:
        st.markdown(f"**{code(entry.run_id)}**: {esc(known_facts(entry))}")
    _progress(waiting)


def known_facts(entry: RunEntry) -> str:
    """The run as known without parsing it: ranks, steps, size on disk, toggles, simulated."""
    meta = entry.meta
    parts = [f"{len(entry.trace_files)} trace file(s), {entry.trace_bytes / 1e6:,.1f} MB on disk"]
    if meta is not None and meta.world_size is not None:
        parts.append(f"world size {meta.world_size}")
    steps = meta.workload.get("steps") if meta is not None else None
    if isinstance(steps, int):
        parts.append(f"{steps} step(s)")
    parts.append(f"toggles: {toggles_summary(meta)}")
    if meta is not None and meta.simulated:
        parts.append("simulated")
    return " · ".join(parts)


@st.fragment(run_every=REFRESH_S)
def _progress(waiting: Sequence[tuple[RunEntry, Job]]) -> None:
    """A progress bar per job (``parsing rank traces: 17 of 64``); the whole page reruns when
    every job has finished."""
    snapshots = [(entry, job.snapshot()) for entry, job in waiting]
    if all(snap.finished for _, snap in snapshots):
        st.rerun()
    for entry, snap in snapshots:
        prefix = f"{esc(entry.run_id)}: " if len(snapshots) > 1 else ""
        st.progress(snap.fraction, text=f"{prefix}{snap.text}")
