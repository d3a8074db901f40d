"""Drive the Streamlit dashboard in a real headless Chromium over the DevTools Protocol (CDP).

Used by ``tests/integration/dashboard/test_browser.py`` and ``benchmarks/bench_dashboard.py``. The
method is
the one verified in ``shared/notes/browser_testing.md``: ``chromium --screenshot`` alone is racy
because Streamlit sends the page over a websocket after load, so we start Chromium idle with a
debugging port and a fresh profile, navigate over CDP and poll a JavaScript condition until the
app has really rendered.

- :class:`StreamlitServer`: the dashboard as ``fsobs dashboard`` serves it, on a free port with
  ``FSOBS_STORE`` set, ready once ``/_stcore/health`` answers ``ok``; always terminated.
- :class:`Browser`: headless Chromium plus a minimal request/response CDP client.
- :data:`CHARTS_DRAWN_JS`: the documented "rendered" condition (a Plotly chart has drawn its
  SVG and no ``stSkeleton`` placeholder is left); :data:`PAGE_STATE_JS` and
  :func:`page_ready_js`: what a page shows, and the stricter "this page is fully rendered".
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from websockets.sync.client import ClientConnection, connect

from fsobs.cli.dashboard import dashboard_command

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "dashboard" / "streamlit_app.py"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

CHARTS_DRAWN_JS = (
    "!!document.querySelector('.js-plotly-plot .main-svg') && "
    "document.querySelectorAll('[data-testid=\"stSkeleton\"]').length === 0"
)
"""True once a Plotly chart has drawn its SVG and no Streamlit skeleton placeholder is left."""

# Page state, as one JSON-able object: the title, the Plotly charts (drawn or not, title as
# drawn and as Plotly's markup, number of data marks: bars of non-zero area, lines and markers
# of non-zero extent, heatmap images, pie slices), skeleton placeholders, stale elements,
# exception boxes, and whether the script runs (stApp's data-test-script-state, which
# Streamlit's own end-to-end tests wait on: "initial", "running", then "notRunning"). Plotly
# draws only after the script has finished.
PAGE_STATE_JS = r"""
(() => {
  const isMark = (el) => {
    const box = el.getBBox();
    return el.closest('.bars') ? box.width > 0 && box.height > 0 : box.width + box.height > 0;
  };
  const charts = Array.from(document.querySelectorAll('.js-plotly-plot'))
    .filter((plot) => plot.getClientRects().length > 0)  // not in a hidden tab or expander
    .map((plot) => ({
      drawn: !!plot.querySelector('.main-svg'),
      title: (plot.querySelector('.gtitle') || {}).textContent || '',
      titleMarkup: ((plot._fullLayout || {}).title || {}).text || '',
      marks: Array.from(plot.querySelectorAll(
        '.cartesianlayer .trace path, .cartesianlayer .hm image, .pielayer .slice path'
      )).filter(isMark).length,
    }));
  const h1 = document.querySelector('[data-testid="stMain"] h1');
  return {
    title: h1 ? h1.innerText.trim() : null,
    charts: charts,
    drawn: charts.filter((c) => c.drawn).length,
    skeletons: document.querySelectorAll('[data-testid="stSkeleton"]').length,
    stale: document.querySelectorAll('[data-stale="true"]').length,
    exceptions: Array.from(document.querySelectorAll('[data-testid="stException"]'))
      .map((e) => e.innerText.slice(0, 500)),
    running: (document.querySelector('[data-testid="stApp"]') || {}).dataset?.testScriptState
      !== 'notRunning',
  };
})()
"""


IN_TRANSITION = (
    "Inspected target navigated or closed",
    "Cannot find context with specified id",
    "Execution context was destroyed",
)
"""CDP errors of a ``Runtime.evaluate`` sent while a navigation or reload replaces the page's
document: the expression had no document to run in."""


def page_ready_js(title: str, min_charts: int) -> str:
    """True once the script has finished, the page shows ``title`` and at least ``min_charts``
    drawn visible Plotly charts, and no skeleton placeholder or stale element is left.

    Cheap enough to poll every 50 ms while Plotly draws (no per-mark layout queries).
    """
    return f"""(() => {{
  const app = document.querySelector('[data-testid="stApp"]');
  const h1 = document.querySelector('[data-testid="stMain"] h1');
  const drawn = Array.from(document.querySelectorAll('.js-plotly-plot'))
    .filter((plot) => plot.getClientRects().length > 0 && plot.querySelector('.main-svg'));
  return !!app && app.dataset.testScriptState === 'notRunning'
    && !!h1 && h1.innerText.trim() === {json.dumps(title)} && drawn.length >= {min_charts}
    && !document.querySelector('[data-testid="stSkeleton"], [data-stale="true"]');
}})()"""


CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # needed as root and in containers
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def find_chromium() -> str | None:
    """Path of a Chromium binary: ``$CHROMIUM`` if set, else the first known name on PATH."""
    if explicit := os.environ.get("CHROMIUM"):
        return shutil.which(explicit)
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


def free_port() -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """Terminate ``proc`` and its process group (SIGTERM, then SIGKILL), and reap it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout_s)
    try:  # children that outlived the group leader
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class StreamlitServer:
    """The dashboard as ``fsobs dashboard`` serves it (:func:`dashboard_command`), on a free
    port, reading its runs from ``store``."""

    def __init__(self, store: Path, *, app: Path = APP, startup_timeout_s: float = 60.0) -> None:
        self.store = store
        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._startup_timeout_s = startup_timeout_s
        self._log_dir = Path(tempfile.mkdtemp(prefix="fsobs-streamlit-"))
        self.log_path = self._log_dir / "streamlit.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> StreamlitServer:
        cmd = [
            *dashboard_command(self.app, self.port),
            "--server.address",
            "127.0.0.1",
        ]
        env = os.environ | {"FSOBS_STORE": str(self.store), "PYTHONWARNINGS": "ignore"}
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            self._wait_healthy()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_healthy(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self._startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"streamlit exited with {self._proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=2) as resp:
                    if resp.read().decode().strip() == "ok":
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(
            f"streamlit not healthy after {self._startup_timeout_s} s:\n{self.log()}"
        )

    @property
    def pid(self) -> int:
        """Process id of the server (the leader of its process group)."""
        assert self._proc is not None, "use StreamlitServer as a context manager"
        return self._proc.pid

    def log(self, tail_chars: int = 4000) -> str:
        """The last ``tail_chars`` characters of the server's stdout and stderr."""
        try:
            return self.log_path.read_text(errors="replace")[-tail_chars:]
        except OSError:
            return ""

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None:
            _stop(self._proc)
        shutil.rmtree(self._log_dir, ignore_errors=True)


class Browser:
    """Headless Chromium with one page target, driven over CDP (request/response only)."""

    def __init__(
        self, chromium: str, *, width: int = 1400, height: int = 1000, timeout_s: float = 30.0
    ) -> None:
        self.width, self.height = width, height
        self.timeout_s = timeout_s
        self._chromium = chromium
        self._port = free_port()
        self._profile = Path(tempfile.mkdtemp(prefix="fsobs-chrome-profile-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self._ws: ClientConnection | None = None
        self._next_id = 0

    def __enter__(self) -> Browser:
        self._proc = subprocess.Popen(
            [
                self._chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={self._profile}",
                f"--window-size={self.width},{self.height}",
                f"--remote-debugging-port={self._port}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,  # harmless dbus errors
            start_new_session=True,
        )
        try:
            url = self._page_ws_url()
            self._ws = connect(url, max_size=None, open_timeout=10, legacy=True)
            self.call(
                "Emulation.setDeviceMetricsOverride",
                width=self.width,
                height=self.height,
                deviceScaleFactor=1,
                mobile=False,
            )
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _page_ws_url(self) -> str:
        """Wait for the DevTools endpoint and return the page target's websocket URL."""
        assert self._proc is not None
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self._proc.returncode}")
            try:
                url = f"http://127.0.0.1:{self._port}/json/list"
                with urllib.request.urlopen(url, timeout=2) as resp:
                    targets = json.load(resp)
                page: str = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
                return page
            except (OSError, StopIteration, ValueError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._ws is not None:
            self._ws.close()
        if self._proc is not None:
            _stop(self._proc)
        shutil.rmtree(self._profile, ignore_errors=True)

    @property
    def pid(self) -> int:
        """Process id of Chromium's browser process (the leader of its process group)."""
        assert self._proc is not None, "use Browser as a context manager"
        return self._proc.pid

    def call(self, method: str, **params: object) -> dict[str, Any]:
        """Send one CDP command and return its result, skipping events until the reply."""
        assert self._ws is not None, "use Browser as a context manager"
        self._next_id += 1
        self._ws.send(json.dumps({"id": self._next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self._ws.recv(timeout=self.timeout_s))
            if msg.get("id") == self._next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                result: dict[str, Any] = msg.get("result", {})
                return result

    def evaluate(self, js: str) -> object:
        """Value of a JavaScript expression in the page (JSON-serializable values only)."""
        reply = self.call("Runtime.evaluate", expression=js, returnByValue=True)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"{js!r} raised: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def wait_for(self, js: str, timeout_s: float | None = None, poll_s: float = 0.05) -> float:
        """Poll a JavaScript boolean until it is true; seconds waited. TimeoutError otherwise.
        A poll that lands while the page is between two documents (Chromium answers
        :data:`IN_TRANSITION`) counts as not yet true."""
        start = time.monotonic()
        deadline = start + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            try:
                if self.evaluate(js) is True:
                    return time.monotonic() - start
            except RuntimeError as exc:
                if not any(text in str(exc) for text in IN_TRANSITION):
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"not true after {time.monotonic() - start:.1f} s: {js}")
            time.sleep(poll_s)

    def navigate(self, url: str) -> None:
        """Load ``url`` and wait until the old document is gone (not until the app rendered).

        The old document is marked first, so that a condition polled afterwards cannot be
        answered by the page we are leaving.
        """
        self.evaluate("window.__fsobsOldDocument = true")
        reply = self.call("Page.navigate", url=url)
        if reply.get("errorText"):
            raise RuntimeError(f"navigate to {url}: {reply['errorText']}")
        self.wait_for("window.__fsobsOldDocument !== true")

    def screenshot(self, path: Path) -> Path:
        """Write a PNG of the viewport to ``path`` (parents created)."""
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def click(self, selector: str, text: str | None = None) -> None:
        """Click the first element matching ``selector`` whose text is ``text`` (its last line:
        Streamlit puts a Material icon's name on the line before a label)."""
        found = self.evaluate(
            f"(() => {{ const want = {json.dumps(text)}; const el = Array.from("
            f"document.querySelectorAll({json.dumps(selector)})).find((e) => want === null || "
            "e.innerText.trim().split('\\n').pop().trim() === want);"
            " if (!el) return false; el.click(); return true; })()"
        )
        if not found:
            raise LookupError(f"nothing to click: {selector!r} with text {text!r}")

    def set_input_files(self, selector: str, files: list[Path]) -> None:
        """Put ``files`` into the ``<input type=file>`` matching ``selector``, as a user would."""
        root = self.call("DOM.getDocument", depth=-1, pierce=True)["root"]
        node = self.call("DOM.querySelector", nodeId=root["nodeId"], selector=selector)
        if not node.get("nodeId"):
            raise LookupError(f"no element matches {selector!r}")
        paths = [str(Path(f).resolve()) for f in files]
        self.call("DOM.setFileInputFiles", files=paths, nodeId=node["nodeId"])
