"""The files waiting in the Runs page's uploader: capped per session, let go of when done.

Streamlit keeps every file a browser sends to a ``st.file_uploader`` in the server's memory
(``MemoryUploadedFileManager``, per session) until the session is shut down, and a session
whose browser went away is kept for reconnecting, then dropped without being shut down
(Streamlit 1.67), so its files stayed in memory for the server's life. Here:

1. the server takes only so many files from a session, and only from one shown the uploader
   (:mod:`dashboard.upload_guard`, which refuses them before they are read);
2. once the Store button has used them, stored or refused, the files are dropped
   (:func:`release`) and the uploader starts empty (:func:`uploader_key` changes);
3. a thread (:func:`start_sweeper`) drops, every :data:`SWEEP_SECONDS`, the files of every
   session that is no longer connected (a closed tab, a lost network), and its uploader's
   value, which held them too; freed memory is handed back to the system (``malloc_trim``).
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Sequence

import streamlit as st
from streamlit.runtime import Runtime
from streamlit.runtime.memory_uploaded_file_manager import MemoryUploadedFileManager
from streamlit.runtime.scriptrunner import get_script_run_ctx
from streamlit.runtime.state import SessionState
from streamlit.runtime.uploaded_file_manager import UploadedFile

from dashboard import upload_guard

SWEEP_SECONDS = 10.0
"""How often the files of sessions that ended are dropped."""
UPLOADER = "upload_files"
GENERATION = "upload_generation"

logger = logging.getLogger(__name__)


def uploader_key() -> str:
    """The uploader's widget key; a new one after each store, so that it starts empty."""
    generation = st.session_state.get(GENERATION, 0)
    return UPLOADER if generation == 0 else f"{UPLOADER}-{generation}"


def accept_uploads() -> str | None:
    """Let this session's browser send files (its page shows the uploader); the line that says
    which files the server refused since the last call (:mod:`dashboard.upload_guard`), or
    None."""
    ctx = get_script_run_ctx()
    if ctx is None:
        return None
    upload_guard.allow_uploads(ctx.session_id)
    return upload_guard.refused_note(ctx.session_id)


def release(files: Sequence[UploadedFile]) -> None:
    """Drop ``files`` from the server's memory and start the uploader anew (empty)."""
    ctx = get_script_run_ctx()
    if ctx is None:
        return
    manager = ctx.uploaded_file_mgr
    if not isinstance(manager, MemoryUploadedFileManager):  # the only kind Streamlit runs
        logger.warning("cannot release uploads held by %s", type(manager).__name__)
        return
    for file in files:
        manager.remove_file(ctx.session_id, file.file_id)


def clear_uploader() -> None:
    """Release every file of the uploader and give it a new key (called by the Store button)."""
    key = uploader_key()
    release(st.session_state.get(key) or [])
    st.session_state.pop(key, None)
    st.session_state[GENERATION] = st.session_state.get(GENERATION, 0) + 1
    _return_memory()


def release_ended_sessions() -> int:
    """Drop the uploaded files of every session no longer connected, from Streamlit's store of
    files and from the session's own state (a closed tab's session is kept for reconnecting,
    its uploader's value with it); how many sessions had files."""
    if not Runtime.exists():
        return 0
    runtime = Runtime.instance()
    manager = runtime.uploaded_file_mgr
    storage = getattr(manager, "file_storage", None)  # MemoryUploadedFileManager's
    if storage is None:
        return 0
    ended = {sid for sid in list(storage) if not runtime.is_active_session(sid)}
    upload_guard.forget(
        {sid for sid in upload_guard.known_sessions() if not runtime.is_active_session(sid)}
    )
    for session_id in ended:
        manager.remove_session_files(session_id)
    sessions = getattr(runtime, "_session_mgr", None)  # Streamlit 1.67: no public list
    for info in sessions.list_sessions() if ended and sessions is not None else []:
        if info.session.id in ended:
            _forget_uploads(info.session.session_state)
    if ended:
        _return_memory()
    return len(ended)


def _forget_uploads(state: SessionState) -> None:
    """Delete every uploader value a session's state holds (one key per store, see
    :func:`uploader_key`)."""
    generation = state[GENERATION] if GENERATION in state else 0
    for number in range(int(generation) + 1):
        key = UPLOADER if number == 0 else f"{UPLOADER}-{number}"
        if key in state:
            del state[key]


def _return_memory() -> None:
    """Give freed memory back to the system (glibc keeps freed blocks of a thread's arena)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


@st.cache_resource
def start_sweeper() -> threading.Thread:
    """The server's one thread that calls :func:`release_ended_sessions` (started once)."""
    thread = threading.Thread(target=_sweep, name="fsobs-upload-sweeper", daemon=True)
    thread.start()
    return thread


def _sweep() -> None:
    while True:
        time.sleep(SWEEP_SECONDS)
        try:
            release_ended_sessions()
        except Exception:  # a bug must not stop the sweeping
            logger.exception("releasing the uploads of ended sessions failed")
