"""Heavy-tailed user-history lengths: the presets the synthetic dataset draws from (no torch).

Public statistics imitated (interactions per user; NVIDIA/recsys-examples
``examples/hstu/training/README.md``, see ``shared/notes/freescale.md`` §3):

============  =======  ======  ======  ===========
dataset       max      mean    median  mean/median
============  =======  ======  ======  ===========
KuaiRand-1K    49,332   5,038   3,379  1.491
KuaiRand-27K  228,000  11,796   8,591  1.373
============  =======  ======  ======  ===========

A CPU cannot train on histories of thousands of events, so every preset keeps the *shape* of one
dataset (its mean/median ratio, and its max/median ratio as the cap) and scales the median down to
64-80 events. The shape parameters are solved from the mean/median ratio:

- ``lognormal`` (KuaiRand-1K): ``mean/median = exp(sigma²/2)`` gives ``sigma = 0.894``; median 64,
  so the public max scales to 64 · 49,332 / 3,379 ≈ 934, and the cap is 1024.
- ``powerlaw`` (KuaiRand-27K): Pareto I with ``mean/median = alpha/(alpha-1) / 2^(1/alpha)`` gives
  ``alpha = 2.098``; median 80 (``x_min = 57.5``), so the public max scales to
  80 · 228,000 / 8,591 ≈ 2,123, and the cap is 2048. A Pareto I has no draw below ``x_min``, so
  the shortest history is 57 events.
- ``uniform``: a light-tailed control, integers in [32, 96].

Draws above the cap are clipped to it (as a data pipeline truncates a history to its most recent
events), so a small spike sits at the cap. The ``median``/``p99``/``max`` fields of each preset were
measured on 100,000 draws with seed 0 and ``length_scale=1`` (``tests/unit/workload/test_data.py``
re-measures them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

import numpy as np

Distribution = Literal["lognormal", "powerlaw", "uniform"]
_REQUIRED_PARAMS: dict[str, tuple[str, ...]] = {
    "lognormal": ("median", "sigma"),
    "powerlaw": ("alpha", "x_min"),
    "uniform": ("low", "high"),
}


@dataclass(kw_only=True, frozen=True)
class LengthPreset:
    """A named distribution of per-sample history lengths, with its measured statistics."""

    name: str
    """Key in ``PRESETS``."""
    distribution: Distribution
    """``lognormal`` (params ``median``, ``sigma``), ``powerlaw`` (Pareto I: ``alpha``, ``x_min``)
    or ``uniform`` (integers in [``low``, ``high``])."""
    params: Mapping[str, float]
    """Parameters of the distribution before scaling (see ``distribution``)."""
    min_len: int
    """Shortest length after rounding (draws below are raised to it)."""
    cap: int
    """Longest length: draws above are clipped to it."""
    median: int
    """Median of 100k draws (seed 0, ``length_scale=1``)."""
    p99: int
    """99th percentile of the same draws."""
    max: int
    """Maximum of the same draws."""
    imitates: str
    """The public statistics this preset imitates, and how it was scaled down."""

    def __post_init__(self) -> None:
        if self.distribution not in _REQUIRED_PARAMS:
            raise ValueError(f"distribution: unknown {self.distribution!r}")
        missing = set(_REQUIRED_PARAMS[self.distribution]) - set(self.params)
        if missing:
            raise ValueError(f"params: {self.distribution} needs {sorted(missing)}")
        if self.min_len < 1:
            raise ValueError(f"min_len: must be >= 1, got {self.min_len}")
        if self.cap < self.min_len:
            raise ValueError(f"cap: must be >= min_len ({self.min_len}), got {self.cap}")
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))

    def draw(self, rng: np.random.Generator, size: int, scale: float = 1.0) -> np.ndarray:
        """``size`` lengths (int64): raw draws times ``scale``, rounded, clipped to the scaled
        [``min_len``, ``cap``] (both at least 1)."""
        if scale <= 0:
            raise ValueError(f"scale: must be > 0, got {scale}")
        raw = self._raw(rng, size)
        low = max(1, round(self.min_len * scale))
        high = max(low, round(self.cap * scale))
        return np.clip(np.rint(raw * scale), low, high).astype(np.int64)

    def _raw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        p = self.params
        if self.distribution == "lognormal":
            return rng.lognormal(math.log(p["median"]), p["sigma"], size)
        if self.distribution == "powerlaw":
            # Pareto I by inverse CDF: x_min · U^(-1/alpha), U in (0, 1].
            u = 1.0 - rng.random(size)
            return p["x_min"] * u ** (-1.0 / p["alpha"])
        return rng.integers(int(p["low"]), int(p["high"]) + 1, size).astype(np.float64)


def measure(preset: LengthPreset, num_draws: int = 100_000, seed: int = 0) -> dict[str, int]:
    """Median, p99 and max of ``num_draws`` draws (how the preset fields were measured)."""
    lengths = preset.draw(np.random.default_rng(seed), num_draws)
    return {
        "median": int(np.median(lengths)),
        "p99": int(np.percentile(lengths, 99)),
        "max": int(lengths.max()),
    }


_SIGMA_1K = math.sqrt(2 * math.log(5038 / 3379))  # 0.894
_ALPHA_27K = 2.0982  # solves alpha/(alpha-1) / 2^(1/alpha) = 11,796 / 8,591

PRESETS: Mapping[str, LengthPreset] = MappingProxyType(
    {
        "lognormal": LengthPreset(
            name="lognormal",
            distribution="lognormal",
            params={"median": 64.0, "sigma": _SIGMA_1K},
            min_len=1,
            cap=1024,
            median=64,
            p99=515,
            max=1024,
            imitates=(
                "KuaiRand-1K (max 49,332, mean 5,038, median 3,379): same mean/median ratio "
                "(sigma 0.894), median scaled 3,379 -> 64, max 49,332 -> ~934, capped at 1024"
            ),
        ),
        "powerlaw": LengthPreset(
            name="powerlaw",
            distribution="powerlaw",
            params={"alpha": _ALPHA_27K, "x_min": 80.0 / 2 ** (1 / _ALPHA_27K)},
            min_len=1,
            cap=2048,
            median=80,
            p99=524,
            max=2048,
            imitates=(
                "KuaiRand-27K (max 228,000, mean 11,796, median 8,591): Pareto I with the same "
                "mean/median ratio (alpha 2.098), median scaled 8,591 -> 80, max 228,000 -> "
                "~2,123, capped at 2048"
            ),
        ),
        "uniform": LengthPreset(
            name="uniform",
            distribution="uniform",
            params={"low": 32.0, "high": 96.0},
            min_len=32,
            cap=96,
            median=64,
            p99=96,
            max=96,
            imitates="nothing: a light-tailed control with the lognormal preset's median",
        ),
    }
)
