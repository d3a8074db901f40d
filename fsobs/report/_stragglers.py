"""The stragglers in ``fsobs analyze``: their JSON, their table and their findings.

The findings say who was late and why, each from its own evidence and each once:

1. who: the verdict across steps (``stable``, ``rotating``) when there are enough steps with a
   straggler; otherwise that there are too few, and the collectives speak instead. Every rank
   that caused a large share of the wait is named with its share;
2. why, from the trace: what the late rank's GPU and CPU did while the others waited
   (:mod:`fsobs.analysis.collectives.lateness`), host-bound ranks named with their share;
3. why, from the step sidecars: the input data (:mod:`fsobs.analysis.stragglers.attribution`),
   whether a whale made the step unbalanceable (:mod:`fsobs.analysis.whatif.bounds`), then
   GC and preemption (:mod:`fsobs.analysis.stragglers.causes`). Without sidecars one line
   says what cannot be checked.
"""

from __future__ import annotations

import math
from typing import Any

from rich.table import Table

from fsobs.analysis import Analysis
from fsobs.analysis.stragglers.causes import CAUSES, missing_inputs
from fsobs.analysis.whatif.bounds import run_bounds
from fsobs.report._format import short_list, table
from fsobs.report._json import plain, records
from fsobs.report._whales import whale_findings

_COLUMNS = {
    "rank": "rank",
    "times_last": "steps last",
    "wait_caused_ms": "wait caused (ms)",
    "wait_share": "% of the wait",
    "times_arrived_last": "last at (collectives)",
}
_LATENESS_COLUMNS = {
    "gpu_active_share": "GPU working %",
    "host_bound_share": "host-bound %",
    "idle_share": "idle %",
}
"""What the rank did while the others waited for it, in % of that wait."""


def stragglers_json(analysis: Analysis) -> dict[str, Any]:
    """The ``stragglers`` object of ``fsobs analyze --json``."""
    strag = analysis.stragglers
    return {
        "per_step": records(strag.per_step),
        "per_rank": records(strag.per_rank),
        "verdict": strag.verdict,
        "culprit": strag.culprit,
        "culprits": strag.culprits,
        "host_bound": strag.host_bound,
        "num_waits": strag.num_waits,
        "lateness_shares": {k: plain(v) for k, v in strag.lateness_shares.items()},
        "causes": causes_json(analysis),
    }


def causes_json(analysis: Analysis) -> dict[str, Any]:
    """Why the stragglers were late (:mod:`fsobs.analysis.stragglers.causes`); ``known`` false
    when the sidecars lack a field the split needs, each named in ``missing``."""
    causes = analysis.causes
    if causes is None:
        return {"known": False, "shares": None, "per_step": [], "missing": _missing(analysis)}
    return {
        "known": True,
        "shares": {k: plain(v) for k, v in causes.shares.items()},
        "per_step": records(causes.per_step),
        "missing": [],
    }


def _missing(analysis: Analysis) -> list[str]:
    """The sidecar fields the causes lack
    (:func:`fsobs.analysis.stragglers.causes.missing_inputs`)."""
    gaps = analysis.gaps.sidecar
    return missing_inputs(gaps.comparable if gaps is not None else None)


def attribution_json(analysis: Analysis) -> dict[str, Any] | None:
    attr = analysis.attribution
    if attr is None:
        return None
    return {
        "cost_source": attr.cost_source,
        "rank_correlation": plain(attr.rank_correlation),
        "explained_wait_share": plain(attr.explained_wait_share),
        "verdict": attr.verdict,
        "per_step": records(attr.per_step),
        "steps_without_data": attr.steps_without_data,
    }


def straggler_table(analysis: Analysis) -> list[str | Table]:
    """The ranks that kept others waiting (none when nobody waited)."""
    per_rank = analysis.stragglers.per_rank
    if not (per_rank["times_last"].any() or per_rank["wait_caused_ms"].any()):
        return []
    columns = dict(_COLUMNS)
    if per_rank["gpu_active_share"].notna().any():
        columns |= _LATENESS_COLUMNS
    shares = [c for c in columns if c.endswith("_share")]
    return [table("Stragglers", per_rank.assign(**{c: per_rank[c] * 100 for c in shares}), columns)]


