"""FreeScale dashboard entry point: ``streamlit run dashboard/streamlit_app.py [-- --store DIR]``.

Resolves the run store (``--store`` after ``--``, else ``FSOBS_STORE``, else ``traces``) and routes
to the pages: ``/`` (or ``/runs``), ``/bubbles?run=<id>``, ``/compare?control=<id>&test=<id>``,
``/arms?control=<id>&runs=<id>,<id>``, ``/optimizer?run=<id>``, ``/whatif?run=<id>``,
``/live?run=<id>``; each page reads its run ids from the URL, and the sidebar's links carry them
(:mod:`dashboard.urlstate`). Who may open it is settled first (:mod:`dashboard.auth`).
"""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:  # `streamlit run` puts only dashboard/ on the path
    sys.path.insert(0, _ROOT)

import streamlit as st  # noqa: E402

from dashboard import auth, urlstate  # noqa: E402
from dashboard.widgets import init_store  # noqa: E402

auth.gate()  # nothing of the store before the viewer is let in (dashboard/auth.py)
init_store()
# The default page is served at "/" only; its hidden twin also serves it at "/runs" (and is the
# sidebar's link: a link to the default page would point at the current page's path).
HOME = st.Page("app_pages/runs.py", title="Runs", url_path="home", icon=":material/list:")
RUNS = st.Page(
    "app_pages/runs.py", title="Runs", url_path="runs", icon=":material/list:", visibility="hidden"
)
# (page, the query parameters it reads): the sidebar's links carry them.
LINKS = (
    (RUNS, ("run",)),
    (
        st.Page("app_pages/live.py", title="Live", url_path="live", icon=":material/monitoring:"),
        ("run",),
    ),
    (
        st.Page(
            "app_pages/bubbles.py",
            title="Bubbles",
            url_path="bubbles",
            icon=":material/bubble_chart:",
        ),
        ("run", "ranks", "rank_list"),
    ),
    (
        st.Page(
            "app_pages/compare.py",
            title="Compare",
            url_path="compare",
            icon=":material/compare_arrows:",
        ),
        ("control", "test"),
    ),
    (
        st.Page("app_pages/arms.py", title="Arms", url_path="arms", icon=":material/view_column:"),
        ("control", "runs"),
    ),
    (
        st.Page(
            "app_pages/optimizer.py",
            title="Optimizer",
            url_path="optimizer",
            icon=":material/tune:",
        ),
        ("run",),
    ),
    (
        st.Page(
            "app_pages/whatif.py",
            title="What-if",
            url_path="whatif",
            icon=":material/online_prediction:",
        ),
        ("run",),
    ),
)
page = st.navigation([HOME, *(p for p, _ in LINKS)], position="hidden")
# The browser tab names the page ("Bubbles · FreeScale"), so two open pages can be told apart.
st.set_page_config(
    page_title=f"{page.title} · FreeScale", page_icon=":material/bubble_chart:", layout="wide"
)
urlstate.observe()
urlstate.sidebar(LINKS)
page.run()
