"""Runs: the stored runs with their key facts, and the upload of a new run."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import streamlit as st
from streamlit.runtime.uploaded_file_manager import UploadedFile

from dashboard.cache import (
    AUTO_ANALYZE_BYTES,
    facts,
    first_with_data,
    is_analyzed,
    remember_upload,
    runs,
)
from dashboard.held_uploads import accept_uploads, clear_uploader, start_sweeper, uploader_key
from dashboard.store import RunEntry, is_read_only, live_first, read_only_note, run_state
from dashboard.text import code, esc
from dashboard.upload import (
    MAX_UPLOAD_BYTES,
    UPLOADER_MB,
    UploadError,
    analyze_upload,
    store_upload,
)
from dashboard.widgets import current_store, pick_run, table
from fsobs import Analysis
from fsobs.storage import Location

RESULT_KEY = "upload_result"
Result = tuple[str, str, str | None]
# Streamlit words the per-file limit with one digit in the largest unit (512 MiB shows as
# "1GB per file"): the caption above the uploader states the limit instead.
HIDE_WIDGET_LIMIT = (
    "<style>[data-testid='stFileUploaderDropzoneInstructions'] {display: none}</style>"
)
MAX_RUNNING_LINKS = 4  # running runs linked above the table (which lists them all, first)

logger = logging.getLogger(__name__)


def _store_upload(store: Path) -> None:
    """Button callback: store the uploaded files (runs before the page, so the table shows it),
    then let go of them (:mod:`dashboard.held_uploads`)."""
    files = list(st.session_state.get(uploader_key()) or [])
    name = (st.session_state.get("upload_name") or "").strip() or None
    try:
        if is_read_only(store):  # the form is not shown then; a forged click is refused too
            st.session_state[RESULT_KEY] = ("error", read_only_note(store), None)
        else:
            st.session_state[RESULT_KEY] = _stored(store, files, name)
    finally:
        clear_uploader()


def _stored(store: Path, files: list[UploadedFile], name: str | None) -> Result:
    """The result line of storing ``files``: kind, Markdown, the run stored."""
    if not files:
        return ("info", "Choose the files of a run first.", None)
    analyses: list[Analysis] = []
    try:
        stored = store_upload(
            store,
            [(f.name, f) for f in files],
            name,
            validate=lambda folder: analyses.append(analyze_upload(folder)),
        )
    except UploadError as exc:
        return ("error", f"Upload refused: {esc(exc)}", None)
    except Exception as exc:  # a bug must not take the page down (the store is unchanged)
        logger.exception("upload failed")
        reason = esc(f"({type(exc).__name__}): {exc}")
        return ("error", f"Upload failed: unexpected error {reason}; nothing was stored", None)
    remember_upload(store, stored.run_id, analyses[-1])
    message = f"Stored as {code(stored.run_id)}: {esc(', '.join(stored.files))}."
    if stored.skipped:
        message += f" Skipped (not run files): {esc(', '.join(stored.skipped[:10]))}."
    st.session_state["run"] = stored.run_id  # "Open a run" selects it (dashboard.urlstate)
    return ("success", message, stored.run_id)


def _runs_table(store: Location) -> list[RunEntry]:
    """The table of runs, running ones first (:func:`dashboard.store.live_first`)."""
    found = runs(store)
    if not found:
        st.info(f"No run in the store yet ({code(store)}). Upload one below.")
        return []
    states = {e.run_id: run_state(e) for e in found}
    entries = live_first(found, [states[e.run_id][0] for e in found])
    auto = [e.trace_bytes <= AUTO_ANALYZE_BYTES and not e.unfinished for e in entries]
    pending = sum(a and not is_analyzed(store, e) for a, e in zip(auto, entries, strict=True))
    bar = st.progress(0.0, text=f"Analyzing {pending} run(s)...") if pending else None
    rows = []
    for number, (entry, analyze) in enumerate(zip(entries, auto, strict=True), start=1):
        rows.append(facts(store, entry, states[entry.run_id], analyze=analyze))
        if bar is not None:
            bar.progress(number / len(entries), text=f"Analyzed {entry.run_id}")
    if bar is not None:
        bar.empty()
    _running_links([e.run_id for e in entries if states[e.run_id][0] == "running"])
    _links_skipped(entries)
    table(
        pd.DataFrame(rows),
        column_config={
            "bubble ratio": st.column_config.NumberColumn(format="percent"),
            "simulated": st.column_config.CheckboxColumn(),
        },
    )
    return entries


def _running_links(run_ids: list[str]) -> None:
    """A link to the Live page of each running run (the first :data:`MAX_RUNNING_LINKS`)."""
    if not run_ids:
        return
    shown = run_ids[:MAX_RUNNING_LINKS]
    more = len(run_ids) - len(shown)
    st.caption(f"{len(run_ids)} run(s) running" + (f"; {more} more in the table" if more else ""))
    for column, run_id in zip(st.columns(len(shown)), shown, strict=True):
        column.page_link(
            "app_pages/live.py",
            label=esc(run_id),
            query_params={"run": run_id},
            icon=":material/play_circle:",
        )


def _links_skipped(entries: list[RunEntry]) -> None:
    """One line naming the runs' files that are symbolic links (never opened)."""
    linked = [f"{code(e.run_id)}: {esc(', '.join(e.links))}" for e in entries if e.links]
    if linked:
        st.caption("Symbolic links skipped (not followed): " + "; ".join(linked))


