"""``fsobs dashboard``: the Streamlit app on a run store.

It listens on 127.0.0.1 unless ``--host`` says otherwise; on any other address without
``--auth`` it warns who can then read the store. Who may open it (``--auth``, ``--read-only``)
is passed to the app in its environment (:mod:`fsobs.cli.access`).

The app runs in a child process: ``streamlit run`` in a process that has loaded the pages'
modules first (``dashboard/serve.py``). SIGTERM, SIGHUP and SIGINT to
``fsobs dashboard`` stop it too (:func:`serve`): a service manager or ``kill`` never leaves a
server running without its launcher.
"""

from __future__ import annotations

import argparse
import importlib.util
import ipaddress
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

import fsobs
from fsobs.cli.access import TOKEN_ENV, access_env, add_access_flags
from fsobs.cli.commands import COMMANDS
from fsobs.cli.common import Commands, example
from fsobs.errors import FsobsError
from fsobs.storage import as_location

DEFAULT_PORT = 8501
DEFAULT_HOST = "127.0.0.1"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
STOP_TIMEOUT_S = 10.0
"""How long the server may take to stop after SIGTERM before it is killed."""


def add_dashboard(commands: Commands) -> None:
    cmd = commands.add_parser(
        "dashboard",
        help=COMMANDS["dashboard"].help,
        epilog=example("fsobs dashboard --store out/demo --host 0.0.0.0 --auth token"),
    )
    cmd.add_argument(
        "--store", default="traces", help="directory of runs to show (default: %(default)s)"
    )
    cmd.add_argument("--port", type=int, default=DEFAULT_PORT, help="(default: %(default)s)")
    cmd.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help="address to listen on; 0.0.0.0 for every interface (default: %(default)s)",
    )
    add_access_flags(cmd)
    cmd.set_defaults(handler=_dashboard)


def dashboard_app() -> Path:
    """Where the Streamlit entry file of a source checkout is (next to the fsobs package)."""
    return Path(fsobs.__file__).resolve().parents[1] / "dashboard" / "streamlit_app.py"


def dashboard_command(
    app: Path, port: int, host: str = DEFAULT_HOST, secrets_toml: Path | None = None
) -> list[str]:
    """The command line of ``fsobs dashboard``: ``streamlit run app`` through the server beside
    the app, which loads the pages' modules before it listens (``dashboard/serve.py``);
    ``secrets_toml`` is the ``secrets.toml`` of ``--auth oidc``, the only one Streamlit reads
    then."""
    options = ["--secrets.files", str(secrets_toml)] if secrets_toml is not None else []
    return [
        sys.executable,
        str(app.parent / "serve.py"),
        str(app),
        "--server.headless",
        "true",
        "--server.port",
        str(port),
        "--server.address",
        host,
        "--browser.gatherUsageStats",
        "false",
        *options,
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
    access = access_env(args, os.environ)
    secrets_toml = args.auth_secrets.resolve() if args.auth == "oidc" else None
    url = f"http://{_url_host(args.host)}:{args.port}"
    if args.auth == "none" and not is_loopback(args.host):
        print(_open_warning(args.host, args.port, args.read_only), file=sys.stderr)
    print(f"dashboard on {url} (run store {store}); Ctrl+C stops it")
    if args.auth == "token" and not access[TOKEN_ENV]:  # none given: one for this server
        access[TOKEN_ENV] = secrets.token_urlsafe(24)
        print(f"access token (new, for this server only): {url}/?token={access[TOKEN_ENV]}")
    env = os.environ | access | {"FSOBS_STORE": str(store)}
    return serve(dashboard_command(app, args.port, args.host, secrets_toml), env)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is reachable only from this machine."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None)
    except OSError:
        return False  # Streamlit will say it cannot listen there
    return bool(found) and all(ipaddress.ip_address(a[4][0]).is_loopback for a in found)


WILDCARDS = ("0.0.0.0", "::", "")
"""Addresses that listen on every interface."""


def _url_host(host: str) -> str:
    """The host part of the printed URL: this machine's name for a wildcard address."""
    if host in WILDCARDS:
        return socket.gethostname()
    return f"[{host}]" if ":" in host else host


def _open_warning(host: str, port: int, read_only: bool) -> str:
    who = f"port {port} of this machine" if host in WILDCARDS else f"{host}:{port}"
    can = "reads every trace in the store" + ("" if read_only else " and can upload runs into it")
    return (
        f"fsobs dashboard: warning: listening on {host}:{port} without --auth: anyone who can "
        f"reach {who} {can}; use --auth token or --auth oidc"
        + ("" if read_only else ", --read-only turns uploads off")
    )


class _Stop(Exception):
    """A stop signal reached the launcher while the server runs."""


class _Launcher:
    """The server's child process and the stop signal received, if any."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.signum: int | None = None

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        """Remember the signal; break out of the wait once the child exists (a signal that
        comes while it is being started is acted on right after)."""
        self.signum = signum
        if self.child is not None:
            raise _Stop


def serve(command: Sequence[str], env: Mapping[str, str]) -> int:
    """Run the server ``command`` until it exits (returns its exit code) or until SIGTERM,
    SIGHUP or SIGINT reaches this process: then stop the server (SIGTERM, SIGKILL after
    :data:`STOP_TIMEOUT_S`), say so in one line and return 0."""
    launcher = _Launcher()
    previous = {number: signal.signal(number, launcher.on_signal) for number in STOP_SIGNALS}
    try:
        child = subprocess.Popen(list(command), env=dict(env))
        try:
            launcher.child = child
            if launcher.signum is None:
                return child.wait()
        except _Stop:
            pass
        for number in STOP_SIGNALS:
            signal.signal(number, signal.SIG_IGN)
        _stop(child)
        assert launcher.signum is not None
        print(f"fsobs dashboard: {signal.Signals(launcher.signum).name}, server stopped")
        return 0
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _stop(child: subprocess.Popen[bytes]) -> None:
    child.terminate()
    try:
        child.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
