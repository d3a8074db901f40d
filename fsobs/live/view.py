"""``fsobs watch``'s terminal view: one :class:`~fsobs.live.model.LiveState` drawn with rich.

:func:`render` is pure (a state in, a renderable out); :func:`watch` polls and redraws it in
place until the run completes or stops. A window is shown with numbers only once it is
``closed``: a ``pending`` one is said to be pending (with the ranks that published it), never
summarized from the ranks that did, which would read as a smaller run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Protocol

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from fsobs.live.model import LiveState, RankProgress, WindowEntry, ago

RECENT_WINDOWS = 8
"""Windows shown (the latest, in step order)."""
_STATUS_STYLE = {"running": "bold green", "complete": "bold blue", "stopped": "bold red"}


class Poller(Protocol):
    """What :func:`watch` polls (:class:`fsobs.live.state.LiveRun`)."""

    def poll(self) -> LiveState: ...


def render(state: LiveState, *, num_windows: int = RECENT_WINDOWS) -> RenderableType:
    """The whole view: header, ranks, balance and late rank, recent windows, firing alerts."""
    parts: list[RenderableType] = [_header(state), _ranks(state.ranks), _balance(state)]
    if state.capture is not None:
        parts.append(_capture(state.capture))
    parts += [_windows(state.windows[-num_windows:], state.world_size), _alerts(state)]
    return Group(*parts)


def watch(
    live: Poller,
    console: Console,
    interval_s: float,
    *,
    until_done: bool = True,
    on_poll: Callable[[LiveState], None] | None = None,
) -> LiveState:
    """Poll ``live`` every ``interval_s`` and redraw the view in place; ``on_poll`` sees each
    state first (the Prometheus endpoint). Returns the last state once the run is complete or
    stopped (with ``until_done``; else runs until interrupted)."""
    with Live(console=console, auto_refresh=False) as screen:
        while True:
            state = live.poll()
            if on_poll is not None:
                on_poll(state)
            screen.update(render(state), refresh=True)
            if until_done and state.status != "running":
                return state
            time.sleep(interval_s)


def _header(state: LiveState) -> Text:
    text = Text("fsobs watch ", style="bold")
    text.append(state.run)
    if state.name is not None and state.name != state.run:
        text.append(f" ({state.name})")
    text.append(" · ")
    status = state.status
    if status == "stopped" and state.idle_s is not None and math.isfinite(state.idle_s):
        status = f"stopped {ago(state.idle_s)} ago"
    text.append(status, style=_STATUS_STYLE.get(state.status, "bold"))
    if state.reason is not None:
        text.append(f": {state.reason}")
    step = "-" if state.step is None else str(state.step)
    ranks = "?" if state.world_size is None else str(state.world_size)
    text.append(f"\nstep {step} (ended on every rank) · {ranks} ranks")
    return text


def _ranks(ranks: tuple[RankProgress, ...]) -> Table:
    table = Table(title="ranks (recent steps)", title_justify="left", expand=False)
    for column in ("rank", "steps", "last step", "step ms", "last ms", "est cost", "GC ms"):
        table.add_column(column, justify="right")
    table.add_column("idle", justify="right")
    for r in ranks:
        table.add_row(
            str(r.rank),
            str(r.num_steps),
            _opt(r.last_step, "{}"),
            _opt(r.step_ms, "{:,.1f}"),
            _opt(r.last_ms, "{:,.1f}"),
            _opt(r.est_cost, "{:.3g}"),
            _opt(r.gc_ms, "{:,.1f}"),
            "closed" if r.closed else ago(r.idle_s),
        )
    return table


def _balance(state: LiveState) -> Text:
    if state.imbalance_before is None and state.imbalance_after is None:
        text = Text("split imbalance: - (the sidecars have no balance fields)")
    else:
        before = _opt(state.imbalance_before, "{:.2f}")
        after = _opt(state.imbalance_after, "{:.2f}")
        text = Text(f"split imbalance (max/mean est. cost): {before} random → {after} used")
    late = state.late_rank
    if late is None:
        text.append("\nlate rank: none in the recent closed windows")
    else:
        cause = late.cause or "unknown"
        text.append("\nlate rank: ")
        text.append(f"rank {late.rank}", style="bold yellow")
        text.append(f" in {late.share:.0%} of recent straggler steps, cause: {cause}")
    return text


def _capture(capture: dict[str, Any]) -> Text:
    if "error" in capture:  # capture.json could not be read
        return Text(f"capture: {capture['error']}", style="yellow")
    first, steps = capture.get("start_step"), capture.get("steps")
    span = f"steps {first}–{first + steps - 1}" if first is not None and steps else "steps ?"
    where = capture.get("window") or "no window yet"
    return Text(f"capture {capture.get('id')}: {span}, {capture.get('state')} ({where})")


def _windows(windows: tuple[WindowEntry, ...], world_size: int | None) -> Table | Text:
    if not windows:
        return Text("windows: none yet")
    table = Table(title="recent windows", title_justify="left", expand=False)
    table.add_column("window")
    table.add_column("steps", justify="right")
    table.add_column("trigger")
    table.add_column("bubble", justify="right")
    table.add_column("ms/step by class")
    table.add_column("straggler")
    for w in windows:
        steps = f"{w.first_step}–{w.last_step}"
        table.add_row(w.wid, steps, w.trigger, *_window_cells(w, world_size))
    return table


def _window_cells(w: WindowEntry, world_size: int | None) -> tuple[str | Text, str, str]:
    """Bubble ratio, classes and straggler of a closed window; what the state means for the
    others (never numbers)."""
    if w.state != "closed" or w.summary is None:
        return Text(w.state, style="italic yellow"), _why_not(w, world_size), ""
    s = w.summary
    classes = sorted(s.classes_ms_per_step.items(), key=lambda kv: -kv[1])
    shown = ", ".join(f"{name} {ms:,.1f}" for name, ms in classes if ms > 0) or "none"
    if s.straggler is None:
        straggler = "none"
    else:
        straggler = f"rank {s.straggler} ({_num(s.straggler_wait_ms_per_step, '{:,.1f}')} ms)"
    return _num(s.bubble_ratio, "{:.1%}"), shown, straggler


def _why_not(w: WindowEntry, world_size: int | None) -> str:
    published = ", ".join(map(str, w.published)) or "none"
    of = "" if world_size is None else f" of {world_size}"
    if w.state == "pending":
        return f"published by ranks {published}{of}"
    if w.state == "missing":
        missed = "; ".join(f"rank {r}: {why}" for r, why in sorted(w.missed.items()))
        return missed or f"published by ranks {published}{of} only"
    return w.error or w.state


def _alerts(state: LiveState) -> Text:
    firing = state.firing
    if not firing:
        return Text(f"alerts: none firing ({len(state.alerts)} rules)", style="green")
    text = Text(f"alerts: {len(firing)} firing", style="bold red")
    for alert in firing:
        text.append(f"\n  {alert.name}", style="bold red")
        text.append(f": {alert.message}")
    return text


def _opt(value: float | None, spec: str) -> str:
    return "-" if value is None else _num(value, spec)


def _num(value: float, spec: str) -> str:
    return spec.format(value) if math.isfinite(value) else "-"
