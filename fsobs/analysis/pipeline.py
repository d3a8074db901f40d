"""The entry points that run every analysis: on a path (streaming) or on a loaded run."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fsobs.analysis.bubbles.classify import RankWaits, classify
from fsobs.analysis.bubbles.coverage import WINDOW_COLUMNS, window_row
from fsobs.analysis.bubbles.parts import BUBBLE_CLASSES, BubbleConfig
from fsobs.analysis.bubbles.store import BubbleStore
from fsobs.analysis.bubbles.tables import StepTables, run_roles, step_times
from fsobs.analysis.bubbles.windows import Windows
from fsobs.analysis.collectives.matching import Collectives, match_collectives
from fsobs.analysis.critical_path.path import CriticalPath, critical_path
from fsobs.analysis.hta_compat import HtaMetrics, combine_hta
from fsobs.analysis.partial import (
    Gaps,
    check_sidecar,
    left_out_ranks,
    several_sidecar_files,
    without_ranks,
)
from fsobs.analysis.stragglers.attribution import Attribution, attribute
from fsobs.analysis.stragglers.causes import Causes, straggler_causes
from fsobs.analysis.stragglers.identify import Stragglers, find_stragglers
from fsobs.analysis.summary import RankSummary, summarize_path, summarize_run
from fsobs.trace.cluster import Progress
from fsobs.trace.loader import LoadConfig, Source
from fsobs.trace.schema import RankTrace, Run
from optim.markers import PEC_ROLES, ROLES

EMBEDDING_TOTAL = "embedding_total"
"""The :func:`kpis_by_role` entry of a run with PEC's roles: their sum with ``embedding``."""


@dataclass
class Analysis:
    """Everything fsobs computes for a run."""

    run: Run[RankSummary]
    """The run as analyzed, each rank reduced to what the analysis needs: without the ranks
    left out (:attr:`gaps`), its sidecar resolved to one row per (rank, step)
    (:func:`fsobs.analysis.partial.check_sidecar`), the gaps' lines added to its warnings."""
    overview: pd.DataFrame
    """Per-rank facts of every loaded rank (left out or not), see
    :func:`fsobs.analysis.summary.overview_row`."""
    collectives: Collectives
    """Collectives matched across ranks, clock offsets, unmatched instances."""
    bubbles: BubbleStore
    """Interval sets of every bubble class per rank and step (for export and timelines), read
    from disk a rank at a time."""
    steps: pd.DataFrame
    """Per rank and step, ms: see :func:`fsobs.analysis.bubbles.tables.bubble_table`."""
    caused: pd.DataFrame
    """Who waited for whom: see :func:`fsobs.analysis.bubbles.tables.caused_table`."""
    stragglers: Stragglers
    attribution: Attribution | None
    """How much of the straggler wait the input data explains; None without step sidecars."""
    causes: Causes | None
    """Why each straggler was late (data, GC, preemption); None without the sidecar fields."""
    summary: dict[str, float]
    """The KPIs, see :func:`kpis`."""
    roles: pd.DataFrame
    """Per rank, step and role, ms: see :func:`fsobs.analysis.bubbles.tables.role_table`."""
    hta: HtaMetrics | None
    """None for CPU-only runs, where HTA's GPU metrics do not apply."""
    windows: pd.DataFrame
    """Per rank: what times its windows, and the GPU work they count without a launch or
    leave out; see :mod:`fsobs.analysis.bubbles.coverage`."""
    gaps: Gaps = field(default_factory=Gaps)
    """What the run lacks, rank by rank, and what was left out for it."""
    critical_path: CriticalPath = field(default_factory=CriticalPath)
    """Each step's critical path across ranks and its root rank
    (:mod:`fsobs.analysis.critical_path`)."""

    @property
    def whole_trace(self) -> bool:
        """Whether each rank's one window is its whole trace (no ProfilerStep, no step marker):
        the profiler's own start and stop are in it."""
        return {t.step_source for t in self.run.ranks.values()} == {"whole trace"}


def analyze_path(
    source: Source,
    load: LoadConfig | None = None,
    config: BubbleConfig | None = None,
    progress: Progress | None = None,
) -> Analysis:
    """Analyze a run directory or trace files, rank by rank (memory: the summaries only);
    ``progress(done, total)`` is told as ranks are parsed."""
    return analyze_summary(summarize_path(source, load, config, progress))


def analyze(run: Run[RankTrace], config: BubbleConfig | None = None) -> Analysis:
    """Analyze a run already loaded with :func:`fsobs.load_run`."""
    return analyze_summary(summarize_run(run, config))


