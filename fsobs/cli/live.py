"""``fsobs watch`` (a run while its job writes it) and ``fsobs capture`` (profile the next
steps of a running job)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import TYPE_CHECKING

from rich.console import Console

from fsobs.cli.commands import COMMANDS
from fsobs.cli.common import Commands, console, example
from fsobs.errors import FsobsError
from fsobs.live.alerts import AlertConfig
from fsobs.live.capture import request_capture
from fsobs.live.state import LiveConfig, LiveRun
from fsobs.live.view import render, watch

if TYPE_CHECKING:
    from fsobs.live.metrics import MetricsServer

DEFAULT_INTERVAL_S = 2.0
LINGER_S = 60.0
"""How long ``--prometheus`` keeps serving a run's last state once it completed or stopped
(one scrape interval or more, so that the end is scraped)."""


def add_watch(commands: Commands) -> None:
    defaults = AlertConfig()
    cmd = commands.add_parser(
        "watch",
        help=COMMANDS["watch"].help,
        description=(
            "A live view until the run completes or stops (no sidecar grew for a while and "
            "run.json does not say complete); --once prints it once, --once --json as one "
            "JSON object for scripts."
        ),
        epilog=example("fsobs watch out/live-0 --prometheus 9464"),
    )
    cmd.add_argument("run", metavar="RUN", help="the run directory the job writes")
    cmd.add_argument(
        "--interval",
        type=_positive,
        default=DEFAULT_INTERVAL_S,
        metavar="S",
        help="seconds between polls (default: %(default)g)",
    )
    cmd.add_argument("--once", action="store_true", help="print the state once and exit")
    cmd.add_argument("--json", action="store_true", help="with --once: one JSON object")
    cmd.add_argument(
        "--stale-after",
        type=_positive,
        metavar="S",
        help="call the run stopped once no sidecar grew for S seconds (default: the larger "
        "of 120 s and 30 of its recent steps)",
    )
    cmd.add_argument(
        "--alert-threshold",
        type=_positive,
        default=defaults.threshold,
        metavar="X",
        help="a window's bubble ratio or straggler wait alerts at X times the median of the "
        "earlier windows (default: %(default)g)",
    )
    cmd.add_argument(
        "--alert-min-windows",
        type=_count,
        default=defaults.min_windows,
        metavar="N",
        help="earlier closed windows needed before comparing (default: %(default)s)",
    )
    cmd.add_argument(
        "--prometheus",
        type=_port,
        metavar="PORT",
        help="serve the state as Prometheus metrics on http://HOST:PORT/metrics (0: any port)",
    )
    cmd.add_argument(
        "--prometheus-host",
        metavar="HOST",
        help="address the metrics endpoint binds (default: 127.0.0.1, this machine only)",
    )
    cmd.set_defaults(handler=_watch)


def add_capture(commands: Commands) -> None:
    cmd = commands.add_parser(
        "capture",
        help=COMMANDS["capture"].help,
        epilog=example("fsobs capture out/live-0 --steps 5"),
    )
    cmd.add_argument("run", metavar="RUN", help="the run directory of the running job")
    cmd.add_argument(
        "--steps", type=_count, required=True, metavar="K", help="number of steps to record"
    )
    cmd.set_defaults(handler=_capture)


def _watch(args: argparse.Namespace) -> int:
    if args.json and not args.once:
        raise FsobsError("--json goes with --once (the live view is for a terminal)")
    if args.once and args.prometheus is not None:
        raise FsobsError("--prometheus serves while watching; leave out --once")
    alerts = AlertConfig(threshold=args.alert_threshold, min_windows=args.alert_min_windows)
    live = LiveRun(args.run, LiveConfig(stale_after_s=args.stale_after, alerts=alerts))
    if args.once:
        state = live.poll()
        if args.json:
            print(json.dumps(state.to_json(), allow_nan=False))
        else:
            console().print(render(state))
        return 0
    with contextlib.ExitStack() as stack:
        server = None
        if args.prometheus is not None:
            server = stack.enter_context(_serve(args.prometheus, args.prometheus_host))
            print(f"fsobs watch: metrics on {server.url}", file=sys.stderr)
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl+C ends the view quietly
            final = watch(live, Console(), args.interval, on_poll=server.update if server else None)
            if server is not None:  # a scraper sees the end too
                print(
                    f"fsobs watch: the run is {final.status}; its last state stays on "
                    f"{server.url} for {LINGER_S:g} s (Ctrl+C to stop)",
                    file=sys.stderr,
                )
                time.sleep(LINGER_S)
    return 0


def _capture(args: argparse.Namespace) -> int:
    capture = request_capture(args.run, args.steps)
    print(
        f"capture {capture.request.id}: steps {capture.first_step}-{capture.last_step} will be "
        f"recorded; the window will appear in {capture.window}"
    )
    return 0


def _serve(port: int, host: str | None) -> MetricsServer:
    try:
        from fsobs.live.metrics import serve
    except ImportError as exc:
        raise FsobsError(
            f"--prometheus needs prometheus_client ({exc}): pip install 'freescale[live]'"
        ) from exc
    try:
        return serve(port, host)
    except OSError as exc:
        where = f"{host or 'localhost'}:{port}"
        raise FsobsError(f"cannot serve metrics on {where}: {exc.strerror or exc}") from exc


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):  # also rejects NaN
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port: {text!r}") from None
    if not 0 <= value < 65536:
        raise argparse.ArgumentTypeError(f"must be in 0..65535, got {text!r}")
    return value
