"""What a what-if returns (:func:`fsobs.analysis.whatif.predict.whatif`): typed, every field
documented. Fractions are shares (0.25 = 25%); ``*_ms`` / ``*_ns`` fields are times in ms / ns;
``*_per_step`` values are means per rank and step. Every number is a prediction from the
baseline run alone, except those of :class:`WhatIfRun`, the ``baseline`` and the
:class:`ReplayCheck`'s errors, which describe the run itself."""

from __future__ import annotations

from dataclasses import dataclass, field

from fsobs.analysis.whatif.bounds import BoundSummary
from optim.balance import CostModel


@dataclass(frozen=True, kw_only=True)
class WhatIfRun:
    """The baseline run the what-if replays."""

    path: str
    """The run's path as given (``""`` for a run not read from disk)."""
    name: str
    """``run.json``'s ``name``, else the run folder's name."""
    world_size: int
    device: str
    """``cpu`` or ``gpu``."""
    simulated: bool
    """True for a run written by :mod:`fsobs.simulate`."""
    num_steps: int
    """Steps in the replay graph (every rank has them)."""
    num_ranks: int
    """Ranks in the replay graph."""


@dataclass(frozen=True, kw_only=True)
class ReplayCheck:
    """How closely the unchanged graph's replay gives back the measured run
    (:func:`fsobs.analysis.whatif.replay.replay_error`); errors are fractions."""

    step_time_median: float
    """Median over steps of ``|t' - t| / t``, ``t`` the step time (its longest window)."""
    step_time_p90: float
    step_time_max: float
    classes_median: float
    """Median over every class of every rank and step of ``|c' - c| / window``."""
    classes_p90: float
    classes_max: float
    num_steps: int
    """Steps compared."""
    gate: dict[str, float]
    """The largest error allowed per key above (``REPLAY_GATE``)."""
    passed: bool
    """Every error of ``gate`` within its limit: the predictions can be trusted."""
    baseline_resampled_bubble_ms_per_step: float
    """The baseline's bubble replayed under the noise draws (median over draws): what the
    predictions' absolute figures compare with."""


@dataclass(frozen=True, kw_only=True)
class FittedCost:
    """The per-sample cost model fitted on the run's busy time: ``c(L) = c0 + a·L + b·L²``."""

    c0_ns: float
    a_ns: float
    """Per unit of sample length."""
    b_ns: float
    """Per squared unit of sample length."""
    r2: float
    """Share of the busy time's variance the model explains (NaN when undefined)."""


@dataclass(frozen=True, kw_only=True)
class ResplitEffect:
    """What the ``balance`` toggle's re-split does, by the cost model."""

    balance_split: str
    """The toggle's mode: ``kk``, ``lpt``, ``kk-unequal`` or ``window:K``
    (:mod:`fsobs.analysis.whatif.splits`)."""
    imbalance_before: float
    """Mean over steps of max / mean partition cost of the recorded split."""
    imbalance_after: float
    """The same of the planner's split."""
    planner_ms: float
    """Planning time per step added to every rank's step (0 on a GPU run)."""


@dataclass(frozen=True, kw_only=True)
class WhatIfCalibration:
    """Each rank's busy time fitted to its data (:mod:`fsobs.analysis.whatif.calibration`)."""

    cost_fit: FittedCost
    rank_speed: dict[int, float]
    """Rank -> ``s_r``, its speed factor on the fitted cost."""
    residual_sigma: float
    """Standard deviation of ``log(eta)``, the residual noise the draws resample."""
    partition_model: CostModel | None = None
    """The job's own cost model (the balancer's), if the run has one."""
    resplit: ResplitEffect | None = None
    """Set when ``balance`` is predicted."""


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """One combination of toggles, predicted (never measured)."""

    toggles: tuple[str, ...]
    bubble_ms_per_step: float
    bubble_reduction: float
    """``1 - bubble(toggles) / bubble(baseline)``, median over the draws."""
    bubble_reduction_interval: tuple[float, float]
    by_class: dict[str, dict[str, float]]
    """class -> ``{"ms_per_step", "reduction"}``."""
    step_time_ms_p50: float
    step_time_ms_p50_interval: tuple[float, float]
    same_noise_reduction: float
    """The reduction with the run's own residuals, not resampled."""


@dataclass(frozen=True, kw_only=True)
class Oracle:
    """Equal compute on every rank in every step (the step's mean busy time), no toggle; and
    the straggler wait split between the data and the noise."""

    bubble_ms_per_step: float
    bubble_reduction: float
    """Against the measured (unresampled) baseline replay."""
    bubble_reduction_interval: tuple[float, float]
    """Over the steps resampled."""
    by_class: dict[str, float]
    """class -> ms per rank and step left."""
    step_time_ms_p50: float
    straggler_wait_ms_per_step: float
    """The baseline's straggler wait, replayed."""
    wait_from_data_ms_per_step: float | None = None
    """The straggler wait if only the data differed between the ranks (None: no calibration,
    then also for the fields below). A counterfactual, not a part of
    :attr:`straggler_wait_ms_per_step`: where the data and the noise partly offset each other
    on a rank, either alone spreads the ranks further than both together did, and its wait
    exceeds the run's (:attr:`data_part_ms_per_step` is the part)."""
    wait_from_noise_ms_per_step: float | None = None
    """The straggler wait if only the noise (``s_r · eta``) differed between the ranks; a
    counterfactual like the one above (:attr:`noise_part_ms_per_step` is the part)."""
    data_share: float | None = None
    """``data / (data + noise)`` of the two waits above, in [0, 1] (NaN when both are 0)."""
    data_part_ms_per_step: float | None = None
    """The data's part of :attr:`straggler_wait_ms_per_step`: the wait times
    :attr:`data_share`. A part of it by definition, so never above it."""
    noise_part_ms_per_step: float | None = None
    """The noise's part: the wait times ``1 - data_share`` (the wait less the data's part)."""


@dataclass(frozen=True, kw_only=True)
class WhatIf:
    """The what-if of one baseline run (see :mod:`fsobs.analysis.whatif.predict`)."""

    run: WhatIfRun
    baseline: dict[str, float]
    """Measured: ``bubble_ratio``, ``bubble_ms_per_step``, ``step_time_ms_p50``,
    ``step_time_ms_p90``, ``<class>_ms_per_step``, ``busy_ms_per_step``."""
    replay: ReplayCheck
    calibration: WhatIfCalibration | None
    """None when the run has no step sidecars (then ``balance`` cannot be predicted)."""
    predictions: list[Prediction]
    """Every non-empty combination of the toggles, in order."""
    oracle: Oracle
    split_bound: BoundSummary | None = None
    """The imbalance no split inside a step can beat, beside the oracle's equal compute (which
    no split reaches in a step with a whale); None without per-sample lengths."""
    notes: list[str] = field(default_factory=list)
    draws: int = 0
    """Noise draws each prediction took."""
    confidence: float = 0.95
    """Of the intervals."""