def straggler_findings(analysis: Analysis) -> list[str]:
    """Who the stragglers are, then why they were late (module docstring)."""
    strag = analysis.stragglers
    per_step = strag.per_step
    named = per_step["rank"].notna().sum()
    lines = [*_verdict_findings(analysis), *_culprit_findings(analysis)]
    ties = per_step[per_step["tied_ranks"].map(len) > 0]
    if len(ties):
        lines.append(
            f"{len(ties)} step(s) tie between ranks for the largest wait caused (steps "
            f"{short_list(ties['step'])}): no straggler named for them"
        )
    calm = per_step[per_step["rank"].isna() & (per_step["tied_ranks"].map(len) == 0)]
    if len(calm) and named:
        lines.append(f"{len(calm)} step(s) have no straggler (waits below the threshold)")
    if named or strag.culprits:
        lines += _lateness_findings(analysis)
        lines += _sidecar_findings(analysis)
    return lines


def _verdict_findings(analysis: Analysis) -> list[str]:
    """The verdict across steps; with too few steps, that there is none."""
    strag = analysis.stragglers
    per_step = strag.per_step
    if strag.verdict == "few_steps":
        named = int(per_step["rank"].notna().sum())
        return [
            f"{named} step(s) with a straggler: too few to call one stable or rotating (that "
            f"needs {strag.config.min_steps}), so judged from the {strag.num_waits} "
            "collective(s) at which a rank waited"
        ]
    if strag.culprit is not None:
        row = strag.per_rank.set_index("rank").loc[strag.culprit]
        return [
            f"rank {strag.culprit} is the straggler in {int(row['times_last'])} of "
            f"{len(per_step)} steps ({strag.verdict}); it made the others wait "
            f"{row['wait_caused_ms']:.1f} ms in total ({row['wait_share']:.0%} of the wait)"
        ]
    if per_step["rank"].notna().any():
        counts = per_step["rank"].dropna().astype(int).value_counts()
        top = sorted(counts.index[counts == counts.max()].tolist())
        return [
            f"no single straggler: ranks {top} are each the straggler in {counts.max()} of "
            f"{len(per_step)} steps ({strag.verdict})"
        ]
    return []


def _culprit_findings(analysis: Analysis) -> list[str]:
    """Every rank that caused a large share of the wait, with its share and how often it
    arrived last (but the verdict's rank, said already)."""
    strag = analysis.stragglers
    others = [r for r in strag.culprits if r != strag.culprit]
    if not others:
        return []
    rows = strag.per_rank.set_index("rank")
    share, last = rows["wait_share"], rows["times_arrived_last"]
    first, *rest = others
    parts = [
        f"rank {first} caused {share[first]:.0%} (last at {last[first]} of the "
        f"{strag.num_waits} collectives with a wait)",
        *(f"rank {r} caused {share[r]:.0%} (last at {last[r]} of {strag.num_waits})" for r in rest),
    ]
    lead = "other ranks" if strag.culprit is not None else "ranks"
    return [
        f"{lead} with at least {strag.config.culprit_share:.0%} of the straggler wait: "
        + ", ".join(parts)
    ]


def _lateness_findings(analysis: Analysis) -> list[str]:
    """What the late ranks' GPUs and CPUs did while the others waited (GPU runs only)."""
    strag = analysis.stragglers
    shares = strag.lateness_shares
    if math.isnan(shares.get("gpu_active", math.nan)):
        return []
    rows = strag.per_rank.set_index("rank")
    return [
        "from the trace, while the others waited the late rank's GPU worked "
        f"{shares['gpu_active']:.0%} of the time (more or slower GPU work), idled while its "
        f"CPU thread was busy {shares['host_bound']:.0%} (host-bound), idled with nothing "
        f"recorded on its CPU {shares['idle']:.0%}",
        *(
            f"rank {r} is a host-bound straggler: for {rows.loc[r, 'host_bound_share']:.0%} "
            "of the wait it caused its GPU was idle while its CPU thread was busy"
            for r in strag.host_bound
        ),
    ]


