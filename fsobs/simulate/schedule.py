"""The simulated job's schedule on every rank and step, and its true bubble classes (no torch).

Each step of each rank runs on one GPU (compute stream: ``|==|``; communication: ``[..]``)::

    baseline
    compute  |cp|=K1=|        |g|c c c|====K2====|                       |g|u u u u|g|=opt=|  h
    comm              [C1 wait|x]  [C0 prefetch]  [C2 wait|xx x2 xx][C3 x3]
                      a1     A1 E1  (hidden)     a2       A2        E2    E3

- ``cp``: the input copy (memcpy: ``other``); ``K1``: embedding lookup and ``K2``: dense forward
  and backward (their time comes from the samples: ``speed · cost(samples) · noise``); ``c``:
  fixed prologue kernels under ``C0``, the next batch's input-dist all-to-all (torchrec's
  pipeline prefetch), slowed by ``gamma`` while it runs unless ``sm_free``; ``u``: the
  embedding update; ``opt``: the dense optimizer; ``g``: launch gaps; ``h``: data loading.
- ``C1``/``C3``: the embedding all-to-all forward / backward; ``C2``: the dense all-reduce. A
  collective starts on a rank when it is issued there (``a``) and ends for every rank at
  ``E = max_r a_r + X``. C3 waits in the queue behind C2.
- ``balance`` splits each global batch with optim's planner instead of the random split (with
  a window, :attr:`SimConfig.balance`'s ``window``, it deals ``K`` steps' batches at once).
- Degradation from a known step (:meth:`SimConfig.degradation`): a slow rank's ``K1`` and
  ``K2`` take ``slow_factor`` times longer; a data shift makes a rank's samples longer after
  the split, and its ``K1``/``K2`` follow their cost; a GC pause is host time ``gc`` between
  ``cp`` and ``K1`` (the GPU idles: host_idle, and the rank arrives late at ``C1``).

``priority_overlap`` is torchrec's Prioritized Embedding Communication (PEC) with FreeScale's
dense ordering, step by step as ``TrainPipelinePEC`` runs it (``../shared/notes/pec.md``). With
``o`` the step's overlapped share (:attr:`SimConfig.id_overlap`; 0 in the first step, which has
no previous batch), only ``o`` of each embedding all-to-all stays on the critical path::

    compute  |cp|=K1=|                    |g|c c c|=L=|===K2===|          |g|u u u u u|g|=opt=|
    comm              [F wait|xF][M1][M2]                      [B wait|xB]
    side                                  [C0][G ]                        [N   ]
    dense                                                      [C2 wait|...... x2 ..]
                      a1     A1        E1                 a2   A2     E3           E2

- ``F`` = ``o · X1``: the lookup all-to-all of the IDs the previous batch had (fresh weights);
  ``M1``, ``M2``: the two mask all-to-alls (one int32 per ID: ``X0`` each), all three blocking;
- ``G`` = ``(1 - o') · X1'`` (``o'``, ``X1'``: the previous step's): the previous step's
  deferred gradient all-to-all, behind ``C0`` on the side channel under the prologue;
- ``L`` = ``2 (1 - o') · K1``: applying the deferred gradient (a re-lookup and its backward),
  once ``G`` has landed;
- ``B`` = ``o · X1``: the overlapped gradient, first; the dense all-reduce ``C2`` on its own
  channel behind it and ``N`` = ``(1 - o'') · X1''`` (``o''``, ``X1''``: the next step's), the
  next batch's other IDs looked up a step ahead, both under the embedding update (slowed by
  ``gamma``); the rank blocks on them only after the update.

The truth of every class follows from these times (docs/design.md §5, the GPU window runs from the
step's input copy to the next step's)::

    busy      = K1 + c... + K2 + u... + opt  (+ L)   other = cp
    wait      = (A1 - a1) + (A2 - a2)                  (C2 and C3, or B and C2, wait together)
    exposed   = X1 + X2 + X3                           baseline
              = (E1 - A1) + max(0, G's end - c's end) + xB
                + min(S, g) + max(0, E3 + S - end of u)            priority_overlap
                  with S = max(E2, N's end) - E3 (the side transfers left after B)
    host_idle = window - everything else               (the gaps g and the loading h)
    contention (beside) = (gamma - 1) · chunk · (the c and u kernels that overlap C0, G, N or C2)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fsobs.simulate.config import SimConfig
from optim.plan import StepPlan, plan_window

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
    gc: np.ndarray
    """[step, rank] GC pause ns before the embedding lookup (:attr:`SimConfig.gc_rank`)."""
    est_cost: np.ndarray
    imbalance_before: np.ndarray
    imbalance_after: np.ndarray
    overlap: np.ndarray
    """PEC's overlapped share per step (:func:`step_overlap`; recorded whether PEC runs or not)."""
    x: dict[str, np.ndarray]
    """Transfer ns per step: ``X0, X1, X2`` (:func:`transfers`), ``XF, XB, XG, XN`` (PEC's,
    :func:`pec_transfers`)."""
    t: dict[str, np.ndarray]
    """``t0, k1_end, k2_start, k2_end, next_t0`` per [step, rank]; per [step] (after C1 every
    rank moves together): ``A1, EF, EM1, E1, A0, E0, EG, chunks_end, L_start, A2, E2, A3, E3,
    EN, upd_start, k4_start, k4_end`` (the module docstring; without PEC ``EF = EM1 = E1``,
    ``EG = E0`` and ``EN = E3``)."""
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
    _shift(cfg, lengths, est, before, after, "balance" in toggles)
    cost = np.array([_part_sums(step, cfg.cost) for step in lengths])
    common = np.exp(rng.normal(0.0, cfg.step_sigma, (s, 1)))
    compute = speed[None, :] * cost * common * np.exp(rng.normal(0.0, cfg.noise_sigma, (s, n)))
    if cfg.slow_rank is not None:
        compute[cfg.slow_from :, cfg.slow_rank] *= cfg.slow_factor
    host = cfg.host_idle_ns * np.exp(rng.normal(0.0, cfg.host_sigma, (s, n)))
    tokens = np.array([_part_sums(step) for step in lengths], np.float64)
    gc = np.zeros((s, n), np.int64)
    if cfg.gc_rank is not None:
        gc[cfg.gc_from :, cfg.gc_rank] = round(cfg.gc_ms * 1e6)
    return _time(cfg, toggles, lengths, est, before, after, compute, host, tokens, gc)


