"""``fsobs dashboard``: the Streamlit app on a run store."""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import fsobs
from fsobs.cli.common import Commands, example
from fsobs.errors import FsobsError
from fsobs.storage import as_location

DEFAULT_PORT = 8501


def add_dashboard(commands: Commands) -> None:
    cmd = commands.add_parser(
        "dashboard",
        help="open the Streamlit dashboard on a run store",
        epilog=example("fsobs dashboard --store out/demo --port 8501"),
    )
    cmd.add_argument(
        "--store", default="traces", help="directory of runs to show (default: %(default)s)"
    )
    cmd.add_argument("--port", type=int, default=DEFAULT_PORT, help="(default: %(default)s)")
    cmd.set_defaults(handler=_dashboard)


def dashboard_app() -> Path:
    """Where the Streamlit entry file of a source checkout is (next to the fsobs package)."""
    return Path(fsobs.__file__).resolve().parents[1] / "dashboard" / "streamlit_app.py"


def dashboard_command(app: Path, port: int) -> list[str]:
    """The ``streamlit run`` command line of ``fsobs dashboard``."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app),
        "--server.headless",
        "true",
        "--server.port",
        str(port),
        "--browser.gatherUsageStats",
        "false",
    ]


def _dashboard(args: argparse.Namespace) -> int:
    app = dashboard_app()
    if not app.is_file():
        raise FsobsError("no dashboard app here (it ships with the source checkout)", path=app)
    if importlib.util.find_spec("streamlit") is None:
        raise FsobsError("streamlit is not installed: pip install 'freescale[dashboard]'")
    if not 0 < args.port < 65536:
        raise FsobsError(f"--port must be in 1..65535, got {args.port}")
    store = as_location(args.store)  # a URL store stays a URL (read-only)
    if isinstance(store, Path):
        store = store.resolve()
        if store.exists() and not store.is_dir():
            raise FsobsError("the run store is not a directory", path=store)
    print(f"dashboard on http://localhost:{args.port} (run store {store}); Ctrl+C stops it")
    env = os.environ | {"FSOBS_STORE": str(store)}
    try:
        return subprocess.run(dashboard_command(app, args.port), env=env).returncode
    except KeyboardInterrupt:
        return 0
