"""When everything happens in a synthetic run of :mod:`fsobs.simulate.synthetic_kineto`
(integer nanoseconds, no text).

Each step of each rank runs::

    main      |DataLoader| HtoD, embedding ops, all_to_all, dense forward |        | optimizer, item
    autograd                                                  | backward, all_reduce |
    stream 7    |copy|==sparse==|          |==dense fwd + bwd==|          |=optim=|copy|
    stream 20                   |==a2a=====|                   |==ar=====|
                                ^ arrival  ^ same end on all ranks

Compute time per rank and step follows a seeded heavy-tailed load (a per-rank Pareto factor times
per-step noise), so one rank is the straggler: on the other ranks the NCCL kernels start earlier
and last longer, and the collectives end at (almost) the same time on every rank.
:func:`schedule_run` plays all ranks through all steps first (cheap) to fix the collectives' ends;
each rank's writer then lays out its own steps again (:func:`plan_step` is deterministic in
seed, rank and step) against those ends.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fsobs.simulate._kineto_ops import (
    ALL_REDUCE,
    ALL_TO_ALL,
    BACKWARD_OPS,
    DENSE_OPS,
    GRAD_ZERO,
    INPUT_COPY,
    LOSS_READ,
    OPTIMIZER_OPS,
    SPARSE_OPS,
    GpuOp,
)

START_NS = 1_767_225_600_123_456_789  # 2026-01-01T00:00:00.123Z: where every synthetic run starts
EMBEDDING_DIM = 64
ALL_REDUCE_NELEMS = 8_388_608  # 32 MiB of float gradients
_NCCL_LATENCY_NS = 30_000


@dataclass(kw_only=True, frozen=True)
class SyntheticRunConfig:
    """Shape of a synthetic run."""

    num_ranks: int
    num_steps: int
    kernels_per_step: int = 400
    """Compute kernels per step and rank (plus 3 copies and 2 NCCL kernels)."""
    seed: int = 0
    ranks_per_host: int = 8
    first_step: int = 10
    """Number of the first ``ProfilerStep#N``."""
    imbalance: float = 0.5
    """Scale of the per-rank Pareto load factor (0: balanced ranks)."""
    a2a_gbps: float = 40.0
    all_reduce_gbps: float = 80.0

    def __post_init__(self) -> None:
        for name in ("num_ranks", "num_steps", "ranks_per_host"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.kernels_per_step < 5:
            raise ValueError("kernels_per_step must be >= 5")
        if self.imbalance < 0:
            raise ValueError("imbalance must be >= 0")


@dataclass
class StepPlan:
    """What one rank does in one step: the ops in host order and their random costs (ns)."""

    ops: list[GpuOp]
    thread: np.ndarray  # 0: main thread, 1: autograd thread
    i_a2a: int
    i_dense_end: int  # index of the last dense-forward op
    i_ar: int
    gpu_ns: np.ndarray
    gpu_gap_ns: np.ndarray
    cpu_gap_ns: np.ndarray
    pre_ns: np.ndarray  # per nesting level, before the launch
    post_ns: np.ndarray  # per nesting level, after the launch
    launch_ns: np.ndarray
    dataloader_ns: int
    end_jitter_ns: tuple[int, int]  # how much later than the global end each collective ends here


def plan_step(cfg: SyntheticRunConfig, rank: int, step: int, load: float) -> StepPlan:
    """Deterministic in (seed, rank, step): the schedule pass and the writing pass agree."""
    rng = np.random.default_rng([cfg.seed, rank, step])
    n = cfg.kernels_per_step
    n_sparse, n_dense, n_opt = max(1, n // 5), max(1, 3 * n // 10), max(1, n // 10)
    n_bwd = n - n_sparse - n_dense - n_opt

    def pick(pool: tuple[GpuOp, ...], k: int) -> list[GpuOp]:
        return [pool[i] for i in rng.integers(len(pool), size=k).tolist()]

    ops = [INPUT_COPY, *pick(SPARSE_OPS, n_sparse), ALL_TO_ALL, *pick(DENSE_OPS, n_dense)]
    i_a2a, i_dense_end = 1 + n_sparse, 1 + n_sparse + n_dense
    ops += [GRAD_ZERO, *pick(BACKWARD_OPS, n_bwd), ALL_REDUCE, *pick(OPTIMIZER_OPS, n_opt)]
    ops.append(LOSS_READ)
    i_ar = len(ops) - n_opt - 2
    size = len(ops)
    thread = np.zeros(size, dtype=np.int8)
    thread[i_dense_end + 1 : i_ar + 1] = 1
    scale = np.ones(size)
    scale[1:i_ar] = load  # sequence-length dependent work: embeddings, forward, backward
    mean_ns = np.array([op.mean_us for op in ops]) * 1000.0
    gpu_ns = (mean_ns * scale * rng.lognormal(0.0, 0.3, size)).astype(np.int64)
    gpu_ns[[i_a2a, i_ar]] = 0  # set by the collective's global end
    return StepPlan(
        ops=ops,
        thread=thread,
        i_a2a=i_a2a,
        i_dense_end=i_dense_end,
        i_ar=i_ar,
        gpu_ns=gpu_ns,
        gpu_gap_ns=rng.integers(1_000, 3_000, size),
        cpu_gap_ns=rng.integers(2_000, 12_000, size),
        pre_ns=rng.integers(800, 2_500, size),
        post_ns=rng.integers(400, 1_500, size),
        launch_ns=rng.lognormal(np.log(4_000), 0.35, size).astype(np.int64) + 1_000,
        dataloader_ns=int(rng.integers(150_000, 400_000)),
        end_jitter_ns=(int(rng.integers(0, 2_000)), int(rng.integers(0, 2_000))),
    )


def _serial(ready: np.ndarray, dur: np.ndarray, gap: np.ndarray, free_at: int) -> np.ndarray:
    """Starts of activities run in order on one stream.

    ``start_i = max(ready_i, end_{i-1} + gap_i)`` with ``end_{-1} = free_at``, in closed form:
    with ``P_i = sum(gap[:i+1]) + sum(dur[:i])``, ``start_i = P_i + max_{j<=i}(ready_j - P_j)``.
    """
    ready = ready.copy()
    ready[0] = max(int(ready[0]), free_at + int(gap[0]))
    offset = np.cumsum(gap)
    offset[1:] += np.cumsum(dur[:-1])
    return offset + np.maximum.accumulate(ready - offset)


class StepLayout:
    """Absolute times (ns) of one rank's step, fixed in three stages around the two collectives.

    ``__init__`` places the host side and the GPU work up to the all-to-all (``a2a_arrival``);
    ``after_all_to_all`` the work up to the all-reduce (``ar_arrival``); ``after_all_reduce`` the
    rest, which fixes ``step_end`` (the host blocks on the final device-to-host copy).
    """

    def __init__(self, plan: StepPlan, t0: int) -> None:
        self.plan, self.t0 = plan, t0
        depth = np.array([len(op.chain) for op in plan.ops], dtype=np.int64)
        self.depth = depth
        cost = depth * (plan.pre_ns + plan.post_ns) + plan.launch_ns + plan.cpu_gap_ns
        self.start = t0 + plan.dataloader_ns + np.concatenate(([0], np.cumsum(cost[:-1])))
        self.launch_start = self.start + depth * plan.pre_ns
        self.launch_end = self.launch_start + plan.launch_ns
        self.gpu_start = np.zeros(len(plan.ops), dtype=np.int64)
        self.gpu_end = np.zeros(len(plan.ops), dtype=np.int64)
        self._place(0, plan.i_a2a, free_at=t0, after=t0)
        self.a2a_arrival = max(int(self.launch_end[plan.i_a2a]), int(self.gpu_end[plan.i_a2a - 1]))
        self.ar_arrival = self.step_end = -1

    def _place(self, lo: int, hi: int, *, free_at: int, after: int) -> None:
        """Run ops ``lo..hi-1`` on the compute stream, the first no earlier than ``after``."""
        ready = self.launch_end[lo:hi].copy()
        ready[0] = max(int(ready[0]), after)
        dur = self.plan.gpu_ns[lo:hi]
        self.gpu_start[lo:hi] = _serial(ready, dur, self.plan.gpu_gap_ns[lo:hi], free_at)
        self.gpu_end[lo:hi] = self.gpu_start[lo:hi] + dur

    def after_all_to_all(self, global_end: int) -> None:
        plan, i = self.plan, self.plan.i_a2a
        self.gpu_start[i], self.gpu_end[i] = self.a2a_arrival, global_end + plan.end_jitter_ns[0]
        self._place(i + 1, plan.i_ar, free_at=int(self.gpu_end[i - 1]), after=int(self.gpu_end[i]))
        self.ar_arrival = max(int(self.launch_end[plan.i_ar]), int(self.gpu_end[plan.i_ar - 1]))

    def after_all_reduce(self, global_end: int) -> None:
        plan, i = self.plan, self.plan.i_ar
        self.gpu_start[i], self.gpu_end[i] = self.ar_arrival, global_end + plan.end_jitter_ns[1]
        last = len(plan.ops)
        self._place(i + 1, last, free_at=int(self.gpu_end[i - 1]), after=int(self.gpu_end[i]))
        # .item(): the host returns from the device-to-host copy only once it has finished
        blocked = int(self.gpu_end[-1]) + 2_000 - int(self.launch_start[-1])
        self.launch_end[-1] = self.launch_start[-1] + max(int(plan.launch_ns[-1]), blocked)
        self.step_end = int(self.launch_end[-1] + self.depth[-1] * plan.post_ns[-1]) + 3_000

    def item_end(self, i: int) -> int:
        return int(self.launch_end[i] + self.depth[i] * self.plan.post_ns[i])


@dataclass(frozen=True)
class RunSchedule:
    """The run-wide times every rank's file needs: step starts and collective end times."""

    loads: np.ndarray  # [step, rank] compute load factor
    t0: np.ndarray  # [step + 1, rank] step starts (the last row: end of the last step)
    a2a_end: np.ndarray  # [step]
    ar_end: np.ndarray  # [step]


def _loads(cfg: SyntheticRunConfig) -> np.ndarray:
    """Heavy-tailed per-rank load factor times mild per-step noise, shape [step, rank]."""
    rng = np.random.default_rng([cfg.seed, 7919])
    per_rank = 1.0 + cfg.imbalance * rng.pareto(2.5, cfg.num_ranks)
    return per_rank[None, :] * rng.lognormal(0.0, 0.03, (cfg.num_steps, cfg.num_ranks))


def split_rows(cfg: SyntheticRunConfig, step: int) -> np.ndarray:
    """All-to-all-v rows sent from rank i to rank j in ``step`` (shared by all ranks)."""
    rng = np.random.default_rng([cfg.seed, 104_729, step])
    return rng.integers(1_000, 6_000, (cfg.num_ranks, cfg.num_ranks))


def _transfer_ns(cfg: SyntheticRunConfig, step: int) -> tuple[int, int]:
    """Duration of the all-to-all and the all-reduce once every rank has arrived."""
    rows = split_rows(cfg, step)
    a2a_bytes = max(rows.sum(axis=1).max(), rows.sum(axis=0).max()) * EMBEDDING_DIM * 4
    n = cfg.num_ranks
    ar_bytes = 2 * (n - 1) / n * ALL_REDUCE_NELEMS * 4
    return (
        _NCCL_LATENCY_NS + int(a2a_bytes / cfg.a2a_gbps),
        _NCCL_LATENCY_NS + int(ar_bytes / cfg.all_reduce_gbps),
    )


def schedule_run(cfg: SyntheticRunConfig) -> RunSchedule:
    """Play all ranks through all steps (times only) to fix when each collective ends."""
    loads = _loads(cfg)
    t0 = np.full((cfg.num_steps + 1, cfg.num_ranks), START_NS, dtype=np.int64)
    a2a_end = np.zeros(cfg.num_steps, dtype=np.int64)
    ar_end = np.zeros(cfg.num_steps, dtype=np.int64)
    for s in range(cfg.num_steps):
        layouts = [
            StepLayout(plan_step(cfg, r, s, float(loads[s, r])), int(t0[s, r]))
            for r in range(cfg.num_ranks)
        ]
        a2a_xfer, ar_xfer = _transfer_ns(cfg, s)
        a2a_end[s] = max(lay.a2a_arrival for lay in layouts) + a2a_xfer
        for lay in layouts:
            lay.after_all_to_all(int(a2a_end[s]))
        ar_end[s] = max(lay.ar_arrival for lay in layouts) + ar_xfer
        for lay in layouts:
            lay.after_all_reduce(int(ar_end[s]))
        t0[s + 1] = [lay.step_end + 1_000 for lay in layouts]
    return RunSchedule(loads=loads, t0=t0, a2a_end=a2a_end, ar_end=ar_end)
