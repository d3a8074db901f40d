"""Render an :class:`~fsobs.analysis.Analysis` for machines (JSON) and for people (tables)."""

from __future__ import annotations

from typing import Any, cast

import pandas as pd
from rich.console import Console
from rich.table import Table

from fsobs.analysis import Analysis
from fsobs.analysis._json import plain
from fsobs.analysis.analyze import by_role
from fsobs.analysis.causes import CAUSES

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
            "temporal_breakdown": _records(analysis.hta.temporal_breakdown, _TEMPORAL_KEYS),
            "comm_comp_overlap": _records(
                analysis.hta.comm_comp_overlap, ("rank", "comp_comm_overlap_pctg")
            ),
            "idle_time_breakdown": _records(analysis.hta.idle_time_breakdown),
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
            "hosts": sorted({t.host_name for t in run.ranks.values() if t.host_name}),
            "simulated": bool(run.meta.get("simulated", False)) if run.meta else False,
            "warnings": run.warnings,
        },
        "ranks_overview": _records(analysis.overview),
        "summary": {k: plain(v) for k, v in analysis.summary.items()},
        "by_role": {
            role: {k: plain(v) for k, v in values.items()}
            for role, values in by_role(analysis.roles).items()
        },
        "steps": _records(analysis.steps),
        "stragglers": {
            "per_step": _records(analysis.stragglers.per_step),
            "per_rank": _records(analysis.stragglers.per_rank),
            "verdict": analysis.stragglers.verdict,
            "culprit": analysis.stragglers.culprit,
            "causes": _causes_json(analysis),
        },
        "data_attribution": _attribution_json(analysis),
        "collectives": {
            "matched_instances": int(analysis.collectives.instances["instance"].nunique()),
            "unmatched": _records(analysis.collectives.problems),
            "partial_groups": _records(analysis.collectives.partial),
            "clock_offsets_ms": {
                str(r): v / 1e6 for r, v in analysis.collectives.offsets_ns.items()
            },
        },
        "hta": hta,
    }


def _causes_json(analysis: Analysis) -> dict[str, Any]:
    """Why the stragglers were late (:mod:`fsobs.analysis.causes`); ``known`` false when the
    sidecars lack the pause fields."""
    causes = analysis.causes
    if causes is None:
        return {"known": False, "shares": None, "per_step": []}
    return {
        "known": True,
        "shares": {k: plain(v) for k, v in causes.shares.items()},
        "per_step": _records(causes.per_step),
    }


def _attribution_json(analysis: Analysis) -> dict[str, Any] | None:
    attr = analysis.attribution
    if attr is None:
        return None
    return {
        "cost_source": attr.cost_source,
        "rank_correlation": plain(attr.rank_correlation),
        "explained_wait_share": plain(attr.explained_wait_share),
        "verdict": attr.verdict,
        "per_step": _records(attr.per_step),
    }


