"""Cached access to the store's analyses: every run is parsed once per content signature.

``st.cache_resource`` keeps the :class:`fsobs.Analysis` objects themselves (no copy per page
switch, so pages must treat them as read-only), keyed on the store, the run id and the
(name, mtime, size) signature of the run's files: editing or replacing a file re-parses the run,
switching pages does not. Below it, :mod:`dashboard.disk_cache` keeps every analysis in the
store, so a run parsed once (or validated as an upload) opens fast after a server restart too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboard import background, disk_cache
from dashboard.background import Job, Key, Progress, Result
from dashboard.figures import title_in_template
from dashboard.ops import bar_names, lane_places
from dashboard.store import (
    RunEntry,
    Signature,
    folder_signature,
    list_runs,
)
from dashboard.tables import has_data, run_facts, timeline_frame
from dashboard.tracediff import OpDiff, op_diff
from fsobs import Analysis, FsobsError, analyze_path
from fsobs.analysis import Comparison, CostFit, SplitBounds, compare, fit_cost, run_bounds
from fsobs.report import findings
from fsobs.runformat import read_step_lengths
from fsobs.storage import Location, as_location

Pair = tuple[Analysis, Analysis]

logger = logging.getLogger(__name__)

BY_REPR: dict[str | type[Any], Callable[[Any], Any]] = {tuple: repr}
"""``hash_funcs`` of the helpers below: a tuple argument (a run's :data:`Signature`: three
values per file) is keyed by its repr, which Python writes in C. Streamlit's own hashing walks
it value by value: at 256 ranks (513 files) that took about as long as a Bubbles tab's own
work, for every cached call on every rerun."""

AUTO_ANALYZE_BYTES = 64 * 10**6
"""The runs table analyzes runs up to this size on disk by itself; bigger ones when opened."""
INLINE_BYTES = 4 * 2**20
"""A page opening a run up to this size of traces analyzes it in its own script run; a bigger
one is analyzed in the background (:mod:`dashboard.background`) while the page shows progress."""


@dataclass(frozen=True)
class Loaded:
    """A run and its analysis, or the one-line reason it could not be analyzed."""

    entry: RunEntry
    analysis: Analysis | None
    error: str | None


def runs(store: Location) -> list[RunEntry]:
    """The store's runs (a directory scan: cheap, done on every rerun so uploads show up)."""
    return list_runs(store)


UNFINISHED = "a live run, not finished: its windows are on the Live page"
"""Why an unfinished live run is not analyzed as a run (:attr:`RunEntry.unfinished`)."""


def load(store: Location, entry: RunEntry) -> Loaded:
    """The analysis of one run (parsed at most once per signature; an unfinished live run is
    not parsed: :data:`UNFINISHED`). A run a background job analyzes (:func:`job_for`) is not
    parsed again: the job's result is taken, waited for if the job still runs (pages that
    must not wait go through :func:`dashboard.pending.loaded_runs`)."""
    if entry.unfinished:
        return Loaded(entry, None, UNFINISHED)
    key = _key(store, entry)
    job = background.registry().find(key)
    if job is None:
        analysis, error = _analyze(*key)
    else:
        with st.spinner("Waiting for the run's analysis in the background..."):
            analysis, error = _analyze(*key, _ready=job.wait())
        background.registry().forget(key)
    return Loaded(entry, analysis, error)


def is_running(store: Location, entry: RunEntry) -> bool:
    """Whether a background job is analyzing this run now (queued or running)."""
    job = background.registry().find(_key(store, entry))
    return job is not None and not job.snapshot().finished


def is_analyzed(store: Location, entry: RunEntry) -> bool:
    """Whether this version of the run was analyzed already (by any session, or by an earlier
    server: its analysis is in the disk cache, which a read-only URL store has not)."""
    if _key(store, entry) in _done():
        return True
    return isinstance(store, Path) and disk_cache.is_fresh(store, entry.run_id, entry.signature)


def remember_upload(store: Path, run_id: str, analysis: Analysis) -> None:
    """Keep the analysis an upload was validated with, so its first opening does not parse."""
    folder = store / run_id
    disk_cache.write(store, run_id, folder_signature(folder), disk_cache.relocate(analysis, folder))


