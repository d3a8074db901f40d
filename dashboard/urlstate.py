"""The URL is the state: the runs and filters a page shows are its query parameters, and they
follow the user from page to page.

Streamlit keeps query parameters per page (a page switch starts on a bare URL) and a widget
bound to a parameter drops it from the URL whenever its value equals the widget's default, so
neither survives a reload or a page switch by itself. Instead:

- a page's run pickers take, in this order: a choice the user just made in the widget, the
  URL, the session's last value (:data:`MEMORY_KEY`), the page's default (:func:`wanted`);
- the value a page shows is written back to its URL at once and remembered (:func:`keep`), so
  a reload or a shared link opens the same thing, and the next page starts from it;
- the sidebar links carry the parameters of the page they open (:func:`sidebar`; drawn again
  when a page picks a value), so a link can be opened in a new tab or shared too.

The rank filter of the Bubbles page (``ranks``, ``rank_list``) stays bound to the URL by its
widgets; it is remembered here so that the sidebar's link back to Bubbles restores it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import streamlit as st
from streamlit.delta_generator import DeltaGenerator
from streamlit.navigation.page import StreamlitPage

from dashboard.ranks import MODES

MEMORY_KEY = "fsobs_url_memory"
SIDEBAR_KEY = "fsobs_sidebar"
Links = Sequence[tuple[StreamlitPage, tuple[str, ...]]]
"""Each page of the sidebar, with the query parameters it reads."""
LIST_SEPARATOR = ","
"""Between the ids of a list parameter: ``/arms?runs=a,b,c``."""
OBSERVED: dict[str, Callable[[Any], str]] = {"ranks": MODES.__getitem__, "rank_list": str}
"""Parameters owned by bound widgets of a page (key -> their URL form), remembered only."""


def _memory() -> dict[str, str]:
    memory: dict[str, str] = st.session_state.setdefault(MEMORY_KEY, {})
    return memory


def remembered(key: str) -> str | None:
    """The session's last value of the parameter ``key``."""
    return _memory().get(key)


def wanted(key: str) -> str | None:
    """The value the page should show for ``key``: its widget's (keyed ``key``) when the user
    just changed it, else the URL's, else the session's last one; None when none of them names
    one. A list parameter is its URL form (ids joined by ``,``)."""
    memory = remembered(key)
    widget = st.session_state.get(key)
    if isinstance(widget, list):
        widget = LIST_SEPARATOR.join(widget)
    if widget is not None and widget != memory:
        return str(widget)
    url = st.query_params.get(key)
    return url if url else memory


def in_url(key: str, value: str) -> bool:
    """Whether the URL says ``value`` for ``key`` (an id the store lacks is an error only then:
    one the session remembers may have been deleted since)."""
    return st.query_params.get(key) == value


def keep(key: str, value: str) -> None:
    """Put ``value`` in the page's URL and remember it for the next pages; the sidebar, drawn
    before the page chose it, is drawn again when it changed."""
    memory = _memory()
    changed = memory.get(key) != value
    memory[key] = value
    if st.query_params.get(key) != value:
        st.query_params[key] = value
    drawn = st.session_state.get(SIDEBAR_KEY)
    if changed and drawn is not None:
        _draw(*drawn)


def observe() -> None:
    """Remember the values of the bound widgets of :data:`OBSERVED`: the widget's while it is
    shown, else the URL's (a page opened from a link has not drawn its widgets yet)."""
    memory = _memory()
    for key, to_url in OBSERVED.items():
        value = st.session_state.get(key)
        if value is not None:
            memory[key] = to_url(value)
        elif url := st.query_params.get(key):
            memory[key] = url


def split(value: str) -> list[str]:
    """The ids of a list parameter (empty items dropped)."""
    return [item for item in (v.strip() for v in value.split(LIST_SEPARATOR)) if item]


def _carried(key: str) -> str | None:
    return remembered(key) if key in OBSERVED else wanted(key)


def sidebar(links: Links) -> None:
    """The navigation: one link per page, carrying the parameters it reads (``links``: page,
    parameter keys) as the session has them. Its placeholder is kept for this run's
    :func:`keep` (overwritten by the next run's)."""
    slot = st.sidebar.empty()
    st.session_state[SIDEBAR_KEY] = (slot, links)
    _draw(slot, links)


def _draw(slot: DeltaGenerator, links: Links) -> None:
    with slot.container():
        for page, keys in links:
            params = {k: v for k in keys if (v := _carried(k)) is not None}
            st.page_link(page, query_params=params)
