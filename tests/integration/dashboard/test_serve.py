"""``dashboard/serve.py``: ``streamlit run`` in a process that has loaded the pages' modules
first (issue 26, point 5). The server itself is exercised by every browser test and by
``test_cli_serve.py``; here, what it loads and that it runs as a script."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.stores import ROOT

STREAMLIT_CACHED = ("dashboard.cache", "dashboard.widgets", "dashboard.urlstate")
"""Modules whose Streamlit caches must be made once the runtime runs, by the pages."""


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_warm_loads_the_pages_modules_and_no_streamlit_cache():
    done = _fresh(
        "import json, sys; from dashboard import serve; before = set(sys.modules); serve.warm();"
        "print(json.dumps([sorted(set(sys.modules) - before), list(serve.PRELOAD)]))"
    )
    assert done.returncode == 0, done.stderr
    loaded, preload = json.loads(done.stdout.splitlines()[-1])
    assert set(preload) <= set(loaded)
    assert "plotly.graph_objects" in loaded and "pandas" in loaded
    assert not set(STREAMLIT_CACHED) & set(loaded)


def test_serve_runs_as_a_script_and_hands_over_to_streamlit_run():
    """As a script the path starts at dashboard/, whose numbers.py would shadow the standard
    library's (numpy's import then fails); ``--help`` is ``streamlit run --help``."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "dashboard" / "serve.py"), "--help"],
        cwd=ROOT / "dashboard",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: streamlit run [OPTIONS]")