def facts(
    store: Location, entry: RunEntry, state: tuple[str | None, str | None], *, analyze: bool
) -> dict[str, Any]:
    """The runs-table row (``state``: :func:`dashboard.store.run_state`); the analysis is run
    only if ``analyze`` or it was already done, never for an unfinished live run nor while a
    background job analyzes it (the row says how far the job is)."""
    if entry.unfinished:
        return run_facts(entry, None, f"{state[0] or 'live'}: open it on the Live page", state)
    job = background.registry().find(_key(store, entry))
    if job is not None and not job.snapshot().finished:
        return run_facts(entry, None, f"being analyzed: {job.snapshot().text}", state)
    if analyze or is_analyzed(store, entry):
        loaded = load(store, entry)
        return run_facts(entry, loaded.analysis, loaded.error, state)
    return run_facts(entry, None, "not analyzed yet (large): open it on the Bubbles page", state)


def is_cheap(store: Location, entry: RunEntry) -> bool:
    """Small enough to analyze unasked (:data:`AUTO_ANALYZE_BYTES`), or analyzed already; an
    unfinished live run never is (it is not parsed as a finished run), nor a run a background
    job analyzes now (choosing a default never waits for it)."""
    if entry.unfinished or is_running(store, entry):
        return False
    return entry.trace_bytes <= AUTO_ANALYZE_BYTES or is_analyzed(store, entry)


def first_with_data(
    store: Location,
    entries: Sequence[RunEntry],
    *,
    skip: str | None = None,
    want: Callable[[Analysis | None], bool] = has_data,
) -> str:
    """The id of the first run (other than ``skip``) whose analysis satisfies ``want`` (by
    default: analyzes with at least one step); else the first run with data, else the first.
    Only cheap runs (:func:`is_cheap`) are looked at: choosing a default never parses a big run."""
    cheap = [e for e in entries if e.run_id != skip and is_cheap(store, e)]
    for check in (want, has_data):
        for entry in cheap:
            if check(load(store, entry).analysis):
                return entry.run_id
    return next((e.run_id for e in entries if e.run_id != skip), entries[0].run_id)


def job_for(store: Location, entry: RunEntry) -> Job | None:
    """The background job of this run: the one a session started already (running, or finished
    and not yet taken), else a new one if the run is bigger than :data:`INLINE_BYTES` and not
    analyzed yet; None: load it inline (:func:`load`)."""
    key = _key(store, entry)
    jobs = background.registry()
    job = jobs.find(key)
    big = not entry.unfinished and entry.trace_bytes > INLINE_BYTES
    if job is None and big and not is_analyzed(store, entry):
        job = jobs.submit(key, partial(analysis_of, *key))
    return job


def analysis_of(
    store: str, run_id: str, signature: Signature, progress: Progress | None = None
) -> Result:
    """The run's analysis: from the disk cache, else parsed (``progress(done, total)`` as ranks
    are) and written to it; or the one-line reason it cannot be analyzed."""
    location = as_location(store)
    path = location / run_id
    cached = isinstance(location, Path)  # a URL store has no cache folder (--read-only one has)
    try:
        analysis = disk_cache.read(Path(store), run_id, signature) if cached else None
        if analysis is None:
            analysis = analyze_path(path, progress=progress)
            if cached:
                disk_cache.write(Path(store), run_id, signature, analysis)
    except FsobsError as exc:
        return None, _relative(str(exc), store)
    except Exception as exc:  # a bug must not take the whole app down: report it on the page
        logger.exception("analysis of %s failed", path)
        return None, f"unexpected error while analyzing ({type(exc).__name__}): {exc}"
    return analysis, None


@st.cache_resource(max_entries=32, show_spinner="Parsing the run's traces...", hash_funcs=BY_REPR)
def _analyze(store: str, run_id: str, signature: Signature, _ready: Result | None = None) -> Result:
    """:func:`analysis_of`, once per key; ``_ready``: what a background job found (not part of
    the key)."""
    try:
        return _ready if _ready is not None else analysis_of(store, run_id, signature)
    finally:
        _done().add((store, run_id, signature))


def _key(store: Location, entry: RunEntry) -> Key:
    return str(store), entry.run_id, entry.signature


@st.cache_resource
def _done() -> set[tuple[str, str, Signature]]:
    """Keys analyzed so far in this server (lets the runs table show big runs once opened)."""
    return set()


def _relative(message: str, store: str) -> str:
    return message.replace(f"{store}/", "")


@st.cache_data(max_entries=8, show_spinner="Comparing the ops of both runs...", hash_funcs=BY_REPR)
def trace_diff(
    control: tuple[str, int, Signature], test: tuple[str, int, Signature], use_hta: bool
) -> OpDiff:
    """The op diff of the first rank of two runs (file path, rank, signature for the cache key)."""
    return op_diff(
        (as_location(control[0]), control[1]), (as_location(test[0]), test[1]), use_hta=use_hta
    )


