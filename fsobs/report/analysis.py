"""``fsobs analyze``: an :class:`~fsobs.analysis.Analysis` for machines (:func:`to_json`) and
for people (:func:`render`: the run, the :func:`findings`, then the per-rank tables)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

import pandas as pd
from rich.console import Console
from rich.table import Table

from fsobs.analysis import Analysis
from fsobs.analysis.collectives.clocks import SHARED_CLOCK_NS, Clock
from fsobs.analysis.locality import comm_locality, intra_share
from fsobs.analysis.pipeline import EMBEDDING_TOTAL, kpis_by_role
from fsobs.analysis.whatif.bounds import run_bounds
from fsobs.report._alltoall import all_to_all_findings, all_to_all_json, all_to_all_tables
from fsobs.report._critical_path import critical_path_json, critical_path_lines
from fsobs.report._format import duration, print_table, short_list, table, time_unit
from fsobs.report._json import plain, records
from fsobs.report._stragglers import (
    attribution_json,
    straggler_findings,
    straggler_table,
    stragglers_json,
)
from fsobs.report._stragglers import (
    causes_unknown_line as causes_unknown_line,  # the dashboard says the same
)
from fsobs.report._whales import bounds_json
from fsobs.report._windows import (
    all_sparse,
    capture_findings,
    hta_flag_lines,
    hta_out_of_range,
    rank_clocks,
    run_clock,
    window_findings,
)

_TEMPORAL_KEYS = (
    "rank",
    "idle_time_us",
    "compute_time_us",
    "non_compute_time_us",
    "kernel_time_us",
    "idle_time_pctg",
    "compute_time_pctg",
    "non_compute_time_pctg",
)


def to_json(analysis: Analysis) -> dict[str, Any]:
    """The ``fsobs analyze --json`` object. Keys keep their names and units across versions."""
    run = analysis.run
    hta = None
    if analysis.hta is not None:
        hta = {
            "temporal_breakdown": records(analysis.hta.temporal_breakdown, _TEMPORAL_KEYS),
            "comm_comp_overlap": records(
                analysis.hta.comm_comp_overlap, ("rank", "comp_comm_overlap_pctg")
            ),
            "idle_time_breakdown": records(analysis.hta.idle_time_breakdown),
            "out_of_range": hta_out_of_range(analysis),
        }
    return {
        "run": {
            "path": str(run.path),
            "world_size": run.world_size,
            "ranks": run.rank_ids,
            "device": run.device,
            "num_steps": len(run.steps),
            "steps": run.steps,
            "step_source": sorted({t.step_source for t in run.ranks.values()}),
            "step_clock": run_clock(analysis),
            "hosts": sorted({t.host_name for t in run.ranks.values() if t.host_name}),
            "simulated": run.meta is not None and run.meta.simulated,
            "warnings": run.warnings,
            "left_out_ranks": {str(r): why for r, why in analysis.gaps.left_out.items()},
        },
        "sidecar": _sidecar_json(analysis),
        "ranks_overview": records(analysis.overview),
        "windows": records(analysis.windows),
        "summary": {k: plain(v) for k, v in analysis.summary.items()},
        "by_role": _by_role_json(analysis),
        "steps": records(analysis.steps),
        "stragglers": stragglers_json(analysis),
        "data_attribution": attribution_json(analysis),
        "split_bound": bounds_json(run_bounds(analysis)),
        "next_step": _next_step_json(analysis),
        "critical_path": critical_path_json(analysis),
        "collectives": {
            "matched_instances": int(analysis.collectives.instances["instance"].nunique()),
            "unmatched": records(analysis.collectives.problems),
            "partial_groups": records(analysis.collectives.partial),
            "clock_offsets_ms": {
                str(r): v / 1e6 for r, v in analysis.collectives.offsets_ns.items()
            },
            "clocks": [
                {
                    "name": c.name,
                    "host": c.host,
                    "ranks": list(c.ranks),
                    "offset_ms": c.offset_ns / 1e6,
                    "spread_ms": c.spread_ns / 1e6,
                    "aligned": c.issue is None,
                    "issue": c.issue,
                }
                for c in analysis.collectives.clocks
            ],
            "all_to_all": all_to_all_json(analysis),
            "locality": _locality_json(analysis),
        },
        "hta": hta,
    }


def _locality_json(analysis: Analysis) -> dict[str, Any]:
    """Per collective class and span (intra-node, inter-node, unknown): instances, rank-ms,
    bytes (:func:`fsobs.analysis.locality.comm_locality`), and the intra-node shares."""
    table = comm_locality(analysis)
    share = intra_share(table)
    return {
        "by_class": records(table),
        "intra_node_share": None if share is None else {"time": share[0], "bytes": plain(share[1])},
    }


def _locality_findings(analysis: Analysis) -> list[str]:
    """How much communication stayed inside a host, on a run of several hosts."""
    hosts = {t.host_name for t in analysis.run.ranks.values() if t.host_name}
    share = intra_share(comm_locality(analysis)) if len(hosts) > 1 else None
    if share is None:
        return []
    of_bytes = "" if math.isnan(share[1]) else f", {share[1]:.0%} of their bytes"
    return [
        f"communication inside a host: {share[0]:.0%} of the collectives' rank-time{of_bytes} "
        f"({len(hosts)} hosts; the rest spans hosts)"
    ]


def _sidecar_json(analysis: Analysis) -> dict[str, Any] | None:
    """Which (rank, step) of the analyzed ones the step sidecars lack, repeat identically or
    contradict (:mod:`fsobs.analysis.partial`); None without sidecars."""
    check = analysis.gaps.sidecar
    if check is None:
        return None
    return {
        "full_steps": check.full_steps,
        "missing_steps": {str(r): s for r, s in check.missing.items()},
        "conflicting_steps": {str(r): s for r, s in check.conflicting.items()},
        "repeated_steps": {str(r): s for r, s in check.repeated.items()},
        "files": {str(r): names for r, names in analysis.gaps.sidecar_files.items()},
    }


def _by_role_json(analysis: Analysis) -> dict[str, Any] | None:
    """Blocked time by the role of the collective; None (unknown) when nothing in the run says
    any collective's role, or no collective was matched across ranks to measure it."""
    colls = analysis.collectives
    if not colls.roles_known or colls.instances.empty:
        return None
    return {
        role: {k: plain(v) for k, v in values.items()}
        for role, values in kpis_by_role(analysis.roles).items()
    }