def _records(frame: pd.DataFrame, columns: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    frame = frame[list(columns)] if columns else frame
    rows = cast("list[dict[str, Any]]", frame.to_dict("records"))  # the columns are names
    return [{k: plain(v) for k, v in row.items()} for row in rows]


def render(analysis: Analysis, console: Console) -> None:
    """Print the human report: the run, then the per-rank tables."""
    run = analysis.run
    sources = {t.step_source for t in run.ranks.values()}
    steps = (
        "one whole-trace window per rank"
        if sources == {"whole trace"}
        else f"{len(run.steps)} step(s) on every rank"
        + ("" if sources == {"ProfilerStep"} else f" (steps: {', '.join(sorted(sources))})")
    )
    console.print(
        f"[bold]{run.path}[/]: {run.device.upper()} run, world size {run.world_size}, "
        f"{len(run.ranks)} rank(s) loaded, {steps}"
    )
    for warning in run.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    for line in findings(analysis):
        console.print(f"- {line}")
    columns = {
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
    if not analysis.steps["unattributed_comm_ms"].any():
        del columns["unattributed_comm_ms"]
    _print(
        console,
        _table(
            "Bubbles per rank (mean ms per step)",
            analysis.steps.groupby("rank", as_index=False).mean(numeric_only=True),
            columns,
        ),
    )
    if analysis.stragglers.per_rank["times_last"].any():
        _print(
            console,
            _table(
                "Stragglers",
                analysis.stragglers.per_rank,
                {"rank": "rank", "times_last": "steps last", "wait_caused_ms": "wait caused (ms)"},
            ),
        )
    _print(
        console,
        _table(
            "Ranks",
            analysis.overview,
            {
                "rank": "rank",
                "host": "host",
                "num_events": "events",
                "num_steps": "steps",
                "step_time_ms_mean": "step ms (mean)",
                "num_comm_events": "comm events",
                "comm_time_ms": "comm ms (sum)",
            },
        ),
    )
    if analysis.hta is None:
        console.print("HTA GPU metrics: not applicable (no GPU events in this run).")
        return
    _print(
        console,
        _table(
            "GPU temporal breakdown (HTA rules, µs)",
            analysis.hta.temporal_breakdown.merge(analysis.hta.comm_comp_overlap, on="rank"),
            {
                "rank": "rank",
                "kernel_time_us": "kernel time",
                "compute_time_us": "compute",
                "non_compute_time_us": "non-compute",
                "idle_time_us": "idle",
                "idle_time_pctg": "idle %",
                "comp_comm_overlap_pctg": "comm overlapped %",
            },
        ),
    )
    _print(
        console,
        _table(
            "GPU idle time by stream (HTA rules, µs)",
            analysis.hta.idle_time_breakdown,
            {
                "rank": "rank",
                "stream": "stream",
                "idle_category": "cause",
                "idle_time_us": "idle",
                "idle_time_ratio": "share",
            },
        ),
    )


def _print(console: Console, table: Table) -> None:
    """Print a table only when it has rows."""
    if table.row_count:
        console.print(table)


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
    if analysis.steps.empty:
        return ["no step window on every rank: no bubble breakdown"]
    bubble = summary["bubble_ms_per_step"]
    lines = [
        f"bubbles take {summary['bubble_ratio']:.1%} of step time: {bubble:.2f} ms per rank "
        f"and step (step time p50 {summary['step_time_ms_p50']:.2f} ms)"
    ]
    key, value = max(((k, summary[k]) for k in _CLASS_LABELS), key=lambda kv: kv[1])
    if bubble > 0:
        lines.append(
            f"{_CLASS_LABELS[key]} dominates: {value:.2f} ms per step ({value / bubble:.0%} of it)"
        )
    lines += _straggler_findings(analysis)
    lines += _coverage_findings(analysis)
    if summary["contention_ms_per_step"] > 0:
        lines.append(
            f"compute overlapped with communication ran {summary['contention_ms_per_step']:.2f} "
            "ms per step longer than alone (contention, not in the bubble)"
        )
    window = analysis.steps["window_ms"].sum()
    other = analysis.steps["other_ms"].sum()
    if window > 0 and other / window > _OTHER_FINDING_SHARE:
        lines.append(
            f"'other' takes {other / window:.1%} of the window (GPU busy with neither compute nor "
            "communication: memcpy, memset, sync): more than the 5% it should be"
        )
    if summary["clock_skew_ms"] > 0:
        lines.append(f"estimated clock skew between hosts: {summary['clock_skew_ms']:.3f} ms")
    return lines


def _straggler_findings(analysis: Analysis) -> list[str]:
    strag = analysis.stragglers
    per_step = strag.per_step
    named = per_step["rank"].notna().sum()
    lines = []
    if strag.culprit is not None:
        row = strag.per_rank.set_index("rank").loc[strag.culprit]
        lines.append(
            f"rank {strag.culprit} is the straggler in {int(row['times_last'])} of "
            f"{len(per_step)} steps ({strag.verdict}); it made the others wait "
            f"{row['wait_caused_ms']:.1f} ms in total"
        )
    elif named:
        counts = per_step["rank"].dropna().astype(int).value_counts()
        top = sorted(counts.index[counts == counts.max()].tolist())
        lines.append(
            f"no single straggler: ranks {top} are each the straggler in {counts.max()} of "
            f"{len(per_step)} steps ({strag.verdict})"
        )
    ties = per_step[per_step["tied_ranks"].map(len) > 0]
    if len(ties):
        lines.append(
            f"{len(ties)} step(s) tie between ranks for the largest wait caused (steps "
            f"{_list(ties['step'])}): no straggler named for them"
        )
    calm = per_step[per_step["rank"].isna() & (per_step["tied_ranks"].map(len) == 0)]
    if len(calm) and named:
        lines.append(f"{len(calm)} step(s) have no straggler (waits below the threshold)")
    lines += _data_findings(analysis, bool(named))
    if named:
        lines.append(_causes_finding(analysis))
    return lines


def _causes_finding(analysis: Analysis) -> str:
    causes = analysis.causes
    if causes is None or not len(causes.per_step):
        return (
            "why the stragglers were late is unknown: the step sidecars have no GC, CPU-time "
            "and context-switch fields (runs recorded with the profiler have them)"
        )
    shares = causes.shares
    parts = ", ".join(f"{name} {shares[name]:.0%}" for name in CAUSES)
    return f"the straggler wait by the cause of the straggler's lateness: {parts}"


def _data_findings(analysis: Analysis, has_straggler: bool) -> list[str]:
    attr = analysis.attribution
    if attr is None:
        if has_straggler:
            return ["no step sidecar (steps.rank<R>.jsonl): the input data cannot be checked"]
        return []
    if attr.verdict == "unknown":
        return []
    per_step = attr.per_step
    costliest = int(per_step["culprit_has_max_cost"].sum())
    shown = (
        f"the straggler alone had the costliest data in {costliest} of {len(per_step)} steps "
        f"({attr.explained_wait_share:.0%} of the wait), cost vs lateness rank correlation "
        f"{attr.rank_correlation:.2f}"
    )
    tied = int(per_step["max_cost_tied"].sum())
    tie_note = f"; {tied} step(s) had tied largest costs" if tied else ""
    if attr.verdict == "explains":
        return [
            f"the input data explains it: {shown}, "
            f"{per_step['cost_ratio'].mean():.2f}x the mean cost{tie_note}"
        ]
    if attr.verdict == "balanced":
        return [
            f"the input data is balanced (rank costs within {attr.median_cost_spread:.1%} of "
            "each other, median over steps), so it does not explain the wait: the late rank "
            f"was slower on equal work ({shown}){tie_note}"
        ]
    return [f"the input data does not explain it: {shown}{tie_note}"]


def _coverage_findings(analysis: Analysis) -> list[str]:
    lines = []
    run = analysis.run
    partial = analysis.collectives.partial
    for row in partial.itertuples(index=False):
        lines.append(
            f"process group {row.group} misses ranks {_list(row.missing_ranks)} in this run: its "
            f"{row.num_collectives} collective(s) give no waits (straggler analysis needs every "
            "rank of the group); their time is unattributed communication"
        )
    problems = analysis.collectives.problems
    if len(problems):
        lines.append(f"{len(problems)} collective(s) could not be matched across ranks (see JSON)")
    every = set(run.steps)
    some = sorted(set().union(*(set(t.steps) for t in run.ranks.values())) - every)
    if some:
        lines.append(f"step(s) {_list(some)} are missing on some ranks: left out of the analysis")
    return lines


def _list(values: object) -> str:
    # any iterable: a column, a list, a pandas row's field (typed as any scalar by pandas-stubs)
    items = [str(v) for v in values]  # type: ignore[attr-defined]
    return ", ".join(items[:8]) + (" ..." if len(items) > 8 else "")


def _table(title: str, frame: pd.DataFrame, columns: dict[str, str]) -> Table:
    table = Table(title=title, title_justify="left")
    for header in columns.values():
        table.add_column(header, justify="right")
    for row in frame.to_dict("records"):
        table.add_row(*(_cell(row[c]) for c in columns))
    return table


def _cell(value: Any) -> str:
    value = plain(value)
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    return str(value)


def toggles_line(toggles: dict[str, Any]) -> str:
    """``balance on, priority_overlap off, sm_free requested, not applied (why)``."""
    if not toggles:
        return "not recorded (no run.json, or no toggles in it)"
    parts = []
    for name, t in toggles.items():
        if not t.get("requested"):
            parts.append(f"{name} off")
        elif t.get("applied"):
            parts.append(f"{name} on" + (f" ({t['reason']})" if t.get("reason") else ""))
        else:
            parts.append(f"{name} requested, not applied ({t.get('reason')})")
    return "; ".join(parts)