def _open_links(store: Location, entries: list[RunEntry]) -> None:
    """The session's run (after an upload: the uploaded one) and links to its pages."""
    entry = pick_run("Open a run", "run", entries, lambda: first_with_data(store, entries))
    _links(entry.run_id)


def _links(run_id: str) -> None:
    now, left, middle, right = st.columns(4)
    now.page_link("app_pages/live.py", label="Live", query_params={"run": run_id})
    left.page_link("app_pages/bubbles.py", label="Bubbles", query_params={"run": run_id})
    middle.page_link("app_pages/optimizer.py", label="Optimizer", query_params={"run": run_id})
    right.page_link(
        "app_pages/compare.py", label="Compare (as control)", query_params={"control": run_id}
    )


def _upload_form(store: Location) -> None:
    st.subheader("Upload a run")
    if is_read_only(store):
        st.info(read_only_note(store))
        return
    assert isinstance(store, Path)  # a store that is not read-only is a local folder
    st.caption(
        "Several trace files (one `*.json` / `*.json.gz` per rank, plus optional `run.json` and "
        "`steps.rank<R>.jsonl`) or one `.zip` / `.tar.gz` archive of them: "
        f"**at most {MAX_UPLOAD_BYTES // 2**20} MiB in all, uncompressed**. It is validated with "
        "fsobs and stored under `uploads/`; an existing run is never overwritten."
    )
    st.html(HIDE_WIDGET_LIMIT)
    start_sweeper()
    refused = accept_uploads()
    st.file_uploader(
        "Trace files or one archive",
        type=["json", "gz", "jsonl", "zip", "tgz"],
        accept_multiple_files=True,
        key=uploader_key(),
        max_upload_size=UPLOADER_MB,
    )
    if refused is not None:
        st.warning(esc(refused))
    st.text_input("Run name (optional)", key="upload_name", max_chars=64)
    st.button("Store the run", key="upload_store", on_click=_store_upload, args=(store,))
    result = st.session_state.get(RESULT_KEY)
    if result is not None:
        kind, message, run_id = result
        {"success": st.success, "info": st.info, "error": st.error}[kind](message)
        if run_id is not None:
            _links(run_id)


def render() -> None:
    """The page."""
    st.title("Runs")
    store = current_store()
    entries = _runs_table(store)
    if entries:
        _open_links(store, entries)
    _upload_form(store)
    st.caption(f"Run store: {code(store)}")


render()