Item: TypeAlias = str | Table
"""A line (rich markup) or a table of the human report; tables without rows are left out."""
Section: TypeAlias = Callable[[Analysis], list[Item]]

_BUBBLE_COLUMNS = {
    "rank": "rank",
    "window_ms": "window",
    "busy_ms": "busy",
    "bubble_ms": "bubble",
    "straggler_wait_ms": "straggler wait",
    "exposed_comm_ms": "exposed comm",
    "unattributed_comm_ms": "unattributed comm",
    "host_idle_ms": "host idle",
    "other_ms": "other",
    "contention_ms": "contention",
}
_RANK_COLUMNS = {
    "rank": "rank",
    "host": "host",
    "num_events": "events",
    "num_steps": "steps",
    "step_time_ms_mean": "CPU step ms (mean)",
    "window_ms_mean": "window ms (mean)",
    "clock": "window clock",
    "num_comm_events": "comm events",
    "comm_time_ms": "comm ms (sum)",
}
_RANK_TIMES = ("step_time_ms_mean", "window_ms_mean", "comm_time_ms")
_HTA_TEMPORAL_COLUMNS = {
    "rank": "rank",
    "kernel_time_us": "kernel time",
    "compute_time_us": "compute",
    "non_compute_time_us": "non-compute",
    "idle_time_us": "idle",
    "idle_time_pctg": "idle %",
    "comp_comm_overlap_pctg": "comm overlapped %",
}
_HTA_IDLE_COLUMNS = {
    "rank": "rank",
    "stream": "stream",
    "idle_category": "cause",
    "idle_time_us": "idle",
    "idle_time_ratio": "share",
}


