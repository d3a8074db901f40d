"""Shuffle-mode balancing and the run-time plan check, over a ``torch.distributed`` group.

Shuffle mode (docs/design.md §6) is for loaders that learn the lengths only after loading: each rank
holds its random-split share of a global batch as int64 *rows* (any packing of a sample)::

    rank 0: rows a b c      costs ca cb cc   --all_gather costs-->  [ca cb cc | cd ce cf]
    rank 1: rows d e f      costs cd ce cf                          plan (optim.plan.StepPlan)
                                                                     owner of each position
    all_to_all_single(rows by owner) -->  rank 0: a e f   rank 1: b c d   (say)

Rank order is global-batch order (the random split is contiguous), so every rank plans on the
same cost vector and gets the same plan; each rank receives its part in ascending position
order. With a window (``BalanceConfig(window=K)``) each rank holds its share of ``K`` global
batches; their costs are gathered step by step, :func:`optim.plan.plan_window` deals the window
(positions into the batches concatenated, as in plan mode) and one exchange sends every row to
the rank and step that train it, each row carrying its window position so that the receiver
puts it in its step, in position order. The group must carry CPU tensors (gloo; on NCCL jobs
pass a gloo group).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function

from optim.markers import comm_marker
from optim.plan import BalanceConfig, StepPlan, plan_window

__all__ = [
    "PlanDivergedError",
    "ShuffleBalancer",
    "check_plan",
    "exchange_rows",
    "gather_costs",
    "on_group",
]


class PlanDivergedError(RuntimeError):
    """The ranks computed different balance plans for the same step."""


def on_group(group: dist.ProcessGroup | None) -> record_function:
    """The range that names ``group`` around a collective of the balance toggle issued on it
    (:mod:`optim.markers`)."""
    # dist.group.WORLD is None only before init_process_group
    pg = group if group is not None else cast(dist.ProcessGroup, dist.group.WORLD)
    return record_function(comm_marker("other", pg.group_name))


def check_plan(digest: str, step: int, group: dist.ProcessGroup | None = None) -> None:
    """All-gather the plan digest of ``step``; raise :class:`PlanDivergedError` on every rank
    when two ranks disagree (the message lists each rank's digest)."""
    digests: list[object] = [None] * dist.get_world_size(group)
    with on_group(group):
        dist.all_gather_object(digests, digest, group=group)
    if len(set(digests)) > 1:
        listed = ", ".join(f"rank {r}: {d}" for r, d in enumerate(digests))
        raise PlanDivergedError(
            f"balance plan diverged at step {step} ({listed}); the ranks must see the same "
            "lengths, cost model and method"
        )


def gather_costs(
    costs: np.ndarray, group: dist.ProcessGroup | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(all ranks' costs concatenated in rank order, the count of each rank)."""
    world = dist.get_world_size(group)
    local = torch.from_numpy(np.ascontiguousarray(costs, dtype=np.float64))
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    with on_group(group):
        dist.all_gather(counts, torch.tensor([local.numel()], dtype=torch.int64), group=group)
    sizes = np.array([int(c.item()) for c in counts], dtype=np.int64)
    padded = torch.zeros(int(sizes.max(initial=0)), dtype=torch.float64)
    padded[: local.numel()] = local
    gathered = [torch.empty_like(padded) for _ in range(world)]
    with on_group(group):
        dist.all_gather(gathered, padded, group=group)
    parts = [g[:n].numpy() for g, n in zip(gathered, sizes.tolist(), strict=True)]
    return np.concatenate(parts), sizes


def exchange_rows(
    rows: Sequence[np.ndarray], dest: np.ndarray, group: dist.ProcessGroup | None = None
) -> list[np.ndarray]:
    """Send ``rows[i]`` (1-D int64) to rank ``dest[i]``; the rows this rank receives, by source
    rank, each source's rows in their order there. Rows are framed as ``[len, *row]``."""
    world = dist.get_world_size(group)
    if len(rows) != len(dest):
        raise ValueError(f"rows and dest differ in length: {len(rows)} vs {len(dest)}")
    chunks: list[list[np.ndarray]] = [[] for _ in range(world)]
    for row, d in zip(rows, np.asarray(dest).tolist(), strict=True):
        chunks[d] += [np.array([len(row)], dtype=np.int64), np.asarray(row, dtype=np.int64)]
    buffers = [np.concatenate(c) if c else np.empty(0, np.int64) for c in chunks]
    send_sizes = torch.tensor([b.size for b in buffers], dtype=torch.int64)
    recv_sizes = torch.empty_like(send_sizes)
    with on_group(group):
        dist.all_to_all_single(recv_sizes, send_sizes, group=group)
    send = torch.from_numpy(np.concatenate(buffers))
    recv = torch.empty(int(recv_sizes.sum()), dtype=torch.int64)
    with on_group(group):
        dist.all_to_all_single(recv, send, recv_sizes.tolist(), send_sizes.tolist(), group=group)
    return _unframe(recv.numpy())


def _owners(plans: Sequence[StepPlan], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per position of the ``size`` the plans cover: the rank that trains it and the index of
    its plan (its step in a window)."""
    owner, step_of = np.empty(size, np.int64), np.empty(size, np.int64)
    for k, plan in enumerate(plans):
        for r, part in enumerate(plan.parts):
            owner[part], step_of[part] = r, k
    return owner, step_of


def _unframe(flat: np.ndarray) -> list[np.ndarray]:
    out, pos = [], 0
    while pos < flat.size:
        n = int(flat[pos])
        out.append(flat[pos + 1 : pos + 1 + n].copy())
        pos += 1 + n
    return out


class ShuffleBalancer:
    """Balance one step's shares by exchanging rows (see the module docstring)."""

    def __init__(self, config: BalanceConfig, group: dist.ProcessGroup | None = None) -> None:
        self.config = config
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def __call__(
        self, step: int, rows: Sequence[np.ndarray], costs: np.ndarray
    ) -> tuple[list[np.ndarray], StepPlan]:
        """(the rows this rank trains on at ``step``, the plan), given this rank's share."""
        with record_function("## fsobs:balance_shuffle ##"):
            all_costs, counts = gather_costs(costs, self.group)
            plan = StepPlan.make(all_costs, self.world_size, self.config)
            if self.config.checks_at(step):
                check_plan(plan.digest, step, self.group)
            owner, _ = _owners([plan], all_costs.size)
            start = int(counts[: self.rank].sum())
            received = exchange_rows(rows, owner[start : start + len(rows)], self.group)
        return received, plan

    def window(
        self, first_step: int, rows: Sequence[Sequence[np.ndarray]], costs: Sequence[np.ndarray]
    ) -> tuple[list[list[np.ndarray]], list[StepPlan]]:
        """(per step of the window, the rows this rank trains on; the steps' plans), given this
        rank's share of each of the window's global batches (``rows[k]`` with ``costs[k]``)."""
        if len(rows) != len(costs):
            raise ValueError(f"rows and costs differ in steps: {len(rows)} vs {len(costs)}")
        with record_function("## fsobs:balance_shuffle ##"):
            gathered = [gather_costs(np.asarray(c), self.group) for c in costs]
            plans = plan_window([g for g, _ in gathered], self.world_size)
            for k, plan in enumerate(plans):
                if self.config.checks_at(first_step + k):
                    check_plan(plan.digest, first_step + k, self.group)
            owner, step_of = _owners(plans, sum(g.size for g, _ in gathered))
            tagged, dest, offset = [], [], 0
            for (g, counts), step_rows in zip(gathered, rows, strict=True):
                start = offset + int(counts[: self.rank].sum())
                for i, row in enumerate(step_rows):
                    tagged.append(np.concatenate([[start + i], np.asarray(row, np.int64)]))
                    dest.append(owner[start + i])
                offset += g.size
            received = sorted(
                exchange_rows(tagged, np.array(dest, np.int64), self.group),
                key=lambda row: int(row[0]),
            )
        per_step: list[list[np.ndarray]] = [[] for _ in plans]
        for row in received:
            per_step[int(step_of[row[0]])].append(row[1:])
        return per_step, plans