def _sidecar_findings(analysis: Analysis) -> list[str]:
    """What the step sidecars show about the late ranks: their data, then GC and preemption."""
    if analysis.attribution is None:
        return [
            "no step sidecar (steps.rank<R>.jsonl): the late ranks' input data, GC pauses and "
            "CPU time cannot be checked"
        ]
    return [
        *_data_findings(analysis),
        *whale_findings(run_bounds(analysis)),
        _causes_finding(analysis),
    ]


def causes_unknown_line(analysis: Analysis) -> str:
    """Why the causes of the stragglers' lateness are unknown, naming each missing input (the
    report's finding and the dashboard's Stragglers tab say the same)."""
    gaps = analysis.gaps.sidecar
    if gaps is None or gaps.comparable is None or gaps.comparable.empty:
        return "the run has no step sidecars (steps.rank<R>.jsonl: fsobs.collect.RunRecorder)"
    return _missing_line(_missing(analysis) if analysis.causes is None else [])


def _causes_finding(analysis: Analysis) -> str:
    causes = analysis.causes
    if causes is None or not len(causes.per_step):
        missing = causes_unknown_line(analysis)
        if _lateness_findings(analysis):  # the trace told part of it already
            return f"GC pauses and preemption of the late ranks are unknown: {missing}"
        return f"why the stragglers were late is unknown: {missing}"
    shares = causes.shares
    parts = ", ".join(f"{name} {shares[name]:.0%}" for name in CAUSES)
    return f"the straggler wait by the cause of the straggler's lateness: {parts}"


_MISSING_LINES = {
    "est_cost": (
        "no cost model: est_cost is null in the sidecars (RunRecorder(cost_model=...) or "
        "fsobs fit-cost)"
    ),
    "pauses": (
        "the step sidecars have no GC, CPU-time and context-switch fields (runs recorded "
        "with the profiler have them)"
    ),
    "wall_ms": "the step sidecars have no wall times (wall_start_ns, wall_end_ns)",
}
"""What each missing input of the causes is called in the report (GC and CPU time: one line)."""


def _missing_line(missing: list[str]) -> str:
    """Every missing input named (``missing`` from :func:`_missing`); with none, the sidecars
    have the fields but no line for a step's straggler."""
    keys = dict.fromkeys("pauses" if name in ("gc_ms", "cpu_ms") else name for name in missing)
    if not keys:
        return "the step sidecars have no line for the straggler of any step"
    return "; ".join(_MISSING_LINES[key] for key in keys)


def _data_findings(analysis: Analysis) -> list[str]:
    attr = analysis.attribution
    if attr is None:
        return []
    without = attr.steps_without_data
    if attr.verdict == "unknown":
        if not without:
            return []
        return [
            f"whether the input data explains it is unknown: the {len(without)} step(s) with a "
            f"straggler (steps {short_list(without)}) lack some rank's step sidecar line (see "
            "the warnings)"
        ]
    per_step = attr.per_step
    costliest = int(per_step["culprit_has_max_cost"].sum())
    shown = (
        f"the straggler alone had the costliest data in {costliest} of {len(per_step)} steps "
        f"({attr.explained_wait_share:.0%} of the wait), cost vs lateness rank correlation "
        f"{attr.rank_correlation:.2f}"
    )
    tied = int(per_step["max_cost_tied"].sum())
    tie_note = f"; {tied} step(s) had tied largest costs" if tied else ""
    if without:
        tie_note += (
            f"; {len(without)} step(s) with a straggler (steps {short_list(without)}) left out: "
            "some rank has no step sidecar line for them"
        )
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
