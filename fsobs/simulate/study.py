"""Scale study on the simulator: the bubble against the world size under the random split,
what each toggle (alone and all together) removes at one world size, and what each balance
mode removes alone and with every toggle (no torch).

Every figure comes from the simulator's truth (which ``fsobs analyze`` recovers from the
written traces, see :func:`fsobs.simulate.simulator.truth_error`); nothing is written to disk.
A toggle's run and its baseline share the seed, so they see the same global batches and noise.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from itertools import combinations

import numpy as np
import pandas as pd

from fsobs.simulate.config import SIM_TOGGLES, SimConfig
from fsobs.simulate.schedule import TRUTH_CLASSES, Schedule, plan
from optim.plan import BalanceConfig

WORLD_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024)
BALANCE_MODES: dict[str, BalanceConfig] = {
    "kk": BalanceConfig(),
    "lpt": BalanceConfig(method="lpt"),
    "window2": BalanceConfig(method="lpt", window=2),
    "window4": BalanceConfig(method="lpt", window=4),
    "window8": BalanceConfig(method="lpt", window=8),
}
"""Name -> the balance policy (:attr:`SimConfig.balance`): equal counts, unequal counts,
windows."""


def kpis(sched: Schedule) -> dict[str, float]:
    """The run's KPIs from its truth: bubble ratio, ms per rank and step of the bubble and
    each class, step time p50 and mean (the mean is the run's time per step: with a window the
    steps that hold the costliest samples are longer than the others)."""
    t = sched.truth
    window, busy = t["window"].astype(float), t["busy"].astype(float)
    out = {
        "bubble_ratio": float((window - busy).sum() / window.sum()),
        "bubble_ms_per_step": float((window - busy).mean() / 1e6),
    }
    for name in TRUTH_CLASSES[1:]:
        out[f"{name}_ms_per_step"] = float(t[name].mean() / 1e6)
    out["contention_ms_per_step"] = float(t["contention"].mean() / 1e6)
    # the paper's taxonomy counts slowed compute as a bubble class; docs/design.md §5 puts it beside
    out["bubble_with_contention_ms_per_step"] = (
        out["bubble_ms_per_step"] + out["contention_ms_per_step"]
    )
    out["step_time_ms_p50"] = float(np.median(window.max(axis=1)) / 1e6)
    out["step_time_ms_mean"] = float(window.max(axis=1).mean() / 1e6)
    out["imbalance_after"] = float(np.mean(sched.imbalance_after))
    return out


def scale_curve(
    cfg: SimConfig,
    world_sizes: Sequence[int] = WORLD_SIZES,
    seeds: Iterable[int] = (0, 1, 2),
    toggles: Iterable[str] = (),
) -> pd.DataFrame:
    """One row per (world size, seed): :func:`kpis` of the run under ``toggles``."""
    rows = []
    for n in world_sizes:
        for seed in seeds:
            sched = plan(replace(cfg, world_size=n, seed=seed), frozenset(toggles))
            rows.append({"world_size": n, "seed": seed, **kpis(sched)})
    return pd.DataFrame(rows)


def toggle_study(
    cfg: SimConfig, world_size: int = 256, seeds: Iterable[int] = (0, 1, 2)
) -> pd.DataFrame:
    """One row per toggle combination (the baseline first): its KPIs and the bubble reduction
    against the baseline of the same seed, mean over the seeds (``reduction_min/max``: their
    range)."""
    combos = [()] + [
        c for k in range(1, len(SIM_TOGGLES) + 1) for c in combinations(SIM_TOGGLES, k)
    ]
    rows = []
    for seed in seeds:
        base_cfg = replace(cfg, world_size=world_size, seed=seed)
        base = None
        for combo in combos:
            k = kpis(plan(base_cfg, frozenset(combo)))
            base = base or k
            with_contention = "bubble_with_contention_ms_per_step"
            rows.append(
                {
                    "toggles": "+".join(combo) or "baseline",
                    "seed": seed,
                    **k,
                    "bubble_reduction": 1 - k["bubble_ms_per_step"] / base["bubble_ms_per_step"],
                    "reduction_with_contention": 1 - k[with_contention] / base[with_contention],
                }
            )
    frame = pd.DataFrame(rows)
    means = frame.drop(columns="seed").groupby("toggles", sort=False).mean()
    spread = frame.groupby("toggles", sort=False)["bubble_reduction"].agg(["min", "max"])
    means["reduction_min"], means["reduction_max"] = spread["min"], spread["max"]
    return means.reset_index()


def balance_study(
    cfg: SimConfig,
    world_size: int = 256,
    seeds: Iterable[int] = (0, 1, 2),
    modes: Sequence[str] = tuple(BALANCE_MODES),
) -> pd.DataFrame:
    """One row per (balance mode, ``balance`` alone or with every toggle, seed): the mode's
    :func:`kpis` and its bubble reduction against the random split of the same seed (the
    same global batches and noise)."""
    for mode in modes:
        if mode not in BALANCE_MODES:
            raise ValueError(f"modes: unknown {mode!r}, expected some of {list(BALANCE_MODES)}")
    rows = []
    for seed in seeds:
        base_cfg = replace(cfg, world_size=world_size, seed=seed)
        base = kpis(plan(base_cfg))["bubble_ms_per_step"]
        for mode in modes:
            mode_cfg = replace(base_cfg, balance=BALANCE_MODES[mode])
            for toggles in (("balance",), SIM_TOGGLES):
                k = kpis(plan(mode_cfg, frozenset(toggles)))
                rows.append(
                    {
                        "mode": mode,
                        "toggles": "balance" if len(toggles) == 1 else "all",
                        "seed": seed,
                        **k,
                        "bubble_reduction": 1 - k["bubble_ms_per_step"] / base,
                    }
                )
    return pd.DataFrame(rows)
