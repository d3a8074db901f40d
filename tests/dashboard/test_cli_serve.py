"""``fsobs dashboard`` stops its Streamlit server when it is stopped (issue 25, point 8): the
issue found the server still serving after SIGTERM to the launcher."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from fsobs.cli import dashboard as dashboard_cli
from fsobs.cli.dashboard import serve
from tests.dashboard.stores import ROOT

SERVER = """
import os, signal, sys, time
if sys.argv[2] == "ignores-sigterm":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[1], "w").write(str(os.getpid()))
os.kill(os.getppid(), signal.SIGTERM)  # the launcher is told to stop while this one runs
time.sleep(300)
"""
"""A stand-in server that sends its launcher SIGTERM, then would run for 5 minutes."""


@pytest.mark.parametrize("behaviour", ["obeys", "ignores-sigterm"])
def test_sigterm_to_serve_stops_the_server_and_says_so(tmp_path, monkeypatch, capsys, behaviour):
    monkeypatch.setattr(dashboard_cli, "STOP_TIMEOUT_S", 1.0)  # then SIGKILL
    handler = signal.getsignal(signal.SIGTERM)
    pid_file = tmp_path / "pid"
    command = [sys.executable, "-c", SERVER, str(pid_file), behaviour]
    assert serve(command, dict(os.environ)) == 0
    assert capsys.readouterr().out == "fsobs dashboard: SIGTERM, server stopped\n"
    assert not psutil.pid_exists(int(pid_file.read_text()))  # stopped and reaped
    assert signal.getsignal(signal.SIGTERM) is handler  # the caller's handler is back


def test_serve_returns_the_servers_own_exit_code():
    assert serve([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ)) == 3


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
            return r.read() == b"ok"
    except OSError:
        return False


@pytest.mark.slow
def test_sigterm_to_fsobs_dashboard_stops_streamlit(tmp_path):
    """The real thing: ``fsobs dashboard`` serving Streamlit; SIGTERM to the launcher alone."""
    port = _free_port()
    command = ["dashboard", "--store", str(tmp_path), "--port", str(port)]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "fsobs.cli", *command],
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    servers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 180
        while not _healthy(port):
            assert launcher.poll() is None, launcher.communicate()[0]
            assert time.monotonic() < deadline, "streamlit did not come up"
            time.sleep(0.5)
        servers = psutil.Process(launcher.pid).children(recursive=True)
        assert servers
        launcher.send_signal(signal.SIGTERM)
        output = launcher.communicate(timeout=120)[0].decode()
        assert launcher.returncode == 0, output
        _, alive = psutil.wait_procs(servers, timeout=30)
        assert alive == []
        assert not _healthy(port)
        assert output.rstrip().endswith("fsobs dashboard: SIGTERM, server stopped")
    finally:  # on a failure: stop what this test started
        if launcher.poll() is None:
            launcher.kill()
        for process in servers:
            if process.is_running():
                process.kill()
        launcher.wait()