def _shift(
    cfg: SimConfig,
    lengths: list[list[np.ndarray]],
    est: np.ndarray,
    before: np.ndarray,
    after: np.ndarray,
    balanced: bool,
) -> None:
    """Apply the data shift in place: from ``shift_from`` on, the shifted ranks' samples are
    ``shift_factor`` times longer (at least 1), their estimated cost and the step's imbalance
    after the split follow (before it too without ``balance``, where the split is the random
    one; with it, ``imbalance_before`` stays the drawn batch's)."""
    if cfg.shift_from is None:
        return
    ranks = range(cfg.world_size) if cfg.shift_rank is None else (cfg.shift_rank,)
    model = cfg.partition_model
    for i in range(cfg.shift_from, cfg.steps):
        for r in ranks:
            grown = np.rint(lengths[i][r] * cfg.shift_factor)
            lengths[i][r] = np.maximum(grown, 1).astype(np.int64)
            est[i, r] = float(model(lengths[i][r]).sum())
        after[i] = est[i].max() / est[i].mean()
        if not balanced:
            before[i] = after[i]


def _split(
    cfg: SimConfig, rng: np.random.Generator, balance: bool
) -> tuple[list[list[np.ndarray]], np.ndarray, np.ndarray, np.ndarray]:
    """Draw every step's global batch (in step order, whatever the plan) and split it: one
    step at a time, or with a window ``K`` steps at once (:func:`optim.plan.plan_window`)."""
    n, b = cfg.world_size, cfg.batch_per_rank
    config = cfg.balance_config(enabled=balance)
    model = cfg.partition_model
    batches = [cfg.draw_lengths(rng, n * b) for _ in range(cfg.steps)]
    window = config.window if balance else 1
    out, est, before, after = [], [], [], []
    for first in range(0, cfg.steps, window):
        lengths = batches[first : first + window]
        costs = [model(batch) for batch in lengths]
        if window == 1:
            plans = [StepPlan.make(costs[0], n, config)]
        else:
            plans = plan_window(costs, n)
        pooled, pooled_costs = np.concatenate(lengths), np.concatenate(costs)
        for step_plan in plans:
            out.append([pooled[p] for p in step_plan.parts])
            est.append(_part_sums([pooled_costs[p] for p in step_plan.parts]))
            before.append(step_plan.imbalance_before)
            after.append(step_plan.imbalance_after)
    return out, np.array(est), np.array(before), np.array(after)


