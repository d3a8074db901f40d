"""The simulated job's schedule on every rank and step, and its true bubble classes (no torch).

Each step of each rank runs on one GPU (compute stream: ``|==|``; communication: ``[..]``)::

    baseline
    compute  |cp|=K1=|        |g|c c c|====K2====|                       |g|u u u u|g|=opt=|  h
    comm              [C1 wait|x]  [C0 prefetch]  [C2 wait|xx x2 xx][C3 x3]
                      a1     A1 E1  (hidden)     a2       A2        E2    E3
    priority_overlap (C3 on its own channel, first; the dense all-reduce C2 behind it)
    compute  ... |====K2====|                 |g|u u u u|     |g|=opt=|
    comm                    [C3 wait|x3]
                            [C2 wait|   x2 ...........]
                            a2      A   E3             E2

- ``cp``: the input copy (memcpy: ``other``); ``K1``: embedding lookup and ``K2``: dense forward
  and backward (their time comes from the samples: ``speed · cost(samples) · noise``); ``c``:
  fixed prologue kernels under ``C0``, the next batch's input-dist all-to-all (torchrec's
  pipeline prefetch), slowed by ``gamma`` while it runs unless ``sm_free``; ``u``: the
  embedding update; ``opt``: the dense optimizer; ``g``: launch gaps; ``h``: data loading.
- ``C1``/``C3``: the embedding all-to-all forward / backward; ``C2``: the dense all-reduce. A
  collective starts on a rank when it is issued there (``a``) and ends for every rank at
  ``E = max_r a_r + X``. Without ``priority_overlap``, C3 waits in the queue behind C2.
- ``balance`` splits each global batch with optim's planner instead of the random split.

The truth of every class follows from these times (DESIGN §5, the GPU window runs from the
step's input copy to the next step's)::

    busy      = K1 + c... + K2 + u... + opt            other = cp
    wait      = (A1 - a1) + (A2 - a2)                  (C2 and C3 wait together)
    exposed   = X1 + X2 + X3                           baseline
              = X1 + X3 + min(X2, g) + max(0, E2 - end of u)      priority_overlap
    host_idle = window - everything else               (the gaps g and the loading h)
    contention (beside) = (gamma - 1) · chunk · (the c and u kernels that overlap C0 or C2)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fsobs.simulate.config import SimConfig
from optim.plan import BalanceConfig, StepPlan

START_NS = 1_767_225_600_000_000_000
TRUTH_CLASSES = ("busy", "straggler_wait", "exposed_comm", "host_idle", "other")


@dataclass
class Schedule:
    """Times per ``[step, rank]`` (absolute ns), fixed kernels' starts per ``[step, kernel]``
    (the same on every rank), and the truth."""

    cfg: SimConfig
    toggles: frozenset[str]
    lengths: list[list[np.ndarray]]
    """[step][rank] per-sample lengths."""
    est_cost: np.ndarray
    imbalance_before: np.ndarray
    imbalance_after: np.ndarray
    t: dict[str, np.ndarray]
    """``t0, k1_end, k2_end`` per [step, rank]; ``A1, E1, A0, E0, k2_start, A2, E2, A3, E3,
    upd_start, k4_start, k4_end`` per [step] (after C1 every rank moves together), and
    ``next_t0`` per [step, rank]."""
    chunk_start: np.ndarray
    chunk_dur: np.ndarray
    upd_start: np.ndarray
    upd_dur: np.ndarray
    """[step, kernel] (the same on every rank)."""
    truth: dict[str, np.ndarray]
    """ns per [step, rank]: ``window`` and :data:`TRUTH_CLASSES`, ``contention``."""


def plan(cfg: SimConfig, toggles: frozenset[str] = frozenset()) -> Schedule:
    """Draw the data and noise, split the batches, and time every rank and step."""
    rng = np.random.default_rng(cfg.seed)
    n, s = cfg.world_size, cfg.steps
    speed = np.exp(rng.normal(0.0, cfg.speed_sigma, n))
    lengths, est, before, after = _split(cfg, rng, "balance" in toggles)
    cost = np.array([[float(cfg.cost(parts).sum()) for parts in step] for step in lengths])
    common = np.exp(rng.normal(0.0, cfg.step_sigma, (s, 1)))
    compute = speed[None, :] * cost * common * np.exp(rng.normal(0.0, cfg.noise_sigma, (s, n)))
    host = cfg.host_idle_ns * np.exp(rng.normal(0.0, cfg.host_sigma, (s, n)))
    tokens = np.array([[int(p.sum()) for p in step] for step in lengths], np.float64)
    return _time(cfg, toggles, lengths, est, before, after, compute, host, tokens)


def _split(
    cfg: SimConfig, rng: np.random.Generator, balance: bool
) -> tuple[list[list[np.ndarray]], np.ndarray, np.ndarray, np.ndarray]:
    n, b = cfg.world_size, cfg.batch_per_rank
    config = BalanceConfig(enabled=balance)
    model = cfg.partition_model
    out, est, before, after = [], [], [], []
    for _ in range(cfg.steps):
        batch = cfg.draw_lengths(rng, n * b)
        costs = model(batch)
        step_plan = StepPlan.make(costs, n, config)
        out.append([batch[p] for p in step_plan.parts])
        est.append([float(costs[p].sum()) for p in step_plan.parts])
        before.append(step_plan.imbalance_before)
        after.append(step_plan.imbalance_after)
    return out, np.array(est), np.array(before), np.array(after)


def transfers(cfg: SimConfig, tokens: np.ndarray) -> dict[str, np.ndarray]:
    """Per step: ``X0`` (input dist), ``X1 = X3`` (embedding all-to-all), ``X2`` (dense
    all-reduce), from the busiest rank's tokens and the world size."""
    n = cfg.world_size
    share = (n - 1) / n
    log_n = math.log2(n)
    busiest = tokens.max(axis=1)
    x0 = cfg.a2a_latency_ns * log_n + cfg.ids_ns_per_token * busiest * share
    x1 = cfg.a2a_latency_ns * log_n + cfg.a2a_ns_per_token * busiest * share
    x2 = np.full(len(tokens), cfg.allreduce_latency_ns * log_n + cfg.allreduce_ns * share)
    return {
        k: np.maximum(np.rint(v), 1000).astype(np.int64)
        for k, v in (("X0", x0), ("X1", x1), ("X2", x2))
    }


