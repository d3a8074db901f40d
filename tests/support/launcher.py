"""``fsobs dashboard`` as a user starts it, for the tests of its flags: :class:`FsobsDashboard`
runs the command on a free port, waits until Streamlit answers ``/_stcore/health``, and stops
it with SIGTERM (the launcher stops its server, ``fsobs/cli/dashboard.py``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType

import psutil

from tests.support.cdp import ROOT, free_port


class FsobsDashboard:
    """``fsobs dashboard --store STORE --port PORT ARGS`` (a free port unless given); its stdout
    and stderr kept apart."""

    def __init__(
        self,
        store: Path,
        *args: str,
        port: int | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float = 90,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = ["dashboard", "--store", str(store), "--port", str(self.port), *args]
        self._env = (
            os.environ
            | (env or {})
            | {
                "PYTHONPATH": str(ROOT),
                "PYTHONWARNINGS": "ignore",
                "STREAMLIT_SERVER_FILE_WATCHER_TYPE": "none",
            }
        )
        self._timeout_s = timeout_s
        self._logs = Path(tempfile.mkdtemp(prefix="fsobs-dashboard-"))
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> FsobsDashboard:
        with open(self._logs / "out", "wb") as out, open(self._logs / "err", "wb") as err:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "fsobs.cli", *self.command],
                cwd=ROOT,
                env=self._env,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        try:
            self._wait_healthy()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_healthy(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self._timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"fsobs dashboard exited: {self.stdout()}{self.stderr()}")
            try:
                with urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=2) as reply:
                    if reply.read() == b"ok":
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"not healthy after {self._timeout_s} s: {self.stderr()[-3000:]}")

    def stdout(self) -> str:
        return (self._logs / "out").read_text(errors="replace")

    def stderr(self) -> str:
        return (self._logs / "err").read_text(errors="replace")

    def listening(self) -> set[str]:
        """The addresses the server listens on at its port (``127.0.0.1``, ``0.0.0.0``...)."""
        assert self._proc is not None
        processes = psutil.Process(self._proc.pid).children(recursive=True)
        return {
            c.laddr.ip
            for p in processes
            for c in p.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == self.port
        }

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        shutil.rmtree(self._logs, ignore_errors=True)