def render(analysis: Analysis, console: Console) -> None:
    """Print the human report: the run and its findings, then the per-rank tables
    (:data:`SECTIONS`, in order)."""
    for section in SECTIONS:
        for item in section(analysis):
            if isinstance(item, Table):
                print_table(console, item)
            else:
                console.print(item)


def _run_section(analysis: Analysis) -> list[Item]:
    """The run in one line, its warnings, and the findings."""
    run = analysis.run
    sources = {t.step_source for t in run.ranks.values()}
    steps = (
        "one whole-trace window per rank"
        if analysis.whole_trace
        else f"{len(run.steps)} step(s) on every rank"
        + ("" if sources == {"ProfilerStep"} else f" (steps: {', '.join(sorted(sources))})")
    )
    left_out = len(analysis.gaps.left_out)
    loaded = f"{len(run.ranks) + left_out} rank(s) loaded" + (
        f" ({left_out} left out)" if left_out else ""
    )
    return [
        f"[bold]{run.path}[/]: {run.device.upper()} run, world size {run.world_size}, "
        f"{loaded}, {steps}",
        *(f"[yellow]warning:[/] {warning}" for warning in run.warnings),
        *(f"- {line}" for line in findings(analysis)),
        *(f"[bold]{line}[/]" for line in [next_step_line(analysis)] if line is not None),
    ]


def _unit(analysis: Analysis) -> str:
    """The unit of the report's durations: µs when the step time is µs-scale, else ms."""
    return time_unit(analysis.summary["step_time_ms_p50"])


def _in_unit(frame: pd.DataFrame, columns: tuple[str, ...], unit: str) -> pd.DataFrame:
    """``frame`` with its ms ``columns`` in ``unit``."""
    return frame.assign(**{c: frame[c] * 1e3 for c in columns}) if unit == "µs" else frame


def _bubble_section(analysis: Analysis) -> list[Item]:
    columns = dict(_BUBBLE_COLUMNS)
    if not analysis.steps["unattributed_comm_ms"].any():
        del columns["unattributed_comm_ms"]
    unit = _unit(analysis)
    per_rank = analysis.steps.groupby("rank", as_index=False).mean(numeric_only=True)
    per_rank = _in_unit(per_rank, tuple(c for c in columns if c != "rank"), unit)
    return [table(f"Bubbles per rank (mean {unit} per step)", per_rank, columns)]


EMBEDDING_TOTAL_NOTE = (
    f"{EMBEDDING_TOTAL} = embedding + every pec_* role: the whole embedding communication, what "
    "compares with a plain run's embedding; PEC's mask exchange (pec_mask), which plain "
    "torchrec does not do, counts as its cost (not to be added to the roles)"
)
"""What the reports say under a role table with PEC's roles."""
_ROLE_COLUMNS = {
    "role": "role",
    "straggler_wait_ms_per_step": "straggler wait",
    "exposed_comm_ms_per_step": "exposed comm",
}


def _role_section(analysis: Analysis) -> list[Item]:
    """Blocked time by the role of the collective, for runs with PEC's collectives (whose
    roles tell its overlapped, ahead, mask and gradient all-to-alls apart)."""
    roles = kpis_by_role(analysis.roles)
    if EMBEDDING_TOTAL not in roles:
        return []
    frame = pd.DataFrame([{"role": role, **values} for role, values in roles.items()])
    return [
        table("Communication by role (mean ms per rank and step)", frame, _ROLE_COLUMNS),
        EMBEDDING_TOTAL_NOTE,
    ]


def _rank_section(analysis: Analysis) -> list[Item]:
    """Per rank: its events, its CPU step and window times (the clock of each named), its
    communication; the host column only when a trace names its host."""
    unit = _unit(analysis)
    windows = analysis.windows[["rank", "window_ms_mean"]].assign(
        clock=rank_clocks(analysis).to_numpy()
    )
    ranks = _in_unit(analysis.overview.merge(windows, on="rank", how="left"), _RANK_TIMES, unit)
    columns = {c: h.replace("ms", unit) for c, h in _RANK_COLUMNS.items()}
    if not ranks["host"].astype(bool).any():
        del columns["host"]
    return [table("Ranks", ranks, columns)]