def _chunks(start: int, count: int, unit: int, slow: int, until: int) -> np.ndarray:
    """Durations of ``count`` back-to-back kernels from ``start``: ``slow`` while they start
    before ``until`` (overlapping communication), else ``unit``."""
    dur = np.empty(count, np.int64)
    t = start
    for i in range(count):
        dur[i] = slow if t < until else unit
        t += dur[i]
    return dur


def _time(
    cfg: SimConfig,
    toggles: frozenset[str],
    lengths: list[list[np.ndarray]],
    est: np.ndarray,
    before: np.ndarray,
    after: np.ndarray,
    compute: np.ndarray,
    host: np.ndarray,
    tokens: np.ndarray,
) -> Schedule:
    s, n = compute.shape
    prio = "priority_overlap" in toggles
    x = transfers(cfg, tokens)
    g, u = cfg.launch_gap_ns, cfg.chunk_ns
    slow_emb = u if "sm_free" in toggles else int(round(u * cfg.gamma))
    slow_dense = int(round(u * cfg.gamma))
    num_chunks = int(max(math.ceil(x0 / slow_emb) for x0 in x["X0"])) + 1
    d1 = np.rint(compute * cfg.embedding_share).astype(np.int64)
    d2 = np.rint(compute).astype(np.int64) - d1
    per_rank = {k: np.zeros((s, n), np.int64) for k in ("t0", "k1_end", "k2_end", "next_t0")}
    rows: list[dict[str, int]] = []
    chunk_dur = np.zeros((s, num_chunks), np.int64)
    upd_dur = np.zeros((s, cfg.update_chunks), np.int64)
    t0 = np.full(n, START_NS, np.int64)
    for i in range(s):
        per_rank["t0"][i] = t0
        a1 = t0 + cfg.memcpy_ns + d1[i]
        per_rank["k1_end"][i] = a1
        A1 = int(a1.max())
        E1 = A1 + int(x["X1"][i])
        A0 = E1 + g
        E0 = A0 + int(x["X0"][i])
        chunk_dur[i] = _chunks(A0, num_chunks, u, slow_emb, E0)
        k2_start = A0 + int(chunk_dur[i].sum())
        a2 = k2_start + d2[i]
        per_rank["k2_end"][i] = a2
        A2 = int(a2.max())
        if prio:
            A3, E3 = A2, A2 + int(x["X1"][i])
            E2 = E3 + int(x["X2"][i])
        else:
            E2 = A2 + int(x["X2"][i])
            A3, E3 = E2, E2 + int(x["X1"][i])
        upd_start = E3 + g
        upd_dur[i] = _chunks(upd_start, cfg.update_chunks, u, slow_dense if prio else u, E2)
        upd_end = upd_start + int(upd_dur[i].sum())
        k4_start = max(upd_end, E2) + g
        k4_end = k4_start + cfg.optimizer_ns
        rows.append(
            {
                "A1": A1,
                "E1": E1,
                "A0": A0,
                "E0": E0,
                "k2_start": k2_start,
                "A2": A2,
                "E2": E2,
                "A3": A3,
                "E3": E3,
                "upd_start": upd_start,
                "k4_start": k4_start,
                "k4_end": k4_end,
            }
        )
        t0 = k4_end + np.maximum(np.rint(host[i]).astype(np.int64), 1_000)
        per_rank["next_t0"][i] = t0
    per_step = {k: np.array([row[k] for row in rows], np.int64) for k in rows[0]}
    times = {**per_rank, **per_step}
    chunk_start = per_step["A0"][:, None] + np.cumsum(chunk_dur, axis=1) - chunk_dur
    upd_starts = per_step["upd_start"][:, None] + np.cumsum(upd_dur, axis=1) - upd_dur
    truth = _truth(cfg, times, x, d1, d2, chunk_dur, upd_dur, prio, slow_emb, slow_dense)
    return Schedule(
        cfg,
        toggles,
        lengths,
        est,
        before,
        after,
        times,
        chunk_start,
        chunk_dur,
        upd_starts,
        upd_dur,
        truth,
    )


