"""A/B comparison of two analyzed runs: bubble reduction of *test* against *control*
(docs/design.md §5).

The headline number, overall and per bubble class::

    bubble_reduction = 1 - bubble_ms_per_step(test) / bubble_ms_per_step(control)

with ``bubble_ms_per_step`` the KPI of :func:`fsobs.analysis.kpis` (mean over ranks and steps).
A class whose control value is below ``NEGLIGIBLE`` of the control's mean step window counts as
~0 and its reduction is NaN (a ratio of two tiny numbers says nothing).

Its confidence interval is a percentile bootstrap over steps: per run, the per-step bubble is the
mean over ranks; the steps of each run are resampled with replacement and the reduction is
recomputed per resample::

    control steps   b1  b2  b3  b4        resample  b3  b1  b3  b4   -> mean mc
    test steps      t1  t2  t3            resample  t2  t2  t1       -> mean mt
    reduction*  = 1 - mt / mc;   CI = percentiles (1-conf)/2 and (1+conf)/2 of reduction*

When both runs trained the same global batches on the same steps (``same_batches`` is True and
the traced steps are equal), step ``s`` of one run is paired with step ``s`` of the other and the
pairs are resampled together (``b3 t3, b1 t1, ...``): the batch content that makes some steps
slower in both runs then cancels, as it does in the point estimate. Otherwise the runs are
resampled independently (they need not have traced the same steps).

A reduction only means something when both runs trained on the same global batches; see
:func:`batch_check` for how that is checked. The interval covers the steps of this one pair of
runs, not run-to-run variation (another seed, another machine): for that, compare several pairs
(:mod:`fsobs.analysis.comparison.pairs`).

Per-role numbers need roles: a run whose collectives carry none (:func:`roles_known`: no
FreeScale markers, no process-group descriptions, no ``run.json`` process groups, so that every
collective falls back to ``other``) has unknown per-role numbers, NaN in ``by_role``, and the
comparison says so instead of setting a plain run's "other" against a labelled run's roles.
The warnings also name differences that make the two runs measure different things: world
size, device (CPU or GPU), simulated or measured, and toggles whose requested and applied
states disagree between the runs (:func:`toggle_warnings`).
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np
import pandas as pd

from fsobs.analysis.bubbles.parts import BUBBLE_CLASSES
from fsobs.analysis.bubbles.tables import ROLE_CLASSES, step_times
from fsobs.analysis.pipeline import EMBEDDING_TOTAL, Analysis
from fsobs.trace.schema import Run
from optim.markers import PEC_ROLES, ROLES

MIN_STEPS_FOR_CI = 2
"""Fewest steps on each side for an interval: the resamples of one step are that step."""
NEGLIGIBLE = 1e-3
"""A control value below this share of the control's mean step window counts as ~0."""
WORKLOAD_KEYS = ("data.seed", "batch_size", "data.preset", "data.num_samples", "model.size")
"""The ``run.json`` workload knobs that fix the global batches, with the world size (fallback
check; :meth:`~fsobs.runformat.runmeta.RunMeta.knob` reads older flat workloads too)."""
_TOTALS = ("num_samples", "len_sum", "len_sq_sum")
_BOOT_CHUNK = 1 << 20  # indices drawn at once by the bootstrap (bounds its memory)