def _hta_section(analysis: Analysis) -> list[Item]:
    hta = analysis.hta
    if hta is None:
        return ["HTA GPU metrics: not applicable (no GPU events in this run)."]
    temporal = hta.temporal_breakdown.merge(hta.comm_comp_overlap, on="rank")
    idle = hta.idle_time_breakdown
    idle = idle[idle["idle_time_us"] != 0]  # the JSON keeps HTA's zero rows
    return [
        table("GPU temporal breakdown (HTA rules, µs)", temporal, _HTA_TEMPORAL_COLUMNS),
        table("GPU idle time by stream (HTA rules, µs)", idle, _HTA_IDLE_COLUMNS),
        *hta_flag_lines(analysis),
    ]


SECTIONS: tuple[Section, ...] = (
    _run_section,
    _bubble_section,
    _role_section,
    straggler_table,
    critical_path_lines,
    all_to_all_tables,
    _rank_section,
    _hta_section,
)
"""The human report of ``fsobs analyze``, top to bottom."""


_CLASS_LABELS = {
    "straggler_wait_ms_per_step": "straggler wait",
    "exposed_comm_ms_per_step": "exposed communication",
    "unattributed_comm_ms_per_step": "unattributed communication",
    "host_idle_ms_per_step": "host idle",
    "other_ms_per_step": "other GPU work",
}
_OTHER_FINDING_SHARE = 0.05


def findings(analysis: Analysis) -> list[str]:
    """The few sentences a reader needs first: size of the bubble, its main class, the culprit,
    and what the data shows about it. Each says only what the analysis showed."""
    summary = analysis.summary
    captured = capture_findings(analysis)  # read first: the numbers below are the capture's
    if analysis.steps.empty:
        return [
            *captured,
            "no step window on every rank: no bubble breakdown",
            *window_findings(analysis),
        ]
    unit = _unit(analysis)
    if all_sparse(analysis):  # no verdict from a few GPU events: only what the windows miss
        return captured + window_findings(analysis) + _coverage_findings(analysis)
    lines = captured + _headline(analysis, unit) + window_findings(analysis)
    lines += _pec_findings(analysis)
    lines += straggler_findings(analysis)
    lines += all_to_all_findings(analysis)
    lines += _locality_findings(analysis)
    lines += _coverage_findings(analysis)
    if summary["contention_ms_per_step"] > 0:
        lines.append(
            "compute overlapped with communication ran "
            f"{duration(summary['contention_ms_per_step'], unit)} per step longer than alone "
            "(contention, not in the bubble)"
        )
    window = analysis.steps["window_ms"].sum()
    other = analysis.steps["other_ms"].sum()
    if window > 0 and other / window > _OTHER_FINDING_SHARE:
        lines.append(
            f"'other' takes {other / window:.1%} of the window (GPU busy with neither compute nor "
            "communication: memcpy, memset, sync): more than the 5% it should be"
        )
    lines += clock_findings(analysis)
    if summary["clock_skew_ms"] > 0:
        lines.append(
            f"estimated clock skew: {summary['clock_skew_ms']:.3f} ms (the largest offset to the "
            "lowest rank's clock, from the collectives' end times)"
        )
    return lines


def clock_findings(analysis: Analysis) -> list[str]:
    """Hosts whose ranks turned out to have several clocks, and clocks that could not be
    aligned (:mod:`fsobs.analysis.collectives.clocks`)."""
    clocks = analysis.collectives.clocks
    lines = []
    by_host: dict[str, list[Clock]] = {}
    for clock in clocks:
        by_host.setdefault(clock.host, []).append(clock)
    for host, mine in by_host.items():
        if len(mine) < 2:
            continue
        ranks = sorted(r for c in mine for r in c.ranks)
        parts = "; ".join(
            f"{c.name}: rank(s) {short_list(c.ranks)}"
            + (f" (offset {c.offset_ns / 1e6:.3f} ms)" if c.offset_ns else "")
            for c in mine
        )
        lines.append(
            f"ranks {short_list(ranks)} report host {host or '(none)'!r} but do not share one "
            f"clock (their collectives end more than {SHARED_CLOCK_NS / 1e6:g} ms apart): "
            f"{len(mine)} clocks, {parts}"
        )
    for clock in clocks:
        if clock.issue is not None:
            lines.append(
                f"the clock of rank(s) {short_list(clock.ranks)} ({clock.name}) cannot be "
                f"aligned: {clock.issue}; its collectives with other clocks give no waits "
                "(their time is unattributed communication)"
            )
    return lines


