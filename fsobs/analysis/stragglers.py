"""Stragglers: who arrives last at each step's synchronising collectives, and what it costs.

For a matched collective instance with aligned arrivals ``a_r`` and last arrival ``A``, rank r
waits ``min(A, end_r) - a_r``; the last rank *causes* the sum of those waits::

    rank 0  a0|......wait......|xx|
    rank 1        a1|...wait...|xx|
    rank 2 (last)              A|xx|      caused = wait_0 + wait_1

The straggler of a step is the rank that caused the most wait over the step's instances. The
verdict is ``stable`` when one rank is the straggler of at least ``stable_share`` of the steps,
``rotating`` otherwise (``none`` without matched collectives).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from fsobs.analysis.collectives import Collectives


@dataclass
class Stragglers:
    """``per_step``: step, rank (the straggler), wait_caused_ms.
    ``per_rank``: rank, times_last (steps it was the straggler), wait_caused_ms (all instances).
    """

    per_step: pd.DataFrame
    per_rank: pd.DataFrame
    verdict: str
    culprit: int | None
    """The most frequent straggler, None without any."""


def waits(colls: Collectives) -> pd.DataFrame:
    """Per (instance, rank): the wait in ns before the last rank arrived, clipped to the span."""
    inst = colls.instances
    wait = np.minimum(inst["arrival_last_ns"], inst["end_ns"]) - inst["start_ns"]
    return inst.assign(wait_ns=np.maximum(wait, 0).astype(np.int64))


def find_stragglers(
    colls: Collectives, steps: list[int], *, stable_share: float = 0.75
) -> Stragglers:
    """Straggler per step and per rank (see the module docstring)."""
    ranks = sorted(set(colls.offsets_ns))
    table = waits(colls)
    table = table[table["step"].isin(steps)]
    step_of = table.groupby("instance")["step"].agg(lambda s: s.mode().iloc[0])
    caused = table.groupby("instance").agg(
        last_rank=("last_rank", "first"), wait_ns=("wait_ns", "sum")
    )
    caused["step"] = step_of
    by_step = caused.groupby(["step", "last_rank"])["wait_ns"].sum().reset_index()
    top = by_step.sort_values(["step", "wait_ns", "last_rank"], ascending=[True, False, True])
    top = top.drop_duplicates("step")
    per_step = pd.DataFrame(
        {
            "step": top["step"].astype(int).to_numpy(),
            "rank": top["last_rank"].astype(int).to_numpy(),
            "wait_caused_ms": top["wait_ns"].to_numpy() / 1e6,
        }
    )
    times_last = per_step["rank"].value_counts()
    total = caused.groupby("last_rank")["wait_ns"].sum()
    per_rank = pd.DataFrame(
        {
            "rank": ranks,
            "times_last": [int(times_last.get(r, 0)) for r in ranks],
            "wait_caused_ms": [float(total.get(r, 0)) / 1e6 for r in ranks],
        }
    )
    if per_step.empty:
        return Stragglers(per_step, per_rank, "none", None)
    culprit = int(times_last.index[0])
    share = times_last.iloc[0] / len(per_step)
    verdict = "stable" if share >= stable_share else "rotating"
    return Stragglers(per_step, per_rank, verdict, culprit)