def analyze_summary(run: Run[RankSummary]) -> Analysis:
    """Collectives, bubbles per rank and step, stragglers, attribution, KPIs and HTA metrics.

    Analyzes ``run`` once: the summaries hand their step parts over to the classification
    (:meth:`RankSummary.take_parts`), a rank at a time. Ranks and sidecar lines that cannot be
    used are left out first, each said in a warning (:mod:`fsobs.analysis.partial`)."""
    overview = pd.DataFrame([run[r].overview for r in run.rank_ids])
    run, gaps = _usable(run)
    colls = match_collectives(run)
    bubbles, steps, roles, caused, windows, spans = _classify_ranks(run, colls)
    stragglers = find_stragglers(caused, step_times(steps), colls.lateness, run.rank_ids)
    comparable = gaps.sidecar.comparable if gaps.sidecar is not None else None
    hta = {r: s.hta for r, s in run.ranks.items() if s.hta is not None}
    causes = straggler_causes(steps, comparable, stragglers)
    chains = {r: s.read_chain() for r, s in run.ranks.items()}
    return Analysis(
        run=run,
        overview=overview,
        collectives=colls,
        bubbles=bubbles,
        steps=steps,
        caused=caused,
        stragglers=stragglers,
        attribution=(attribute(comparable, stragglers, colls) if comparable is not None else None),
        causes=causes,
        summary=kpis(steps, colls),
        roles=roles,
        hta=combine_hta(hta) if hta else None,
        windows=windows,
        gaps=gaps,
        critical_path=critical_path(chains, colls, spans, steps, causes),
    )


def _usable(run: Run[RankSummary]) -> tuple[Run[RankSummary], Gaps]:
    """The run without the ranks that cannot be analyzed, its sidecar resolved, and what it
    lacks (:mod:`fsobs.analysis.partial`)."""
    gaps = Gaps(left_out=left_out_ranks(run))
    run = without_ranks(run, gaps.left_out)
    if run.sidecar is not None and not run.sidecar.empty:
        gaps.sidecar = check_sidecar(run.sidecar, run.rank_ids, run.steps)
        if gaps.sidecar.repeated or gaps.sidecar.conflicting:
            gaps.sidecar_files = several_sidecar_files(run.path)
        run.sidecar = gaps.sidecar.frame
    run.warnings.extend(gaps.lines)
    return run, gaps


def _classify_ranks(
    run: Run[RankSummary], colls: Collectives
) -> tuple[BubbleStore, pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame, dict[int, Windows]]:
    """Classify the steps common to all ranks (``run.steps``), a rank at a time: the class
    interval sets go to a :class:`BubbleStore`, and only the numbers of the per-step tables
    stay in memory (:class:`~fsobs.analysis.bubbles.StepTables`), with each rank's row of the
    window table (:func:`~fsobs.analysis.bubbles.coverage.window_row`) and its step windows."""
    wanted = set(run.steps)
    waits = RankWaits.of_ranks(colls, run.rank_ids)
    store, tables = BubbleStore(), StepTables(role_names=run_roles(colls.instances))
    windows, spans = [], {}
    for rank, summary in run.ranks.items():
        parts = summary.take_parts()
        windows.append(window_row(rank, summary.device, parts, run.steps))
        classes = classify([p for p in parts if p.step in wanted], waits[rank])
        tables.add(classes)
        store.put(rank, classes)
        spans[rank] = {sb.step: sb.window for sb in classes}
    frame = pd.DataFrame(windows, columns=list(WINDOW_COLUMNS))
    return store, *tables.frames(), frame, spans


def kpis(steps: pd.DataFrame, colls: Collectives) -> dict[str, float]:
    """KPIs over all ranks and steps.

    ``bubble_ratio = Σ bubble / Σ window``; ``*_ms_per_step`` are means over (rank, step);
    the step time of a step is its longest window over the ranks, and its p50/p90 are over steps.
    """
    keys = ("bubble", *BUBBLE_CLASSES, "contention")
    if steps.empty:
        nan = float("nan")
        empty = {f"{k}_ms_per_step": nan for k in keys}
        return {
            "bubble_ratio": nan,
            **empty,
            "step_time_ms_p50": nan,
            "step_time_ms_p90": nan,
            "clock_skew_ms": colls.skew_ms,
        }
    step_time = step_times(steps).to_numpy()
    window = steps["window_ms"].sum()
    return {
        "bubble_ratio": float(steps["bubble_ms"].sum() / window) if window > 0 else float("nan"),
        **{f"{k}_ms_per_step": float(steps[f"{k}_ms"].mean()) for k in keys},
        "step_time_ms_p50": float(np.percentile(step_time, 50)),
        "step_time_ms_p90": float(np.percentile(step_time, 90)),
        "clock_skew_ms": colls.skew_ms,
    }


def kpis_by_role(roles: pd.DataFrame) -> dict[str, dict[str, float]]:
    """``{role: {straggler_wait_ms_per_step, exposed_comm_ms_per_step}}``: means over ranks and
    steps, like the KPIs (so the roles add up to the class KPIs, less unmatched collectives).

    Every run has :data:`~optim.markers.ROLES`; a run with PEC's collectives also has their
    roles (:data:`~optim.markers.PEC_ROLES`, those it has) and :data:`EMBEDDING_TOTAL`, not a
    role but the sum of ``embedding`` and PEC's roles: the whole embedding communication, the
    mask exchange (``pec_mask``, which plain torchrec does not do) counted as PEC's cost. It is
    what compares with a plain run's ``embedding`` (don't add it to the roles)."""
    columns = ["straggler_wait_ms", "exposed_comm_ms"]
    present = set(roles["role"].astype(str))
    pec = [role for role in PEC_ROLES if role in present]
    means = roles.groupby("role")[columns].mean().reindex([*ROLES, *pec])
    if pec:
        means.loc[EMBEDDING_TOTAL] = means.loc[["embedding", *pec]].sum()
    return {
        str(role): {f"{str(c).removesuffix('_ms')}_ms_per_step": float(v) for c, v in row.items()}
        for role, row in means.iterrows()
    }
