"""The dashboard's server: ``python dashboard/serve.py APP [streamlit run options]``.

It is ``streamlit run APP [options]`` in a process that has first imported what the pages draw
with (plotly, the analyzer, the dashboard's figures and tables) and drawn one figure of each
kind the pages draw. Streamlit imports a page's modules when a session first runs it, so
without this the first page a user opens pays for them: about 0.5 s of a 2-core machine
(issue 26, point 5). The modules that use Streamlit's caches (``dashboard.cache``,
``dashboard.widgets``, ``dashboard.urlstate``) are left to the pages: their caches bind to the
runtime, which starts after this. It also puts :mod:`dashboard.upload_guard` in front of
Streamlit's routes: files are taken only from sessions shown the uploader, and only so many.
"""

from __future__ import annotations

import importlib
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
if sys.path and os.path.abspath(sys.path[0]) == _HERE:
    # run as a script, the path starts at dashboard/, whose numbers.py would stand in for the
    # standard library's: the checkout's root takes its place (as in streamlit_app.py)
    sys.path[0] = _ROOT

PRELOAD = (
    "dashboard.figures",
    "dashboard.live",
    "dashboard.numbers",
    "dashboard.ops",
    "dashboard.store",
    "dashboard.tables",
    "fsobs.analysis",
    "fsobs.cli",
    "fsobs.live",
    "fsobs.report",
)
"""What the pages import that takes time to load and touches none of Streamlit's caches."""


def warm() -> None:
    """Import the pages' heavy modules and serialize one figure of every trace type they use
    (plotly loads each type's validators on its first figure)."""
    for module in PRELOAD:
        importlib.import_module(module)
    import plotly.graph_objects as go

    from dashboard.figures._style import finish

    figure = go.Figure(
        [
            go.Bar(x=[0], y=[1]),
            go.Box(y=[1]),
            go.Heatmap(z=[[1]]),
            go.Scatter(x=[0], y=[1]),
            go.Scattergl(x=[0], y=[1]),
        ]
    )
    finish(figure, "warm-up", "x", "y").to_json()


def main(argv: list[str]) -> None:
    """Warm this process, guard its uploads, then hand it to ``streamlit run`` with ``argv``
    (the app first)."""
    warm()
    from dashboard import upload_guard

    upload_guard.install()
    from streamlit.web import cli

    sys.argv = ["streamlit", "run", *argv]
    cli.main()


if __name__ == "__main__":
    main(sys.argv[1:])