WHOLE_TRACE_NOTE = (
    "; the window is the whole trace (no ProfilerStep): it spans all the profiler recorded, "
    "its start and stop and the time between iterations included, not one training step"
)
"""Added to the headline of a run timed by whole-trace windows (issue 36, point 5)."""


def _headline(analysis: Analysis, unit: str) -> list[str]:
    """The bubble's share, its size and the step time with its clock, then its main class."""
    summary = analysis.summary
    if math.isnan(summary["bubble_ratio"]):
        return ["every step window has zero length: no bubble breakdown"]
    bubble = summary["bubble_ms_per_step"]
    lines = [
        f"bubbles take {summary['bubble_ratio']:.1%} of step time: {duration(bubble, unit)} per "
        f"rank and step (step time p50 {duration(summary['step_time_ms_p50'], unit)}, by the "
        f"{run_clock(analysis)})" + (WHOLE_TRACE_NOTE if analysis.whole_trace else "")
    ]
    dominant = dominant_class(summary)
    if dominant is not None:
        key, value = dominant
        lines.append(
            f"{_CLASS_LABELS[key]} dominates: {duration(value, unit)} per step "
            f"({value / bubble:.0%} of it)"
        )
    return lines


def dominant_class(summary: dict[str, float]) -> tuple[str, float] | None:
    """The bubble class with the most ms per step: its ``Analysis.summary`` key
    (``straggler_wait_ms_per_step``, ...) and value; None when the run has no bubble."""
    if not summary["bubble_ms_per_step"] > 0:
        return None
    return max(((k, summary[k]) for k in _CLASS_LABELS), key=lambda kv: kv[1])


@dataclass(frozen=True)
class NextStep:
    """The one thing to do about a run's dominant bubble class (:func:`next_step`)."""

    toggle: str | None
    """The optimizer toggle that acts on it (``optim.config.TOGGLES``), None when none does."""
    text: str
    """What to do, in one sentence."""


_NEXT_STEPS = {
    "straggler_wait_ms_per_step": NextStep(
        "balance",
        "balance each global batch's cost across the ranks: the balance toggle "
        "(fsobs run --balance), which what-if predicts by re-splitting the run's batches",
    ),
    "exposed_comm_ms_per_step": NextStep(
        "priority_overlap",
        "hide the embedding communication behind compute and send it ahead of the dense "
        "all-reduce: the priority_overlap toggle (torchrec's PEC, fsobs run --priority-overlap)",
    ),
    "unattributed_comm_ms_per_step": NextStep(
        None,
        "load every rank of each process group, with clocks that align: this communication "
        "could not be matched across ranks, so it cannot be told apart into waits",
    ),
    "host_idle_ms_per_step": NextStep(
        None,
        "feed the device faster: it waits on the host (data loading, collation, kernel "
        "launches); no toggle acts on it: more loader workers, pinned memory, prefetching",
    ),
    "other_ms_per_step": NextStep(
        None,
        "look at the memcpy, memset and synchronize ops among the top ops by self time: GPU "
        "time that is neither compute nor communication",
    ),
}
"""Per bubble class, the toggle that removes it (docs/design.md §7: what what-if replays each toggle
as) or, where no toggle does, where the time goes."""
_SYNC_GC = NextStep(
    "sync_gc",
    "line up the garbage collections across the ranks: the sync_gc toggle (fsobs run "
    "--sync-gc); GC pauses are the largest cause of the straggler's lateness",
)
_EQUAL_WORK = NextStep(
    None,
    "look at the late rank itself: its input data is balanced already, so it is slower on "
    "equal work (its host, its CPU share); balancing the batches will not help",
)