@st.cache_resource(max_entries=16, show_spinner=False, hash_funcs=BY_REPR)
def comparison(
    store: str, control: tuple[str, Signature], test: tuple[str, Signature], _loaded: Pair
) -> Comparison:
    """:func:`fsobs.analysis.comparison.ab.compare` of two loaded runs (keyed on ids +
    signatures)."""
    return compare(_loaded[0], _loaded[1])


@st.cache_resource(max_entries=32, show_spinner=False, hash_funcs=BY_REPR)
def findings_of(store: str, run_id: str, signature: Signature, _analysis: Analysis) -> list[str]:
    """:func:`fsobs.report.findings` of a run, once per signature (at 256 ranks its split
    bounds take longer than the rest of the Bubbles page)."""
    return findings(_analysis)


@st.cache_resource(max_entries=32, show_spinner=False, hash_funcs=BY_REPR)
def split_bounds_of(
    store: str, run_id: str, signature: Signature, _analysis: Analysis
) -> SplitBounds | None:
    """:func:`fsobs.analysis.whatif.bounds.run_bounds` of a run, once per signature (the
    Stragglers tab reran it on every visit: a partition per step at 256 ranks)."""
    return run_bounds(_analysis)


@dataclass(frozen=True)
class TimelineParts:
    """What the step timeline draws (:func:`timeline_parts`); read-only, shared by sessions."""

    bars: pd.DataFrame
    """:func:`dashboard.tables.timeline_frame` of the drawn ranks and steps."""
    ops: pd.DataFrame | None
    """The drawn ranks' ops and kernels (None when they are not named)."""
    names: list[str] | None
    """Per bar, the ops inside it (:func:`dashboard.ops.bar_names`)."""
    places: dict[tuple[int, str], str] | None
    """Per (rank, lane), where its ops ran (:func:`dashboard.ops.lane_places`)."""


@st.cache_resource(max_entries=16, show_spinner=False, hash_funcs=BY_REPR)
def timeline_parts(
    store: str,
    run_id: str,
    signature: Signature,
    ranks: tuple[int, ...],
    steps: tuple[int, ...],
    named: bool,
    _analysis: Analysis,
    _ops: Callable[[], pd.DataFrame],
) -> TimelineParts:
    """The timeline's bars of ``ranks`` over ``steps``, and with ``named`` the ops ``_ops()``
    reads and where each bar's ops ran; once per signature and choice (a tab switch or any
    other rerun of the page drew them again)."""
    offsets = _analysis.collectives.offsets_ns
    bars = timeline_frame(_analysis.bubbles.of_ranks(list(ranks)), list(steps), offsets)
    if not named:
        return TimelineParts(bars, None, None, None)
    ops = _ops()
    shifts = {r: bars.attrs["origin_ns"] + offsets.get(r, 0) for r in ranks}
    return TimelineParts(bars, ops, bar_names(bars, ops, shifts), lane_places(bars, ops))


@st.cache_resource(max_entries=64, show_spinner=False, hash_funcs=BY_REPR)
def figure_of(
    store: str,
    run_id: str,
    signature: Signature,
    name: str,
    choice: tuple[Any, ...],
    _build: Callable[[], go.Figure],
) -> go.Figure:
    """The figure ``name`` of a run, built by ``_build()`` once per signature and ``choice``
    (what else it depends on: the chosen ranks, steps, ...): a rerun of the page (a tab click,
    a page switch) serializes it again instead of building it (Plotly validates every
    property it is given: at 256 ranks the Bubbles page's four figures were half its rerun).
    Its title is in its template already (:func:`~dashboard.figures.title_in_template`);
    sessions share it, so a page must not change it."""
    return title_in_template(_build())


@st.cache_resource(max_entries=16, show_spinner=False, hash_funcs=BY_REPR)
def cost_fit(
    store: str, run_id: str, signature: Signature, _analysis: Analysis
) -> tuple[CostFit | None, str | None]:
    """The cost model fitted on a run, or the one-line reason it cannot be fitted."""
    try:
        return fit_cost(_analysis), None
    except FsobsError as exc:
        return None, _relative(str(exc), store)


@st.cache_data(max_entries=64, show_spinner=False, hash_funcs=BY_REPR)
def step_lengths(run_dir: str, signature: Signature, step: int) -> dict[int, np.ndarray]:
    """Per rank, the per-sample lengths the sidecars logged for ``step``."""
    return read_step_lengths(run_dir, step)
