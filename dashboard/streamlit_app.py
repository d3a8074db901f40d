"""FreeScale dashboard entry point: ``streamlit run dashboard/streamlit_app.py [-- --store DIR]``.

Resolves the run store (``--store`` after ``--``, else ``FSOBS_STORE``, else ``traces``) and routes
to the pages: ``/`` (or ``/runs``), ``/bubbles?run=<id>``, ``/compare?control=<id>&test=<id>``,
``/optimizer?run=<id>``, ``/whatif?run=<id>``; each page reads its run ids from the URL.
"""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:  # `streamlit run` puts only dashboard/ on the path
    sys.path.insert(0, _ROOT)

import streamlit as st  # noqa: E402

from dashboard.widgets import init_store  # noqa: E402

st.set_page_config(
    page_title="FreeScale bubbles", page_icon=":material/bubble_chart:", layout="wide"
)
init_store()
st.navigation(
    [
        # The default page is served at "/" only; the hidden twin also serves it at "/runs".
        st.Page("app_pages/runs.py", title="Runs", url_path="home", icon=":material/list:"),
        st.Page("app_pages/runs.py", title="Runs", url_path="runs", visibility="hidden"),
        st.Page(
            "app_pages/bubbles.py",
            title="Bubbles",
            url_path="bubbles",
            icon=":material/bubble_chart:",
        ),
        st.Page(
            "app_pages/compare.py",
            title="Compare",
            url_path="compare",
            icon=":material/compare_arrows:",
        ),
        st.Page(
            "app_pages/optimizer.py",
            title="Optimizer",
            url_path="optimizer",
            icon=":material/tune:",
        ),
        st.Page(
            "app_pages/whatif.py",
            title="What-if",
            url_path="whatif",
            icon=":material/online_prediction:",
        ),
    ]
).run()