@dataclass
class Comparison:
    """Control run against test run. Reductions are fractions (0.62 = 62% less bubble)."""

    control_name: str
    test_name: str
    kpis: pd.DataFrame
    """Index: every KPI of ``Analysis.summary``; columns ``control, test, delta`` (test -
    control) and ``ratio`` (test / control, NaN when the control is 0)."""
    bubble_reduction: float
    """``1 - bubble_ms_per_step(test) / bubble_ms_per_step(control)``; NaN when the control has
    ~0 bubble."""
    by_class: dict[str, float]
    """The same formula per class (``BUBBLE_CLASSES``); NaN when the control has ~0 of it."""
    bubble_reduction_ci: tuple[float, float]
    """Bootstrap confidence interval of ``bubble_reduction`` (see the module docstring)."""
    by_class_ci: dict[str, tuple[float, float]]
    """The same bootstrap per class (the same resampled steps' per-class values)."""
    by_role: pd.DataFrame
    """One row per (role, class) of :func:`fsobs.analysis.pipeline.kpis_by_role`: ``role, class,
    control, test`` (ms per rank and step), ``reduction``, ``ci_lo``, ``ci_hi``; PEC's roles
    and ``embedding_total`` only when either run has PEC's collectives. A run whose roles are
    unknown (:attr:`control_roles_known`, :attr:`test_roles_known`) has NaN in its column, and
    the row's reduction and interval are NaN."""
    confidence: float
    step_time_ratio: float
    """Median step time of test / control (step time: the longest window over the ranks)."""
    per_rank: pd.DataFrame
    """One row per rank of either run: ``rank`` and, for ``bubble_ms`` and every class
    ``<class>_ms``, the mean ms per step as ``<col>_control``, ``<col>_test``, ``<col>_delta``."""
    step_times: pd.DataFrame
    """Long format: ``run`` (``control`` / ``test``), ``step``, ``step_time_ms``."""
    control_roles_known: bool
    """Whether the control's collectives carry roles (:func:`roles_known`)."""
    test_roles_known: bool
    same_batches: bool | None
    """Whether both runs trained on the same global batches; None when it cannot be told."""
    batch_check: BatchCheck
    """How :attr:`same_batches` was judged: on what basis, over how many steps."""
    control_toggles: dict[str, Any] = field(default_factory=dict)
    """The control's ``run.json`` toggles (requested / applied / reason); {} without one."""
    test_toggles: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    not_comparable: str | None = None
    """Why the two runs' windows measure different things (one whole-trace window against
    steps: :func:`windows_differ`), or None; the numbers are computed all the same."""