def _truth(
    cfg: SimConfig,
    t: dict[str, np.ndarray],
    x: dict[str, np.ndarray],
    d1: np.ndarray,
    d2: np.ndarray,
    chunk_dur: np.ndarray,
    upd_dur: np.ndarray,
    prio: bool,
    slow_emb: int,
    slow_dense: int,
) -> dict[str, np.ndarray]:
    """The classes of the module docstring, per [step, rank] (ns)."""
    s, n = d1.shape
    g = cfg.launch_gap_ns
    window = t["next_t0"] - t["t0"]
    window[-1] = t["k4_end"][-1] - t["t0"][-1]
    busy = d1 + d2 + (chunk_dur.sum(axis=1) + upd_dur.sum(axis=1) + cfg.optimizer_ns)[:, None]
    wait = (t["A1"][:, None] - t["k1_end"]) + (t["A2"][:, None] - t["k2_end"])
    x1, x2 = x["X1"][:, None], x["X2"][:, None]
    if prio:
        upd_end = (t["upd_start"] + upd_dur.sum(axis=1))[:, None]
        exposed = x1 + x1 + np.minimum(x2, g) + np.maximum(0, t["E2"][:, None] - upd_end)
    else:
        exposed = x1 + x2 + x1
    exposed = np.broadcast_to(exposed, (s, n))
    other = np.full((s, n), cfg.memcpy_ns, np.int64)
    host_idle = window - busy - wait - exposed - other
    chunk = cfg.chunk_ns
    extra = ((chunk_dur == slow_emb) & (slow_emb > chunk)).sum(axis=1) * (slow_emb - chunk)
    extra = extra + ((upd_dur == slow_dense) & (slow_dense > chunk) & prio).sum(axis=1) * (
        slow_dense - chunk
    )
    return {
        "window": window,
        "busy": busy,
        "straggler_wait": wait,
        "exposed_comm": np.asarray(exposed, np.int64).copy(),
        "host_idle": host_idle,
        "other": other,
        "contention": np.broadcast_to(extra[:, None], (s, n)).copy(),
    }
