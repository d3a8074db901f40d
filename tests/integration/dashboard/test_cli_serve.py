"""``fsobs dashboard`` stops its Streamlit server when it is stopped (issue 25, point 8): the
issue found the server still serving after SIGTERM to the launcher. It listens on 127.0.0.1
unless told otherwise, warns when it serves every interface without ``--auth``, and refuses bad
access flags in one line (issue 35, point 1; the logins themselves: ``test_auth_browser.py``)."""

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
import tomllib

from fsobs.cli import EXIT_BAD_INPUT, main
from fsobs.cli import dashboard as dashboard_cli
from fsobs.cli.dashboard import is_loopback, serve
from tests.support.launcher import FsobsDashboard
from tests.support.stores import ROOT

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


# -- where it listens, and who may open it (issue 35, point 1) ----------------------------


@pytest.mark.slow
def test_fsobs_dashboard_listens_on_loopback_only_by_default(tmp_path):
    with FsobsDashboard(tmp_path) as app:
        assert app.listening() == {"127.0.0.1"}
        assert app.stdout().startswith(f"dashboard on http://127.0.0.1:{app.port} (run store ")
        assert "warning" not in app.stderr()


@pytest.mark.slow
def test_every_interface_without_auth_warns_who_can_read_it(tmp_path):
    with FsobsDashboard(tmp_path, "--host", "0.0.0.0") as app:
        assert app.listening() == {"0.0.0.0"}
        port = app.port
        warning = (
            f"fsobs dashboard: warning: listening on 0.0.0.0:{port} without --auth: anyone who "
            f"can reach port {port} of this machine reads every trace in the store and can upload "
            "runs into it; use --auth token or --auth oidc, --read-only turns uploads off"
        )
        assert warning in app.stderr().splitlines()
        assert f"dashboard on http://{socket.gethostname()}:{port} " in app.stdout()


@pytest.mark.slow
def test_token_mode_without_a_token_prints_a_new_one_once(tmp_path):
    with FsobsDashboard(tmp_path, "--auth", "token", env={"FSOBS_DASHBOARD_TOKEN": ""}) as app:
        lines = [line for line in app.stdout().splitlines() if "?token=" in line]
        prefix = f"access token (new, for this server only): {app.url}/?token="
        assert len(lines) == 1 and lines[0].startswith(prefix)
        assert len(lines[0].removeprefix(prefix)) == 32  # 24 random bytes, base64url


def test_is_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.10")


def _secrets(path, **auth):
    path.write_text("[auth]\n" + "".join(f'{key} = "{value}"\n' for key, value in auth.items()))
    return path


GOOD_AUTH = {
    "redirect_uri": "https://dash.example.com/oauth2callback",
    "cookie_secret": "0123456789abcdef0123",
    "client_id": "id",
    "client_secret": "secret",
    "server_metadata_url": "https://idp.example.com/.well-known/openid-configuration",
}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--auth", "token", "--token-file", "{tmp}/missing"],
         "{tmp}/missing: no such token file (or not a regular file)"),
        (["--auth", "token", "--token-file", "{tmp}"],
         "{tmp}: no such token file (or not a regular file)"),
        (["--auth", "token", "--token-file", "{tmp}/short"],
         "{tmp}/short: the token must be at least 16 characters, without spaces"),
        (["--token-file", "{tmp}/short"], "--token-file needs --auth token"),
        (["--auth", "oidc", "--allow", "a@example.com"],
         "--auth oidc needs --auth-secrets SECRETS_TOML (its [auth] section)"),
        (["--auth", "oidc", "--auth-secrets", "{tmp}/good.toml"],
         "--auth oidc needs --allow EMAIL or --allow-file (who may log in)"),
        (["--allow", "a@example.com"], "--allow needs --auth oidc"),
        (["--auth", "token", "--allow-file", "{tmp}/allow"], "--allow-file needs --auth oidc"),
        (["--auth", "oidc", "--auth-secrets", "{tmp}/no_id.toml", "--allow", "a@example.com"],
         "{tmp}/no_id.toml: field client_id: missing in the [auth] section"),
        (["--auth", "oidc", "--auth-secrets", "{tmp}/good.toml", "--allow", "example.com"],
         "not an e-mail address or @domain: 'example.com'"),
        (["--auth", "oidc", "--auth-secrets", "{tmp}/short", "--allow", "a@example.com"],
         "{tmp}/short: no [auth] section"),
    ],
)  # fmt: skip
def test_bad_access_flags_give_one_line_and_exit_2(tmp_path, capsys, flags, message):
    (tmp_path / "short").write_text("abc = 'short'\n")
    _secrets(tmp_path / "good.toml", **GOOD_AUTH)
    _secrets(tmp_path / "no_id.toml", **{k: v for k, v in GOOD_AUTH.items() if k != "client_id"})
    argv = ["dashboard", "--store", str(tmp_path), *(f.format(tmp=tmp_path) for f in flags)]
    assert main(argv) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == f"fsobs: error: {message.format(tmp=tmp_path)}\n"


def test_streamlit_run_of_the_app_listens_on_loopback_too():
    """``streamlit run dashboard/streamlit_app.py`` reads the app's config.toml (Streamlit's
    own default is every interface)."""
    config = tomllib.loads((ROOT / "dashboard" / ".streamlit" / "config.toml").read_text())
    assert config["server"]["address"] == "127.0.0.1"


def test_the_served_app_is_a_service_not_an_editing_session():
    """No file watcher (and no rerun on save), and no full garbage collection after each
    script run: the pending view reruns twice a second, and each collection walked every
    object the server held (the cached analyses)."""
    config = tomllib.loads((ROOT / "dashboard" / ".streamlit" / "config.toml").read_text())
    assert config["server"]["fileWatcherType"] == "none"
    assert config["server"]["runOnSave"] is False
    assert config["runner"]["postScriptGC"] is False
