"""Per-rank reduction: everything the cross-rank analysis needs from one rank, and nothing more.

The analyzer never holds the event tables of all ranks at once. Each rank is parsed and reduced
to a :class:`RankSummary` (its synchronising collectives, the per-step interval sets of
:mod:`fsobs.analysis.bubbles`, its HTA metrics and a few facts), in the parser's worker process
when the run is loaded with :func:`summarize_path`; only the summaries reach the parent. The
collective matching, the waits and the KPIs then work on summaries alone.

The interval sets grow with the rank's events, so they travel pickled, and
:func:`summarize_path` writes each rank's to disk (:mod:`fsobs.analysis.spill`) the moment it
arrives: the parent's memory grows with the number of ranks by their collectives and a few
facts only. The classification reads them back a rank at a time (:meth:`RankSummary.take_parts`).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from fsobs.analysis.bubbles import packing
from fsobs.analysis.bubbles.parts import BubbleConfig, StepParts, step_parts
from fsobs.analysis.collectives.matching import pack_collectives, rank_collectives
from fsobs.analysis.critical_path.chain import Chain, rank_chain
from fsobs.analysis.hta_compat import RankHta, rank_hta
from fsobs.analysis.spill import Spilled, SpillFile
from fsobs.storage import Location
from fsobs.trace.categorical import is_in
from fsobs.trace.classify import GRAPH_CAPTURE_RE
from fsobs.trace.cluster import Progress
from fsobs.trace.loader import LoadConfig, Source, map_run
from fsobs.trace.schema import ProcessGroup, RankTrace, Run


@dataclass
class RankSummary:
    """One rank, reduced. Same identity fields as :class:`~fsobs.trace.RankTrace`."""

    rank: int
    world_size: int
    path: Location
    host_name: str | None
    device: str
    base_time_ns: int | None
    time_format: str
    process_groups: tuple[ProcessGroup, ...]
    steps: list[int]
    step_source: str
    """See :attr:`fsobs.trace.RankTrace.step_source`."""
    overview: dict[str, Any]
    """Row of the per-rank overview table (see :func:`overview_row`)."""
    sync_collectives: bytes
    """:func:`fsobs.analysis.collectives.matching.rank_collectives`, its columns pickled
    (:func:`~fsobs.analysis.collectives.matching.pack_collectives`; the matching opens them)."""
    chain: bytes
    """:func:`fsobs.analysis.critical_path.chain.rank_chain`, pickled (the critical path
    opens them)."""
    parts: bytes | Spilled | None
    """The per-step interval sets (:func:`~fsobs.analysis.bubbles.parts.step_parts`), pickled
    (:func:`fsobs.analysis.bubbles.packing.pack`), or the file they were spilled to
    (:meth:`spill`); None once taken (:meth:`take_parts`)."""
    hta: RankHta | None
    """None on CPU-only ranks."""
    warnings: list[str] = field(default_factory=list)

    def spill(self, to: SpillFile) -> RankSummary:
        """Move the step parts to disk (``to``); returns this summary."""
        if isinstance(self.parts, bytes):
            self.parts = to.put(self.parts)
        return self

    def read_chain(self) -> Chain:
        """The rank's chain (:mod:`fsobs.analysis.critical_path.chain`)."""
        chain: Chain = pickle.loads(self.chain)
        return chain

    def take_parts(self) -> list[StepParts]:
        """Hand the step parts over and drop them here: the analysis classifies each rank once,
        a rank at a time, so the parts of all ranks are never in memory together (and an
        analyzed run, as the dashboard caches it, keeps none)."""
        parts, self.parts = self.parts, None
        if parts is None:
            raise RuntimeError(f"the step parts of rank {self.rank} were taken already")
        data = parts.read() if isinstance(parts, Spilled) else parts
        return packing.unpack(data)


def summarize_rank(trace: RankTrace, config: BubbleConfig | None = None) -> RankSummary:
    """Reduce one rank (see the module docstring)."""
    device = trace.device
    return RankSummary(
        rank=trace.rank,
        world_size=trace.world_size,
        path=trace.path,
        host_name=trace.host_name,
        device=device,
        base_time_ns=trace.base_time_ns,
        time_format=trace.time_format,
        process_groups=trace.process_groups,
        steps=trace.steps,
        step_source=trace.step_source,
        overview=overview_row(trace),
        sync_collectives=pack_collectives(rank_collectives(trace)),
        chain=pickle.dumps(rank_chain(trace, config), pickle.HIGHEST_PROTOCOL),
        parts=packing.pack(step_parts(trace, config)),
        hta=rank_hta(trace) if device == "gpu" else None,
        warnings=list(trace.warnings),
    )


def summarize_run(run: Run[RankTrace], config: BubbleConfig | None = None) -> Run[RankSummary]:
    """Reduce a run already loaded in memory."""
    ranks = {r: summarize_rank(t, config) for r, t in run.ranks.items()}
    return Run(
        path=run.path,
        world_size=run.world_size,
        ranks=ranks,
        meta=run.meta,
        warnings=run.warnings,
        sidecar=run.sidecar,
    )


def summarize_path(
    source: Source,
    load: LoadConfig | None = None,
    config: BubbleConfig | None = None,
    progress: Progress | None = None,
) -> Run[RankSummary]:
    """Load and reduce a run rank by rank, in parallel, never holding all event tables, each
    rank settled as it arrives (:class:`_Arrivals`); ``progress(done, total)`` as ranks are
    parsed (:func:`fsobs.trace.loader.map_run`)."""
    reduce = partial(summarize_rank, config=config)
    return map_run(source, reduce, load, progress, keep=_Arrivals())


class _Arrivals:
    """What :func:`summarize_path` does with each rank's summary the moment it arrives: its step
    parts go to disk (:meth:`RankSummary.spill`), and what ranks have in common is kept once.
    Each rank's process groups list their members: held per rank, a group of N ranks would cost
    N times its member list, N^2 over the run."""

    def __init__(self) -> None:
        self.spill = SpillFile()
        self._groups: dict[ProcessGroup, ProcessGroup] = {}

    def __call__(self, summary: RankSummary) -> RankSummary:
        summary.spill(self.spill)
        summary.process_groups = tuple(
            self._groups.setdefault(pg, pg) for pg in summary.process_groups
        )
        return summary


def overview_row(trace: RankTrace) -> dict[str, Any]:
    """rank, host, device, num_events, num_steps, step_time_ms_mean, num_comm_events,
    comm_time_ms (sum of communication event durations; they may overlap),
    graph_capture_calls (runtime calls that capture a CUDA graph:
    :data:`~fsobs.trace.classify.GRAPH_CAPTURE_RE`)."""
    ev = trace.events
    dur = ev["dur_ns"].to_numpy()
    steps = dur[is_in(ev["kind"], ("step",))]
    comm = dur[is_in(ev["kind"], ("comm",))]
    capture = {n for n in ev["name"].cat.categories if GRAPH_CAPTURE_RE.match(str(n))}
    captures = is_in(ev["kind"], ("runtime",)) & is_in(ev["name"], capture)
    return {
        "rank": trace.rank,
        "host": trace.host_name or "",
        "device": trace.device,
        "num_events": len(ev),
        "num_steps": len(steps),
        "step_time_ms_mean": steps.mean() / 1e6 if len(steps) else float("nan"),
        "num_comm_events": len(comm),
        "comm_time_ms": comm.sum() / 1e6,
        "graph_capture_calls": int(captures.sum()),
    }
