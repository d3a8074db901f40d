"""The live half: a run read while its job writes it (no torch).

- :mod:`.model`: what a live view knows at one poll (:class:`LiveState`), plain data;
- :mod:`.state`: :class:`LiveRun`, the incremental reader (growing sidecars, the window index);
- :mod:`.index`: each closed window analyzed once, its ``summary.json`` kept in the run;
- :mod:`.alerts`: alert rules over the index and the recent steps;
- :mod:`.capture`: asking a running job to profile its next steps (``fsobs capture``);
- :mod:`.view` / :mod:`.metrics`: ``fsobs watch``'s terminal view and Prometheus ``/metrics``.
"""

from fsobs.live.alerts import AlertConfig
from fsobs.live.capture import MAX_CAPTURE_STEPS, request_capture
from fsobs.live.model import LiveState, WindowEntry, ago
from fsobs.live.state import RUNNING, LiveConfig, LiveRun, run_status

__all__ = [
    "MAX_CAPTURE_STEPS",
    "RUNNING",
    "AlertConfig",
    "LiveConfig",
    "LiveRun",
    "LiveState",
    "WindowEntry",
    "ago",
    "request_capture",
    "run_status",
]
