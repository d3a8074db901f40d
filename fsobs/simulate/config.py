"""What the N-rank simulator plays: the job's shape, its noise and its communication model
(no torch). ``SimConfig()`` is a GPU-like sequence-recommendation job; :func:`calibrate`
derives one from a measured run (cost model, noise, lengths, transfer times)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from fsobs.errors import RunError
from fsobs.runformat.windows import WindowSchedule
from fsobs.workload.lengths import PRESETS
from optim.balance import CostModel
from optim.config import TOGGLES
from optim.markers import EMBEDDING_ROLES
from optim.plan import BalanceConfig

if TYPE_CHECKING:
    from fsobs.analysis.pipeline import Analysis
    from fsobs.analysis.whatif.replay import SegmentGraph

SIM_TOGGLES = tuple(t for t in TOGGLES if t != "sync_gc")
"""The toggles the simulator plays as policies: optim's, less ``sync_gc`` (no Python garbage
collector is simulated; a GC pause is a degradation). The what-if predicts the same ones
(:data:`fsobs.analysis.whatif.predict.TOGGLES`). The analysis it needs to calibrate is imported
there, so that the flags made from :class:`SimConfig` (``fsobs simulate``) cost no analysis."""


@dataclass(kw_only=True, frozen=True)
class SimConfig:
    """A simulated job (times in ns). Defaults: a GPU-like HSTU job (BENCHMARKS.md states every
    assumption); :func:`calibrate` makes one from a measured run."""

    world_size: int = 8
    """Ranks simulated."""
    steps: int = 20
    """Steps simulated (one global batch each)."""
    seed: int = 0
    """Seed of the lengths, the noise and the split."""
    batch_per_rank: int = 32
    length_median: float = 1024.0
    """Lognormal lengths (the ``lognormal`` preset's shape, KuaiRand-1K's mean/median)..."""
    length_sigma: float = PRESETS["lognormal"].params["sigma"]
    length_cap: int = 16_384
    lengths: tuple[int, ...] = ()
    """...unless given: then drawn from these (a measured run's, with replacement)."""
    cost: CostModel = field(default_factory=lambda: CostModel(c0=20_000.0, a=1_000.0, b=0.5))
    """Busy ns per sample of the data-dependent compute (embedding lookup + dense fwd/bwd)."""
    partition: CostModel | None = None
    """The balancer's model (default: ``cost``)."""
    balance: BalanceConfig = field(default_factory=BalanceConfig)
    """The ``balance`` policy's partitioner, counts and window, played when ``balance`` is
    among the toggles simulated (they decide, not its ``enabled``: :meth:`balance_config`)."""
    embedding_share: float = 0.15
    """Share of that compute before the embedding output all-to-all (the lookup)."""
    speed_sigma: float = 0.01
    """Per-rank speed: lognormal, fixed over the steps."""
    noise_sigma: float = 0.02
    """Per rank and step: lognormal factor on its compute."""
    step_sigma: float = 0.0
    """Per step, common to every rank (the machine's pace)."""
    host_idle_ns: float = 500_000.0
    """Data loading before each step (GPU idle), lognormal with ``host_sigma``."""
    host_sigma: float = 0.3
    launch_gap_ns: int = 10_000
    """GPU idle between a collective's end and the next kernel."""
    memcpy_ns: int = 200_000
    """Input copy at each step's start (GPU busy with neither compute nor communication)."""
    chunk_ns: int = 100_000
    """Fixed kernels: the dense prologue under the input-dist prefetch, and the update."""
    update_chunks: int = 20
    """The embedding update after the backward all-to-all: this many ``chunk_ns`` kernels."""
    optimizer_ns: int = 1_000_000
    gamma: float = 1.3
    """Slowdown of a kernel that overlaps SM-based communication (Echo: 1.14-1.61)."""
    a2a_ns_per_token: float = 10.0
    """Embedding all-to-all: ns per token of the busiest rank, at (N-1)/N -> 1."""
    ids_ns_per_token: float = 1.0
    """Input dist (ids) all-to-all, the same way."""
    a2a_latency_ns: float = 20_000.0
    """Per log2(N)."""
    allreduce_ns: float = 5_000_000.0
    """Dense all-reduce, bandwidth part at (N-1)/N -> 1 (ring: 2 (N-1)/N · bytes / bw)."""
    allreduce_latency_ns: float = 30_000.0
    """Per log2(N)."""
    ranks_per_host: int = 8
    id_overlap: float = 0.75
    """Share of a batch's ID occurrences that the previous batch had (PEC's overlapped share;
    the reference job's Zipf-1.1 IDs: 0.72-0.77); :func:`calibrate` takes a run's own."""
    source: str = "default: GPU-like job (no calibration)"
    slow_rank: int | None = None
    """A rank whose compute runs slow_factor times longer from step slow_from on (a slower
    node; default: none).

    It gets the same data as without the degradation."""
    slow_from: int = 0
    """The step the slow rank slows from."""
    slow_factor: float = 1.0
    """The slow rank's compute times this factor."""
    shift_from: int | None = None
    """A data shift from this step on: longer samples (default: none).

    The samples given to ``shift_rank`` (every rank when None) are ``shift_factor`` times
    longer after the split, so their estimated cost (the sidecar's ``est_cost``) grows with
    them."""
    shift_rank: int | None = None
    """The rank whose samples grow in the data shift (default: every rank)."""
    shift_factor: float = 1.0
    """The shifted samples' lengths times this factor."""
    gc_rank: int | None = None
    """A rank with a GC pause of gc_ms in every step from gc_from on (default: none).

    The pause is host time before its embedding lookup (the GPU idles), and the sidecar's
    ``gc_count``/``gc_ms``."""
    gc_from: int = 0
    """The step the GC pauses start from."""
    gc_ms: float = 0.0
    """The GC pause per step, in ms."""

    def __post_init__(self) -> None:
        for name in ("world_size", "steps", "batch_per_rank", "ranks_per_host", "update_chunks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.world_size < 2:
            raise ValueError(f"world_size: must be >= 2, got {self.world_size}")
        if not 0 <= self.embedding_share < 1:
            raise ValueError(f"embedding_share: must be in [0, 1), got {self.embedding_share}")
        if not 0 <= self.id_overlap <= 1:
            raise ValueError(f"id_overlap: must be in [0, 1], got {self.id_overlap}")
        if self.gamma < 1:
            raise ValueError(f"gamma: must be >= 1, got {self.gamma}")
        self._check_degradation()

    def _check_degradation(self) -> None:
        """Each degradation's rank within the world, its step within the run, factors > 0."""
        for name in ("slow_rank", "shift_rank", "gc_rank"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.world_size:
                raise ValueError(f"{name}: must be a rank in [0, {self.world_size}), got {value}")
        for name in ("slow_from", "shift_from", "gc_from"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.steps:
                raise ValueError(f"{name}: must be a step in [0, {self.steps}), got {value}")
        for name, given in (("slow_factor", "slow_rank"), ("shift_factor", "shift_from")):
            value = getattr(self, name)
            if not value > 0 or (getattr(self, given) is not None and value == 1):
                raise ValueError(f"{name}: must be > 0 and not 1 with {given}, got {value}")
        if not self.gc_ms >= 0 or (self.gc_rank is not None and self.gc_ms == 0):
            raise ValueError(f"gc_ms: must be > 0 with gc_rank (>= 0 without), got {self.gc_ms}")
        unused = (
            ("slow_from", "slow_rank", self.slow_rank is None and self.slow_from != 0),
            ("slow_factor", "slow_rank", self.slow_rank is None and self.slow_factor != 1.0),
            ("shift_rank", "shift_from", self.shift_from is None and self.shift_rank is not None),
            ("shift_factor", "shift_from", self.shift_from is None and self.shift_factor != 1.0),
            ("gc_from", "gc_rank", self.gc_rank is None and self.gc_from != 0),
            ("gc_ms", "gc_rank", self.gc_rank is None and self.gc_ms != 0.0),
        )
        for name, needs, ignored in unused:
            if ignored:
                raise ValueError(f"{name}: needs {needs}")

    def degradation(self) -> dict[str, Any]:
        """What degrades and from which step (``truth.json``'s ``degradation``): ``slow``,
        ``shift`` and ``gc``, each null when the run has none."""
        slow = shift = gc = None
        if self.slow_rank is not None:
            slow = {"rank": self.slow_rank, "from_step": self.slow_from, "factor": self.slow_factor}
        if self.shift_from is not None:
            shift = {
                "rank": self.shift_rank,
                "from_step": self.shift_from,
                "factor": self.shift_factor,
            }
        if self.gc_rank is not None:
            gc = {"rank": self.gc_rank, "from_step": self.gc_from, "gc_ms": self.gc_ms}
        return {"slow": slow, "shift": shift, "gc": gc}

    def balance_config(self, *, enabled: bool) -> BalanceConfig:
        """The ``balance`` toggle's config, on or off (:attr:`balance` with ``enabled``)."""
        return replace(self.balance, enabled=enabled)

    def draw_lengths(self, rng: np.random.Generator, size: int) -> np.ndarray:
        if self.lengths:
            pool = np.asarray(self.lengths, np.int64)
            return pool[rng.integers(len(pool), size=size)]
        raw = rng.lognormal(math.log(self.length_median), self.length_sigma, size)
        return np.clip(np.rint(raw), 1, self.length_cap).astype(np.int64)

    @property
    def partition_model(self) -> CostModel:
        return self.partition or self.cost

    def describe(self) -> dict[str, Any]:
        """The parameters, JSON-ready (lengths summarised)."""
        out = asdict(self)
        out["lengths"] = (
            {"count": len(self.lengths), "median": float(np.median(self.lengths))}
            if self.lengths
            else None
        )
        out["cost"] = asdict(self.cost)
        out["partition"] = asdict(self.partition) if self.partition else None
        return out


@dataclass(kw_only=True, frozen=True)
class SimWindows:
    """A simulated run written in the live layout (:mod:`fsobs.runformat.windows`) as a job
    profiled on ``schedule`` publishes it: ``windows/schedule.json``, and each scheduled window
    that ends within the run (a live window is whole or not at all) in ``windows/w<first>/``,
    each rank's trace of its steps and its note (trigger ``schedule``). The top-level sidecars
    hold every step, and no top-level trace is written."""

    schedule: WindowSchedule
    """When the windows are (``every`` >= 1: a simulated job has no captures)."""
    unpublished: tuple[tuple[int, int], ...] = ()
    """``(first step, rank)``: windows that rank leaves unpublished (no trace, no note)."""

    def __post_init__(self) -> None:
        if self.schedule.every < 1:
            raise ValueError(f"schedule: needs every >= 1, got {self.schedule.every}")
        for first, rank in self.unpublished:
            scheduled = self.schedule.scheduled(first, first)
            if rank < 0 or not any(start == first for start, _ in scheduled):
                raise ValueError(
                    f"unpublished: ({first}, {rank}) names no window's first step and rank"
                )

    def spans(self, num_steps: int) -> list[tuple[int, int]]:
        """Each window's first and last step (inclusive) in a run of ``num_steps`` steps."""
        return [w for w in self.schedule.scheduled(0, num_steps - 1) if w[1] < num_steps]

    def check(self, cfg: SimConfig) -> None:
        """``unpublished`` within ``cfg``'s windows and ranks (ValueError naming it)."""
        firsts = {first for first, _ in self.spans(cfg.steps)}
        if not firsts:
            raise ValueError(f"schedule: no window ends within the run's {cfg.steps} steps")
        for first, rank in self.unpublished:
            if first not in firsts or rank >= cfg.world_size:
                raise ValueError(
                    f"unpublished: ({first}, {rank}) is past the run's windows or its "
                    f"{cfg.world_size} ranks"
                )

    def describe(self) -> dict[str, Any]:
        return {"schedule": self.schedule.to_json(), "unpublished": self.unpublished}


def calibrate(analysis: Analysis, **overrides: Any) -> SimConfig:
    """A :class:`SimConfig` from a measured run: its lengths, batch, fitted cost model, rank
    speeds and residual noise, host time and transfer times (GPU-like fixed kernels kept small;
    ``overrides`` win). The transfers are bandwidth terms fitted at the run's world size."""
    from fsobs.analysis.whatif.calibration import calibrate as calibrate_busy
    from fsobs.analysis.whatif.calibration import partition_model
    from fsobs.analysis.whatif.priority import pec_overlap
    from fsobs.analysis.whatif.replay import build_graph

    graph = build_graph(analysis)
    sidecar = analysis.run.sidecar
    if sidecar is None or sidecar.empty:
        raise RunError(
            "calibration needs step sidecars (steps.rank<R>.jsonl)", path=analysis.run.path
        )
    cal = calibrate_busy(analysis, graph.ranks, graph.steps)
    if not cal.lengths:
        raise RunError(
            "calibration needs per-sample lengths in the step sidecars", path=analysis.run.path
        )
    partition, _ = partition_model(sidecar, cal.fit.model)
    log = np.log(cal.eta)
    common = log.mean(axis=0)
    w0 = len(graph.ranks)
    comm = _transfers(graph, cal.lengths, w0)
    steps = analysis.steps[analysis.steps["step"].isin(graph.steps)]
    batch = int(np.median(sidecar["num_samples"]))
    chunk = int(max(10_000, comm["x0"] / 3))
    fixed = chunk * (3 + 4)  # about 3 prologue kernels and 4 update kernels
    m = cal.fit.model
    base = SimConfig(
        world_size=w0,
        batch_per_rank=batch,
        lengths=tuple(int(v) for arr in cal.lengths.values() for v in arr.tolist()),
        cost=CostModel(c0=max(0.0, m.c0 - fixed / batch), a=m.a, b=m.b),
        partition=partition,
        speed_sigma=float(np.std(np.log(cal.speed))),
        noise_sigma=float(np.std(log - common[None, :])),
        step_sigma=float(np.std(common)),
        host_idle_ns=max(1_000.0, float(steps["host_idle_ms"].median() * 1e6)),
        memcpy_ns=10_000,
        chunk_ns=chunk,
        update_chunks=4,
        optimizer_ns=10_000,
        a2a_ns_per_token=comm["a2a_ns_per_token"],
        ids_ns_per_token=comm["ids_ns_per_token"],
        allreduce_ns=comm["allreduce_ns"],
        a2a_latency_ns=0.0,
        allreduce_latency_ns=0.0,
        source=f"calibrated from {analysis.run.path} ({w0} ranks, {len(graph.steps)} steps)",
    )
    overlap = pec_overlap(sidecar)
    if overlap is not None and len(overlap) > 1:  # step 0 has no previous batch
        base = replace(base, id_overlap=float(np.mean([overlap[s] for s in sorted(overlap)[1:]])))
    return replace(base, **overrides)


def _transfers(
    graph: SegmentGraph, lengths: dict[tuple[int, int], np.ndarray], w0: int
) -> dict[str, float]:
    """Per-token and all-reduce coefficients from the run's median transfer times per step:
    the first embedding collective of a step is the input dist, the other embedding ones
    the output dist (forward and backward, split in two), the dense ones the all-reduce."""
    table = graph.instances.sort_values("last_arrival_ns")
    x = table["instance"].map(graph.transfer_ns).astype(float)
    table = table.assign(x=x.to_numpy())
    emb = table[table["role"].isin([*EMBEDDING_ROLES, "other"])]
    dense = table[table["role"] == "dense"]
    first = emb.groupby("step")["x"].first()
    rest = emb.groupby("step")["x"].sum() - first
    tokens: dict[int, int] = {}
    for (_rank, step), arr in lengths.items():
        tokens[step] = max(tokens.get(step, 0), int(arr.sum()))
    t = float(np.median(list(tokens.values()))) if tokens else 1.0
    share = (w0 - 1) / w0
    ar = float(dense.groupby("step")["x"].sum().median()) if len(dense) else 0.0
    return {
        "x0": float(first.median()) if len(first) else 0.0,
        "ids_ns_per_token": float(first.median()) / (t * share) if len(first) else 0.0,
        "a2a_ns_per_token": float(rest.median()) / 2 / (t * share) if len(rest) else 0.0,
        "allreduce_ns": ar / share,
    }