def _part_sums(
    parts: list[np.ndarray], per_item: Callable[[np.ndarray], np.ndarray] | None = None
) -> np.ndarray:
    """The sum of each part (of ``per_item`` of its items when given), in one call when the
    parts are of one size: a row's sum is then the part's own, bit for bit."""
    if len({len(p) for p in parts}) == 1:
        stacked = np.stack(parts)
        values = stacked if per_item is None else per_item(stacked)
        return np.asarray(values.sum(axis=1))
    return np.array([(p if per_item is None else per_item(p)).sum() for p in parts])


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
    gc: np.ndarray,
) -> Schedule:
    s, n = compute.shape
    pec = "priority_overlap" in toggles
    x = transfers(cfg, tokens)
    overlap = step_overlap(cfg, s)
    x.update(pec_transfers(x["X1"], overlap, pec))
    g, u = cfg.launch_gap_ns, cfg.chunk_ns
    slow_emb = u if "sm_free" in toggles else int(round(u * cfg.gamma))
    slow_dense = int(round(u * cfg.gamma))
    num_chunks = int(max(math.ceil(x0 / slow_emb) for x0 in x["X0"])) + 1
    d1 = np.rint(compute * cfg.embedding_share).astype(np.int64)
    d2 = np.rint(compute).astype(np.int64) - d1
    deferred = 1 - np.concatenate([[1.0], overlap[:-1]])  # the previous step's other share
    relookup = np.rint(2 * deferred[:, None] * d1).astype(np.int64) * pec
    keys = ("t0", "k1_end", "k2_start", "k2_end", "next_t0")
    per_rank = {k: np.zeros((s, n), np.int64) for k in keys}
    rows: list[dict[str, int]] = []
    chunk_dur = np.zeros((s, num_chunks), np.int64)
    upd_dur = np.zeros((s, cfg.update_chunks), np.int64)
    t0 = np.full(n, START_NS, np.int64)
    for i in range(s):
        per_rank["t0"][i] = t0
        a1 = t0 + cfg.memcpy_ns + gc[i] + d1[i]
        per_rank["k1_end"][i] = a1
        A1 = int(a1.max())
        if pec:
            EF = A1 + int(x["XF"][i])
            EM1 = EF + int(x["X0"][i])
            E1 = EM1 + int(x["X0"][i])
        else:
            EF = EM1 = E1 = A1 + int(x["X1"][i])
        A0 = E1 + g
        E0 = A0 + int(x["X0"][i])
        EG = E0 + int(x["XG"][i])
        chunk_dur[i] = _chunks(A0, num_chunks, u, slow_emb, EG)
        chunks_end = A0 + int(chunk_dur[i].sum())
        L_start = max(chunks_end, EG)
        k2_start = L_start + relookup[i]
        k2_end = k2_start + d2[i]
        per_rank["k2_start"][i], per_rank["k2_end"][i] = k2_start, k2_end
        A2 = int(k2_end.max())
        if pec:
            A3, E3 = A2, A2 + int(x["XB"][i])
            E2 = E3 + int(x["X2"][i])
        else:
            E2 = A2 + int(x["X2"][i])
            A3, E3 = E2, E2 + int(x["X1"][i])
        EN = E3 + int(x["XN"][i])
        side_end = max(E2, EN)
        upd_start = E3 + g
        upd_dur[i] = _chunks(upd_start, cfg.update_chunks, u, slow_dense if pec else u, side_end)
        upd_end = upd_start + int(upd_dur[i].sum())
        k4_start = max(upd_end, side_end) + g
        k4_end = k4_start + cfg.optimizer_ns
        rows.append(
            {
                "A1": A1,
                "EF": EF,
                "EM1": EM1,
                "E1": E1,
                "A0": A0,
                "E0": E0,
                "EG": EG,
                "chunks_end": chunks_end,
                "L_start": L_start,
                "A2": A2,
                "E2": E2,
                "A3": A3,
                "E3": E3,
                "EN": EN,
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
    busy = d1 + d2 + relookup
    truth = _truth(cfg, times, x, busy, chunk_dur, upd_dur, pec, slow_emb, slow_dense)
    return Schedule(
        cfg,
        toggles,
        lengths,
        gc,
        est,
        before,
        after,
        overlap,
        x,
        times,
        chunk_start,
        chunk_dur,
        upd_starts,
        upd_dur,
        truth,
    )


def step_overlap(cfg: SimConfig, steps: int) -> np.ndarray:
    """PEC's overlapped share per step: ``cfg.id_overlap``, 0 in the first step (no previous
    batch: PEC looks it all up ahead)."""
    out = np.full(steps, cfg.id_overlap, np.float64)
    out[0] = 0.0
    return out


def pec_transfers(x1: np.ndarray, overlap: np.ndarray, pec: bool) -> dict[str, np.ndarray]:
    """PEC's parts of each step's embedding all-to-all ``x1`` (module docstring): ``XF`` =
    ``XB`` (the overlapped share), ``XG`` (the previous step's deferred gradient) and ``XN``
    (the next step's ahead lookup); all 0 without PEC, and where there is nothing to move."""
    if not pec:
        zero = np.zeros(len(x1), np.int64)
        return {"XF": zero, "XB": zero, "XG": zero, "XN": zero}
    rest = np.rint((1 - overlap) * x1).astype(np.int64)
    rest = np.where(overlap < 1, np.maximum(rest, 1000), 0)
    ol = np.maximum(np.rint(overlap * x1).astype(np.int64), 1000)
    return {
        "XF": ol,
        "XB": ol,
        "XG": np.concatenate([[0], rest[:-1]]),
        "XN": np.concatenate([rest[1:], [0]]),
    }


def _truth(
    cfg: SimConfig,
    t: dict[str, np.ndarray],
    x: dict[str, np.ndarray],
    compute: np.ndarray,
    chunk_dur: np.ndarray,
    upd_dur: np.ndarray,
    pec: bool,
    slow_emb: int,
    slow_dense: int,
) -> dict[str, np.ndarray]:
    """The classes of the module docstring, per [step, rank] (ns); ``compute``: the
    data-dependent busy time (K1 + K2, and L with PEC)."""
    s, n = compute.shape
    g = cfg.launch_gap_ns
    window = t["next_t0"] - t["t0"]
    window[-1] = t["k4_end"][-1] - t["t0"][-1]
    fixed = chunk_dur.sum(axis=1) + upd_dur.sum(axis=1) + cfg.optimizer_ns
    busy = compute + fixed[:, None]
    wait = (t["A1"][:, None] - t["k1_end"]) + (t["A2"][:, None] - t["k2_end"])
    if pec:
        upd_end = t["upd_start"] + upd_dur.sum(axis=1)
        side = np.maximum(t["E2"], t["EN"]) - t["E3"]
        per_step = (
            (t["E1"] - t["A1"])
            + np.maximum(0, t["EG"] - t["chunks_end"])
            + (t["E3"] - t["A3"])
            + np.minimum(side, g)
            + np.maximum(0, t["E3"] + side - upd_end)
        )
        exposed = np.broadcast_to(per_step[:, None], (s, n))
    else:
        exposed = np.broadcast_to((2 * x["X1"] + x["X2"])[:, None], (s, n))
    other = np.full((s, n), cfg.memcpy_ns, np.int64)
    host_idle = window - busy - wait - exposed - other
    chunk = cfg.chunk_ns
    extra = ((chunk_dur == slow_emb) & (slow_emb > chunk)).sum(axis=1) * (slow_emb - chunk)
    extra = extra + ((upd_dur == slow_dense) & (slow_dense > chunk) & pec).sum(axis=1) * (
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
