"""What the what-if learns from one baseline run: compute per rank and step, explained by the
data and by noise (no torch).

Per rank r and step s the run measured a busy time ``B_rs``. The cost model fitted on the run
(:func:`fsobs.analysis.costfit.fit_points`, busy ns per sample) predicts ``P_rs`` from the
rank's samples; what it does not explain is a per-rank speed and a residual::

    B_rs = s_r · P_rs · eta_rs        s_r = median_s(B_rs / P_rs),   eta_rs = B_rs / (s_r P_rs)

**balance** re-splits every step's global batch with optim's own planner and the job's
partition cost model (:func:`partition_model`; :mod:`.splits`); the rank's new busy time is
``s_r · P(new share) · eta``, with ``eta`` resampled from the run's residuals
(:func:`noise_draws`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd

from fsobs.analysis.costfit import CostFit, fit_points, nonnegative_lstsq
from fsobs.analysis.pipeline import Analysis
from fsobs.errors import RunError
from fsobs.storage import Location
from optim.balance import CostModel

_EXACT = 1e-6
"""Relative residual under which a cost model reproduces the sidecar's ``est_cost``."""


def sample_lengths(sidecar: pd.DataFrame) -> dict[tuple[int, int], np.ndarray]:
    """Per (rank, step), the per-sample lengths the step sidecars list (a record with only the
    sums is left out; the last record of a (rank, step) wins)."""
    listed = sidecar[sidecar["seq_lengths"].notna().to_numpy()]
    keys = zip(listed["rank"].tolist(), listed["step"].tolist(), strict=True)
    return dict(zip(keys, listed["seq_lengths"], strict=True))


def rank_step_ns(
    steps: pd.DataFrame, column: str, ranks: list[int], step_ids: list[int]
) -> np.ndarray:
    """``[rank, step]`` ns of a ms column of ``Analysis.steps`` over ``ranks`` x ``step_ids``
    (0 where a rank has no such step)."""
    index = pd.MultiIndex.from_product([ranks, step_ids], names=["rank", "step"])
    values = steps.set_index(["rank", "step"])[column].reindex(index).fillna(0.0).to_numpy()
    return values.reshape(len(ranks), -1) * 1e6


def partition_model(sidecar: pd.DataFrame | None, fallback: CostModel) -> tuple[CostModel, str]:
    """The cost model the job split its batches with: the one that reproduces every rank's
    ``est_cost`` from its samples' ``n, ΣL, ΣL²`` (the job writes what its planner uses), else
    ``fallback`` (the model fitted on the busy time)."""
    if sidecar is not None and "est_cost" in sidecar and sidecar["est_cost"].notna().all():
        x = sidecar[["num_samples", "len_sum", "len_sq_sum"]].to_numpy(np.float64)
        y = sidecar["est_cost"].to_numpy(np.float64)
        if len(y) >= 3 and (y > 0).any():
            coef = nonnegative_lstsq(x, y)
            residual = np.abs(x @ coef - y).max() / np.abs(y).max()
            if coef.any() and residual < _EXACT:
                return CostModel(c0=coef[0], a=coef[1], b=coef[2]), "the run's own (est_cost)"
    return fallback, "fitted on this run's busy time"


@dataclass
class Calibration:
    """Arrays are ``[rank, step]`` over ``ranks`` x ``steps`` (the replay graph's)."""

    ranks: list[int]
    steps: list[int]
    busy_ns: np.ndarray
    """Measured busy time."""
    predicted_ns: np.ndarray
    """``P_rs``: the fitted cost model on the rank's samples."""
    speed: np.ndarray
    """``s_r`` per rank."""
    eta: np.ndarray
    """Residual factors."""
    contention_ns: np.ndarray
    fit: CostFit
    lengths: dict[tuple[int, int], np.ndarray]
    run_path: Location
    """The run's folder: an error names its step sidecars."""

    @property
    def residual_sigma(self) -> float:
        """Standard deviation of ``log(eta)``."""
        return float(np.std(np.log(self.eta)))

    def busy_for(self, predicted_ns: np.ndarray, eta: np.ndarray) -> np.ndarray:
        """``s_r · P · eta``."""
        return cast(np.ndarray, self.speed[:, None] * predicted_ns * eta)


def calibrate(analysis: Analysis, ranks: list[int], steps: list[int]) -> Calibration:
    """Fit the cost model on the run and split the busy time into speed and residuals."""
    index = pd.MultiIndex.from_product([ranks, steps], names=["rank", "step"])
    busy = rank_step_ns(analysis.steps, "busy_ms", ranks, steps)
    sidecar = analysis.run.sidecar
    if sidecar is None or sidecar.empty:
        raise RunError("the run has no step sidecars: no cost model to fit", path=analysis.run.path)
    fit = fit_points(analysis.steps, sidecar, path=analysis.run.path)
    side = sidecar.set_index(["rank", "step"])  # one row each (fsobs.analysis.partial)
    feats = side[["num_samples", "len_sum", "len_sq_sum"]].reindex(index).fillna(0.0)
    m = fit.model
    coef = np.array([m.c0, m.a, m.b])
    predicted = (feats.to_numpy(np.float64) @ coef).reshape(len(ranks), -1)
    ok = (predicted > 0) & (busy > 0)
    ratio = np.where(ok, busy / np.where(ok, predicted, 1.0), np.nan)
    speed = np.nanmedian(np.where(np.isnan(ratio).all(1, keepdims=True), 1.0, ratio), axis=1)
    eta = np.where(ok, ratio / speed[:, None], 1.0)
    return Calibration(
        ranks=ranks,
        steps=steps,
        busy_ns=busy,
        predicted_ns=predicted,
        speed=speed,
        eta=eta,
        contention_ns=rank_step_ns(analysis.steps, "contention_ms", ranks, steps),
        fit=fit,
        lengths=sample_lengths(sidecar),
        run_path=analysis.run.path,
    )


def noise_draws(cal: Calibration, draws: int, rng: np.random.Generator) -> np.ndarray:
    """``[draw, rank, step]`` residual factors: ``log eta = u_s + v_rs`` splits into what the
    ranks of a step share (``u_s``, the machine's pace that step: kept) and what differs between
    them (``v_rs``, centred per step: drawn with replacement from the run's own). Drawing whole
    ``eta`` would spread the ranks further apart than the run ever did."""
    log = np.log(cal.eta)
    common = log.mean(axis=0, keepdims=True)
    pool = (log - common).reshape(-1)
    spread = pool[rng.integers(len(pool), size=(draws, *cal.eta.shape))]
    return cast(np.ndarray, np.exp(common[None] + spread))