def next_step(analysis: Analysis) -> NextStep | None:
    """What to do about the run's dominant class (:func:`dominant_class`); None without one.

    Straggler wait is the data's to fix (``balance``) unless the sidecars show otherwise: GC
    pauses the largest cause of the straggler's lateness (``sync_gc``, as the README says), or
    the input data balanced already (the late rank is slower on equal work)."""
    dominant = dominant_class(analysis.summary)
    if dominant is None:
        return None
    key = dominant[0]
    if key == "straggler_wait_ms_per_step":
        shares = {} if analysis.causes is None else analysis.causes.shares
        if shares and max(("data", "gc", "preemption"), key=lambda c: shares[c]) == "gc":
            return _SYNC_GC
        if analysis.attribution is not None and analysis.attribution.verdict == "balanced":
            return _EQUAL_WORK
    return _NEXT_STEPS[key]


def applied_already(analysis: Analysis, step: NextStep) -> bool:
    """Whether the run applied the toggle ``step`` names already (its ``run.json`` says the
    toggle acted)."""
    meta = analysis.run.meta
    status = None if meta is None or step.toggle is None else meta.toggles.get(step.toggle)
    return status is not None and status.applied


def next_step_line(analysis: Analysis) -> str | None:
    """The report's last line: what to do about the dominant class (:func:`next_step`), or
    that the run has that toggle on already; None without a dominant class."""
    step = next_step(analysis)
    if step is None:
        return None
    if applied_already(analysis, step):
        return (
            f"next step: {step.text}; this run has {step.toggle} applied already: what is left "
            "is in the findings above and in fsobs whatif's oracle"
        )
    return f"next step: {step.text}"


def _next_step_json(analysis: Analysis) -> dict[str, Any] | None:
    step = next_step(analysis)
    dominant = dominant_class(analysis.summary)
    if step is None or dominant is None:
        return None
    return {
        "dominant_class": dominant[0],
        "toggle": step.toggle,
        "text": step.text,
        "applied_already": applied_already(analysis, step),
    }


def _pec_findings(analysis: Analysis) -> list[str]:
    """PEC's embedding communication in one line (nothing for a run without PEC's ranges)."""
    roles = kpis_by_role(analysis.roles)
    if EMBEDDING_TOTAL not in roles:
        return []
    total, mask = roles[EMBEDDING_TOTAL], roles.get("pec_mask")
    wait, exposed = total["straggler_wait_ms_per_step"], total["exposed_comm_ms_per_step"]
    line = (
        f"with PEC, embedding communication blocks {wait + exposed:.2f} ms per rank and step "
        f"(straggler wait {wait:.2f}, exposed {exposed:.2f}; {EMBEDDING_TOTAL}: embedding and "
        "every pec_* role)"
    )
    if mask is not None:
        spent = mask["straggler_wait_ms_per_step"] + mask["exposed_comm_ms_per_step"]
        line += (
            f", of which {spent:.2f} ms in PEC's mask exchange (pec_mask), a cost plain "
            "torchrec does not have"
        )
    return [line]


def _coverage_findings(analysis: Analysis) -> list[str]:
    lines = []
    run = analysis.run
    partial = analysis.collectives.partial
    for row in partial.itertuples(index=False):
        lines.append(
            f"process group {row.group} misses ranks {short_list(row.missing_ranks)} in this run: "
            f"its {row.num_collectives} collective(s) give no waits (straggler analysis needs "
            "every rank of the group); their time is unattributed communication"
        )
    problems = analysis.collectives.problems
    if len(problems):
        lines.append(f"{len(problems)} collective(s) could not be matched across ranks (see JSON)")
    every = set(run.steps)
    some = set().union(*(set(t.steps) for t in run.ranks.values())) - every
    if some:
        lacking = [(r, sorted(some - set(t.steps))) for r, t in run.ranks.items()]
        lacking = [(r, s) for r, s in lacking if s]
        which = "; ".join(f"rank {r} lacks {short_list(s)}" for r, s in lacking[:8])
        which += " ..." if len(lacking) > 8 else ""
        lines.append(
            f"step(s) {short_list(sorted(some))} are missing on some ranks ({which}): left out "
            "of the analysis"
        )
    return lines