def compare(
    control: Analysis,
    test: Analysis,
    *,
    confidence: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> Comparison:
    """Compare ``test`` against ``control``; deterministic for a given ``seed``."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence: must be in (0, 1), got {confidence}")
    if n_boot < 1:
        raise ValueError(f"n_boot: must be >= 1, got {n_boot}")
    check = batch_check(control.run, test.run)
    differ = windows_differ(control, test)
    same = check.same
    per_c, per_t = _per_step_means(control.steps), _per_step_means(test.steps)
    paired = bool(same) and per_c.index.equals(per_t.index)
    boot = _Bootstrap(NEGLIGIBLE * _mean_window(control.steps), confidence, n_boot, seed, paired)
    c, t = control.summary, test.summary
    known = (roles_known(control), roles_known(test))
    reductions = {
        name: boot.reduction(per_c[f"{name}_ms"], per_t[f"{name}_ms"])
        for name in ("bubble", *BUBBLE_CLASSES)
    }
    return Comparison(
        control_name=_name(control.run),
        test_name=_name(test.run),
        kpis=_kpi_table(c, t),
        bubble_reduction=reductions["bubble"][0],
        by_class={k: reductions[k][0] for k in BUBBLE_CLASSES},
        bubble_reduction_ci=reductions["bubble"][1],
        by_class_ci={k: reductions[k][1] for k in BUBBLE_CLASSES},
        by_role=_role_reductions(control, test, boot, known),
        confidence=confidence,
        step_time_ratio=_ratio(t["step_time_ms_p50"], c["step_time_ms_p50"]),
        per_rank=_per_rank(control.steps, test.steps),
        step_times=pd.concat(
            [_step_times(control.steps, "control"), _step_times(test.steps, "test")],
            ignore_index=True,
        ),
        control_roles_known=known[0],
        test_roles_known=known[1],
        same_batches=same,
        batch_check=check,
        control_toggles=_toggles(control.run),
        test_toggles=_toggles(test.run),
        warnings=(
            _run_warnings(control, test)
            + _role_warnings(known)
            + toggle_warnings(_toggles(control.run), _toggles(test.run))
            + check.warnings
            + ([f"not comparable: {differ}"] if differ else [])
        ),
        not_comparable=differ,
    )


def windows_differ(control: Analysis, test: Analysis) -> str | None:
    """Why the runs' windows cannot be set against each other, or None: a whole-trace window
    (the profiler's start and stop idle in it) on one side, steps on the other."""
    whole = (control.whole_trace, test.whole_trace)
    if whole[0] == whole[1]:
        return None
    one, other = ("control", "test") if whole[0] else ("test", "control")
    steps = (test if whole[0] else control).steps["step"].nunique()
    return (
        f"the {one} run is one whole-trace window (no ProfilerStep: the profiler's start and "
        f"stop idle are in it) and the {other} run has {steps} step(s); the reduction sets the "
        "one against the other"
    )


@dataclass
class _Bootstrap:
    """How :func:`compare` turns two per-step series into a reduction and its interval."""

    floor: float
    confidence: float
    n_boot: int
    seed: int
    paired: bool
    """Whether both runs trained the same batches on the same steps (steps resampled in pairs)."""

    def reduction(self, control: pd.Series, test: pd.Series) -> tuple[float, tuple[float, float]]:
        """``1 - mean(test) / mean(control)`` over steps and its bootstrap CI (NaNs when the
        control is ~0)."""
        point = _reduction(float(control.mean()), float(test.mean()), self.floor)
        if math.isnan(point):
            return point, (math.nan, math.nan)
        ci = bootstrap_reduction(
            control.to_numpy(),
            test.to_numpy(),
            paired=self.paired and control.index.equals(test.index),
            floor=self.floor,
            confidence=self.confidence,
            n_boot=self.n_boot,
            seed=self.seed,
        )
        return point, ci


def _role_reductions(
    control: Analysis, test: Analysis, boot: _Bootstrap, known: tuple[bool, bool]
) -> pd.DataFrame:
    """Reduction of each role's straggler wait and exposed communication, with its CI.

    The roles are :data:`~optim.markers.ROLES`, then PEC's roles that either run has (0 ms in
    the other, which had no such collectives) and, with those, ``embedding_total``: the sum of
    ``embedding`` and PEC's roles (:func:`fsobs.analysis.pipeline.kpis_by_role`), which compares a
    PEC run's whole embedding communication, its mask exchange included, with a plain run's.
    A run whose roles are not ``known`` gives NaN (and so does the reduction)."""
    rows = []
    per_c = _per_step_roles(control.roles) if known[0] else {}
    per_t = _per_step_roles(test.roles) if known[1] else {}
    present = {role for role, _ in (*per_c, *per_t)}
    pec = [role for role in PEC_ROLES if role in present]
    for per in (per_c, per_t):
        _add_embedding_total(per, pec)
    for role in (*ROLES, *pec, *([EMBEDDING_TOTAL] if pec else [])):
        for cls in ROLE_CLASSES:
            c, t = per_c.get((role, cls)), per_t.get((role, cls))
            if (known[0] and c is None) or (known[1] and t is None):
                continue  # a run with roles but without this one (no steps)
            point, (lo, hi) = boot.reduction(c, t) if c is not None and t is not None else _UNKNOWN
            rows.append(
                {
                    "role": role,
                    "class": cls,
                    "control": math.nan if c is None else float(c.mean()),
                    "test": math.nan if t is None else float(t.mean()),
                    "reduction": point,
                    "ci_lo": lo,
                    "ci_hi": hi,
                }
            )
    columns = ["role", "class", "control", "test", "reduction", "ci_lo", "ci_hi"]
    return pd.DataFrame(rows, columns=columns)


_UNKNOWN = (math.nan, (math.nan, math.nan))
"""The reduction and interval of a role that one run cannot tell."""


def roles_known(analysis: Analysis) -> bool:
    """Whether the run's collectives carry roles: some matched collective has one other than
    ``other``, the role every unlabelled collective falls back to
    (:func:`fsobs.analysis.collectives.matching.match_collectives`). A FreeScale run labels
    torchrec's
    embedding collectives and DDP's all-reduce, so a run with only ``other`` has no labels to
    go by (a run whose only labels were FreeScale's ``other`` counts as unknown too: rare, and
    its roles then say no more than its classes). A run without matched collectives counts as
    known: it has no wait to split, and 0 ms is every role's exact share."""
    instances = analysis.collectives.instances
    if instances.empty:
        return True
    return bool((instances["role"].astype(str) != "other").any())


def _role_warnings(known: tuple[bool, bool]) -> list[str]:
    """The line saying whose per-role numbers are unknown (none when both runs have roles)."""
    why = "(no FreeScale markers, process-group descriptions or run.json process groups)"
    if not any(known):
        return [f"neither run's collectives carry roles {why}: the per-role numbers are unknown"]
    if all(known):
        return []
    side = "test" if known[0] else "control"
    return [f"the {side} run's collectives carry no roles {why}: its per-role numbers are unknown"]


def _add_embedding_total(per: dict[tuple[str, str], pd.Series], pec: list[str]) -> None:
    """Fill in, for ``pec`` roles a run lacks, 0 ms on each of its steps, and with them its
    ``embedding_total`` (nothing for a run without steps)."""
    if not pec or ("embedding", ROLE_CLASSES[0]) not in per:
        return
    for cls in ROLE_CLASSES:
        embedding = per["embedding", cls]
        for role in pec:
            per.setdefault((role, cls), embedding * 0.0)
        per[EMBEDDING_TOTAL, cls] = sum((per[role, cls] for role in pec), embedding)


def _per_step_roles(roles: pd.DataFrame) -> dict[tuple[str, str], pd.Series]:
    """(role, class) -> per step (the index), the mean ms over the ranks."""
    if roles.empty:
        return {}
    means = roles.groupby(["role", "step"])[[f"{c}_ms" for c in ROLE_CLASSES]].mean()
    return {
        (str(role), cls): means.loc[role, f"{cls}_ms"].astype(np.float64)
        for role in means.index.get_level_values("role").unique()
        for cls in ROLE_CLASSES
    }


def bootstrap_reduction(
    control: np.ndarray,
    test: np.ndarray,
    *,
    paired: bool = False,
    floor: float = 0.0,
    confidence: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap CI of ``1 - mean(test) / mean(control)`` over per-step values.

    Each run's values are resampled with replacement, independently, or with ``paired`` (equal
    lengths: ``control[i]`` and ``test[i]`` are the same step) the same indices for both;
    resamples whose control mean is ``<= floor`` are left out. ``(nan, nan)`` when a run has
    fewer than :data:`MIN_STEPS_FOR_CI` steps (every resample of one step is that step: an
    interval of width 0 that says nothing).
    """
    if min(len(control), len(test)) < MIN_STEPS_FOR_CI:
        return (math.nan, math.nan)
    if paired and len(control) != len(test):
        raise ValueError(f"paired: {len(control)} control steps but {len(test)} test steps")
    rng = np.random.default_rng(seed)
    if paired:
        both = np.stack([np.asarray(control, np.float64), np.asarray(test, np.float64)])
        mc, mt = _boot_means(both, n_boot, rng)
    else:
        mc = _boot_means(np.asarray(control, np.float64), n_boot, rng)
        mt = _boot_means(np.asarray(test, np.float64), n_boot, rng)
    ok = mc > floor
    if not ok.any():
        return (math.nan, math.nan)
    reduction = 1.0 - mt[ok] / mc[ok]
    alpha = (1.0 - confidence) / 2
    lo, hi = np.quantile(reduction, [alpha, 1.0 - alpha])
    return (float(lo), float(hi))


def _boot_means(values: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Means of ``n_boot`` resamples (with replacement, same size) of ``values`` along its last
    axis; the rows of a 2-D ``values`` share the resampled indices (shape ``(rows, n_boot)``)."""
    n = values.shape[-1]
    rows = max(1, _BOOT_CHUNK // n)
    out = []
    for start in range(0, n_boot, rows):
        idx = rng.integers(0, n, size=(min(rows, n_boot - start), n))
        out.append(values[..., idx].mean(axis=-1))
    return np.concatenate(out, axis=-1)


BASES = ("digest", "sample_ids", "totals", "run_json", "none")
"""What :func:`batch_check` can judge by, strongest first."""
_WHAT = {
    "digest": "batch digests",
    "sample_ids": "sample ids",
    "totals": "batch totals (samples, sum of lengths, sum of squared lengths)",
}
"""How a per-step basis is named in a warning."""


@dataclass(frozen=True, kw_only=True)
class BatchCheck:
    """How :func:`batch_check` told whether two runs trained on the same global batches."""

    same: bool | None
    """The answer; None when it cannot be told."""
    basis: str
    """One of :data:`BASES`: ``digest`` (the sidecars' ``batch_digest``), ``sample_ids``
    (the ids the ranks trained, all ranks together), ``totals`` (the ranks' sums of
    ``num_samples``, ``len_sum`` and ``len_sq_sum``), ``run_json`` (the workload in
    ``run.json``) or ``none``."""
    window: int = 1
    """Steps per compared unit: 1 (steps), or the ``lcm`` of the runs' balance windows."""
    checked: list[int] = field(default_factory=list)
    """The steps (windows, with ``window > 1``) both runs have on this basis: what was
    compared (empty for ``run_json`` and ``none``)."""
    differing: list[int] = field(default_factory=list)
    """The compared steps (windows) whose batches differ."""
    skipped: list[str] = field(default_factory=list)
    """Why each stronger basis could not decide (``"the test's sidecars have no sample
    ids"``); empty when the strongest one did."""
    warnings: list[str] = field(default_factory=list)
    """What the comparison warns: other batches, or that it cannot tell."""

    def to_json(self) -> dict[str, Any]:
        """The ``same_batches_check`` object of ``fsobs compare --json``."""
        return {
            "same": self.same,
            "basis": self.basis,
            "unit": "window" if self.window > 1 else "step",
            "window_steps": self.window,
            "checked": len(self.checked),
            "differing": len(self.differing),
            "first_differing": self.differing[0] if self.differing else None,
            "weaker_because": list(self.skipped),
        }


def batch_check(control: Run[Any], test: Run[Any]) -> BatchCheck:
    """Did both runs train on the same global batches, and how that was told.

    Checked in this order; the first check that both runs support and that finds steps in
    common decides:

    1. both sidecars have ``batch_digest`` values: the digests of the steps they share;
    2. both sidecars list ``sample_ids``: per step, the ids of all ranks together (a
       multiset: where a sample went does not matter), over the shared steps whose every
       rank listed them;
    3. both runs have sidecars: per step, the totals over the ranks of ``num_samples``,
       ``len_sum`` and ``len_sq_sum`` (invariant when samples move between ranks), over the
       shared steps that every rank of each run logged;
    4. both ``run.json`` have a workload: its ``WORKLOAD_KEYS`` present in both;
    5. otherwise None (cannot be told).

    A run that balanced with a window (``run.json`` workload ``freescale.balance.window`` =
    ``K`` > 1,
    :mod:`optim.window`) moves samples between the ``K`` steps of each window, so its steps'
    batches differ from the baseline's while each window's samples are the same: checks 1 to 3
    then become checks 2 and 3 over each window of ``lcm(K_control, K_test)`` steps from step
    0 (the ids, else the totals, of its steps together), over the windows whose every step both
    runs logged on every rank.
    """
    window = math.lcm(_window(control), _window(test))
    checks: tuple[tuple[str, Callable[[Run[Any]], pd.Series | None]], ...] = (
        ("digest", _digests),
        ("sample_ids", _ids),
        ("totals", _totals),
    )
    if window > 1:
        checks = tuple(
            (basis, functools.partial(_per_window, per_step=per_step, window=window))
            for basis, per_step in (("sample_ids", _step_ids), ("totals", _totals))
        )
    skipped: list[str] = []
    for basis, per_step in checks:
        a, b = per_step(control), per_step(test)
        if a is not None and b is not None and len(common := a.index.intersection(b.index)):
            checked = [int(s) for s in common]
            differ = [s for s in checked if a[s] != b[s]]
            check = BatchCheck(
                same=not differ,
                basis=basis,
                window=window,
                checked=checked,
                differing=differ,
                skipped=skipped,
            )
            return replace(check, warnings=_differ_warning(check)) if differ else check
        why = _why_not(basis, (control, test), (a is not None, b is not None))
        skipped += [why] if why not in skipped else []
    same, warnings = _same_workload(control, test)
    basis = "run_json" if same is not None else "none"
    return BatchCheck(same=same, basis=basis, window=window, skipped=skipped, warnings=warnings)


def _why_not(basis: str, runs: tuple[Run[Any], Run[Any]], has: tuple[bool, bool]) -> str:
    """Why ``basis`` could not decide: what each run lacks (its step sidecars, or the field
    ``basis`` reads), or that no step has it in both runs."""
    if all(has):
        every = "" if basis == "digest" else " of every rank"
        return f"no step has {_LACKS[basis]}{every} in both runs"
    lacks = [
        None if ok else _LACKS[basis if _has_sidecar(run) else "totals"]
        for run, ok in zip(runs, has, strict=True)
    ]
    if lacks[0] == lacks[1]:
        return f"neither run has {lacks[0]}"
    return ", ".join(
        f"the {side} run has no {what}"
        for side, what in zip(("control", "test"), lacks, strict=True)
        if what is not None
    )


_LACKS = {"digest": "batch digests", "sample_ids": "sample ids", "totals": "step sidecars"}


def _has_sidecar(run: Run[Any]) -> bool:
    return run.sidecar is not None and not run.sidecar.empty


def _differ_warning(check: BatchCheck) -> list[str]:
    """The line saying that (and where) the batches differ."""
    what = _WHAT[check.basis]
    if check.window > 1:
        what = f"{what.split(' (')[0]} over each window of {check.window} steps"
    unit = "windows" if check.window > 1 else "steps"
    first = f"{'window' if check.window > 1 else 'step'} {check.differing[0]}"
    return [
        f"the runs did not see the same global batches: {what} differ in "
        f"{len(check.differing)} of {len(check.checked)} common {unit} (first: {first})"
    ]


def _window(run: Run[Any]) -> int:
    """The balance window the run trained with: ``run.json`` workload
    ``freescale.balance.window`` (1 without one)."""
    value = run.meta.knob("freescale.balance.window") if run.meta is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def _per_window(
    run: Run[Any], *, per_step: Callable[[Run[Any]], pd.Series | None], window: int
) -> pd.Series | None:
    """Window number -> the steps' values of ``per_step`` over its ``window`` steps together
    (a sum of totals, a digest of the ids), for the windows whose every step ``per_step``
    has; None where ``per_step`` is."""
    values = per_step(run)
    if values is None:
        return None
    steps = pd.Series(values.index, index=values.index)
    full = steps.groupby(steps // window).count() == window
    out = {int(w): _pool(list(group)) for w, group in values.groupby(steps // window) if full[w]}
    return pd.Series(out, dtype=object)


def _pool(values: list[Any]) -> Any:
    """The value of several steps together: totals summed, ids joined and digested."""
    if isinstance(values[0], tuple):
        return tuple(int(sum(v)) for v in zip(*values, strict=True))
    return _id_digest(np.concatenate(values))


def _digests(run: Run[Any]) -> pd.Series | None:
    """Step -> the sorted tuple of batch digests the ranks logged; None without digests."""
    side = run.sidecar
    if side is None or "batch_digest" not in side or side["batch_digest"].isna().all():
        return None
    side = side.dropna(subset=["batch_digest"])
    return side.groupby("step")["batch_digest"].agg(lambda s: tuple(sorted(set(s))))


def _ids(run: Run[Any]) -> pd.Series | None:
    """Step -> a digest of the ids every rank listed in it (:func:`_step_ids`)."""
    ids = _step_ids(run)
    return None if ids is None else ids.map(_id_digest)


def _step_ids(run: Run[Any]) -> pd.Series | None:
    """Step -> the ids every rank of the run listed in it, as one int64 array, for the steps
    whose every rank listed them (the last record of a (rank, step) wins); None without
    ``sample_ids``."""
    side = run.sidecar
    if side is None or "sample_ids" not in side or side["sample_ids"].isna().all():
        return None
    listed = side[side["sample_ids"].notna().to_numpy()]
    listed = listed.drop_duplicates(["rank", "step"], keep="last")
    grouped = listed.groupby("step")["sample_ids"]
    full = grouped.count() == run.world_size
    joined = {cast(int, step): np.concatenate(list(ids)) for step, ids in grouped if full[step]}
    return pd.Series(joined, dtype=object)


def _id_digest(ids: np.ndarray) -> str:
    """A digest of the multiset ``ids`` (sorted first: where each sample went does not count)."""
    data = np.sort(np.asarray(ids, dtype=np.int64))
    return hashlib.blake2b(data.tobytes(), digest_size=16).hexdigest()


def _totals(run: Run[Any]) -> pd.Series | None:
    """Step -> (Σ num_samples, Σ len_sum, Σ len_sq_sum) over the ranks, for the steps that every
    rank of the run logged; None without sidecars."""
    side = run.sidecar
    if side is None or side.empty:
        return None
    grouped = side.groupby("step")
    full = grouped["rank"].nunique() == run.world_size
    sums = grouped[list(_TOTALS)].sum()[full]
    return pd.Series([tuple(int(v) for v in row) for row in sums.to_numpy()], index=sums.index)


def _same_workload(control: Run[Any], test: Run[Any]) -> tuple[bool | None, list[str]]:
    a, b = _workload(control), _workload(test)
    keys = [k for k in (*WORKLOAD_KEYS, "world_size") if k in a and k in b]
    if not keys:
        return None, [
            "cannot tell whether the runs saw the same global batches "
            "(no step sidecars and no workload in run.json)"
        ]
    differ = [f"{k} ({a[k]!r} vs {b[k]!r})" for k in keys if a[k] != b[k]]
    if not differ:
        return True, []
    return False, [
        "the runs did not see the same global batches: run.json workload differs in "
        + ", ".join(differ)
    ]


def _toggles(run: Run[Any]) -> dict[str, dict[str, Any]]:
    """The toggles of ``run.json`` as plain objects (what the report shows and writes)."""
    return {k: t.to_json() for k, t in run.meta.toggles.items()} if run.meta is not None else {}


def toggle_warnings(control: dict[str, Any], test: dict[str, Any]) -> list[str]:
    """What the runs' toggles (``run.json``'s objects, as :attr:`Comparison.control_toggles`)
    say about the comparison, one line per toggle where it matters:

    - requested in one run only, but applied in neither: the runs do not differ in it;
    - requested in both, applied in one only: they differ in it although they asked alike;
    - applied in one run and not recorded in the other's ``run.json``: cannot be checked.

    A toggle requested and applied in one run only is what an A/B measures: no line. Nothing
    when neither run records toggles."""
    out = []
    for name in [*control, *(k for k in test if k not in control)]:
        c, t = control.get(name), test.get(name)
        if c is None or t is None:
            side, other = ("control", "test") if c is not None else ("test", "control")
            if (c or t or {}).get("applied"):
                out.append(f"{name} is applied in the {side} and not recorded in the {other}")
            continue
        if c["requested"] != t["requested"] and c["applied"] == t["applied"]:
            side, status = ("control", c) if c["requested"] else ("test", t)
            out.append(
                f"{name} was requested in the {side} only and applied in neither ({side}: "
                f"{status['reason']}): the comparison does not measure it"
            )
        elif c["requested"] == t["requested"] and c["applied"] != t["applied"]:
            side, other, status = ("control", "test", t) if c["applied"] else ("test", "control", c)
            out.append(
                f"{name} was requested in both runs but applied only in the {side} ({other}: "
                f"{status['reason']}): the runs differ in it although they asked alike"
            )
    return out


def _workload(run: Run[Any]) -> dict[str, Any]:
    """The world size and the :data:`WORKLOAD_KEYS` that ``run.json`` records."""
    meta = run.meta
    if meta is None or not meta.workload:
        return {}
    world_size = meta.world_size if meta.world_size is not None else run.world_size
    knobs = {key: meta.knob(key) for key in WORKLOAD_KEYS}
    return {"world_size": world_size} | {k: v for k, v in knobs.items() if v is not None}


def _run_warnings(control: Analysis, test: Analysis) -> list[str]:
    """World sizes, devices, simulated against measured, incomplete runs, runs without steps."""
    out = []
    cw, tw = control.run.world_size, test.run.world_size
    if cw != tw:
        out.append(f"world sizes differ: control {cw}, test {tw}")
    cd, td = control.run.device, test.run.device
    if cd != td:
        out.append(
            f"devices differ: control {cd}, test {td} (busy time is the GPU's on a GPU run, the "
            "training thread's on a CPU run)"
        )
    simulated = [a.run.meta is not None and a.run.meta.simulated for a in (control, test)]
    if simulated[0] != simulated[1]:
        out.append(
            f"the {'control' if simulated[0] else 'test'} run is simulated and the other is not"
        )
    for role, analysis in (("control", control), ("test", test)):
        out.extend(_run_state(role, analysis))
    if set(control.steps["step"]) != set(test.steps["step"]):
        out.append("the runs traced different steps (each run's steps are resampled on their own)")
    return out


def _run_state(role: str, analysis: Analysis) -> list[str]:
    run, meta = analysis.run, analysis.run.meta
    out = []
    incomplete = meta is not None and meta.status == "incomplete"
    loaded = len(run.ranks) + len(analysis.gaps.left_out)  # left out: said below
    if incomplete or loaded < run.world_size:
        reason = (meta and meta.reason) or "some ranks are missing"
        out.append(
            f"the {role} run is incomplete ({reason}; {loaded} of {run.world_size} ranks loaded)"
        )
    if analysis.steps.empty:
        out.append(f"the {role} run has no step with a bubble breakdown")
    out.extend(f"the {role} run: {line}" for line in analysis.gaps.lines)
    return out


def _name(run: Run[Any]) -> str:
    name = run.meta.name if run.meta is not None else None
    return name or run.path.name


def _mean_window(steps: pd.DataFrame) -> float:
    return float(steps["window_ms"].mean()) if len(steps) else 0.0


def _per_step_means(steps: pd.DataFrame) -> pd.DataFrame:
    """Per step (the index), the mean over the ranks (ms) of the bubble and of each class;
    their means over the steps are the ``*_ms_per_step`` KPIs."""
    cols = ["bubble_ms", *(f"{k}_ms" for k in BUBBLE_CLASSES)]
    return steps.groupby("step")[cols].mean().astype(np.float64)


def _step_times(steps: pd.DataFrame, role: str) -> pd.DataFrame:
    """:func:`fsobs.analysis.pipeline.step_times` in long format, tagged with ``role``."""
    times = step_times(steps).reset_index()
    times.insert(0, "run", role)
    return times[["run", "step", "step_time_ms"]]


def _reduction(control: float, test: float, floor: float) -> float:
    """``1 - test / control``; NaN when the control is NaN or ``<= floor``."""
    if not control > floor:
        return math.nan
    return 1.0 - test / control


def _ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``; NaN when the denominator is 0 or NaN."""
    if not denominator or math.isnan(denominator):
        return math.nan
    return numerator / denominator


def _kpi_table(control: dict[str, float], test: dict[str, float]) -> pd.DataFrame:
    names = list(control) + [k for k in test if k not in control]
    rows = []
    for name in names:
        c, t = control.get(name, math.nan), test.get(name, math.nan)
        rows.append({"control": c, "test": t, "delta": t - c, "ratio": _ratio(t, c)})
    return pd.DataFrame(rows, index=pd.Index(names, name="kpi"), dtype=np.float64)


def _per_rank(control: pd.DataFrame, test: pd.DataFrame) -> pd.DataFrame:
    cols = ["bubble_ms", *(f"{k}_ms" for k in BUBBLE_CLASSES)]
    c = control.groupby("rank")[cols].mean()
    t = test.groupby("rank")[cols].mean()
    out = pd.DataFrame(index=c.index.union(t.index).rename("rank"))
    for col in cols:
        out[f"{col}_control"] = c[col]
        out[f"{col}_test"] = t[col]
        out[f"{col}_delta"] = t[col] - c[col]
    return out.reset_index()
