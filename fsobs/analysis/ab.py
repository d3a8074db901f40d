"""A/B comparison of two analyzed runs: bubble reduction of *test* against *control* (DESIGN §5).

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
:func:`same_batches` for how that is checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from fsobs.analysis.bubbles.parts import BUBBLE_CLASSES
from fsobs.analysis.bubbles.tables import ROLE_CLASSES, step_times
from fsobs.analysis.pipeline import EMBEDDING_TOTAL, Analysis
from fsobs.trace.schema import Run
from optim.markers import PEC_ROLES, ROLES

NEGLIGIBLE = 1e-3
"""A control value below this share of the control's mean step window counts as ~0."""
WORKLOAD_KEYS = ("seed", "batch_size", "preset", "num_samples", "model_size", "world_size")
"""The ``run.json`` workload keys that fix the global batches (fallback check)."""
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
    """One row per (role, class) of :func:`fsobs.analysis.pipeline.by_role`: ``role, class,
    control, test`` (ms per rank and step), ``reduction``, ``ci_lo``, ``ci_hi``; PEC's roles
    and ``embedding_total`` only when either run has PEC's collectives."""
    confidence: float
    step_time_ratio: float
    """Median step time of test / control (step time: the longest window over the ranks)."""
    per_rank: pd.DataFrame
    """One row per rank of either run: ``rank`` and, for ``bubble_ms`` and every class
    ``<class>_ms``, the mean ms per step as ``<col>_control``, ``<col>_test``, ``<col>_delta``."""
    step_times: pd.DataFrame
    """Long format: ``run`` (``control`` / ``test``), ``step``, ``step_time_ms``."""
    same_batches: bool | None
    """Whether both runs trained on the same global batches; None when it cannot be told."""
    control_toggles: dict[str, Any] = field(default_factory=dict)
    """The control's ``run.json`` toggles (requested / applied / reason); {} without one."""
    test_toggles: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


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
    same, batch_warnings = same_batches(control.run, test.run)
    per_c, per_t = _per_step_means(control.steps), _per_step_means(test.steps)
    paired = bool(same) and per_c.index.equals(per_t.index)
    boot = _Bootstrap(NEGLIGIBLE * _mean_window(control.steps), confidence, n_boot, seed, paired)
    c, t = control.summary, test.summary
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
        by_role=_role_reductions(control, test, boot),
        confidence=confidence,
        step_time_ratio=_ratio(t["step_time_ms_p50"], c["step_time_ms_p50"]),
        per_rank=_per_rank(control.steps, test.steps),
        step_times=pd.concat(
            [_step_times(control.steps, "control"), _step_times(test.steps, "test")],
            ignore_index=True,
        ),
        same_batches=same,
        control_toggles=_toggles(control.run),
        test_toggles=_toggles(test.run),
        warnings=_run_warnings(control, test) + batch_warnings,
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


def _role_reductions(control: Analysis, test: Analysis, boot: _Bootstrap) -> pd.DataFrame:
    """Reduction of each role's straggler wait and exposed communication, with its CI.

    The roles are :data:`~optim.markers.ROLES`, then PEC's roles that either run has (0 ms in
    the other, which had no such collectives) and, with those, ``embedding_total``: the sum of
    ``embedding`` and PEC's roles (:func:`fsobs.analysis.pipeline.by_role`), which compares a
    PEC run's whole embedding communication, its mask exchange included, with a plain run's."""
    rows = []
    per_c, per_t = _per_step_roles(control.roles), _per_step_roles(test.roles)
    present = {role for role, _ in (*per_c, *per_t)}
    pec = [role for role in PEC_ROLES if role in present]
    for per in (per_c, per_t):
        _add_embedding_total(per, pec)
    for role in (*ROLES, *pec, *([EMBEDDING_TOTAL] if pec else [])):
        for cls in ROLE_CLASSES:
            c, t = per_c.get((role, cls)), per_t.get((role, cls))
            if c is None or t is None:
                continue
            point, (lo, hi) = boot.reduction(c, t)
            rows.append(
                {
                    "role": role,
                    "class": cls,
                    "control": float(c.mean()),
                    "test": float(t.mean()),
                    "reduction": point,
                    "ci_lo": lo,
                    "ci_hi": hi,
                }
            )
    columns = ["role", "class", "control", "test", "reduction", "ci_lo", "ci_hi"]
    return pd.DataFrame(rows, columns=columns)


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
    no step.
    """
    if len(control) == 0 or len(test) == 0:
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


def same_batches(control: Run[Any], test: Run[Any]) -> tuple[bool | None, list[str]]:
    """Did both runs train on the same global batches? ``(answer, warnings)``.

    Checked in this order; the first check that both runs support and that finds steps in
    common decides:

    1. both sidecars have ``batch_digest`` values: the digests of the steps they share;
    2. both runs have sidecars: per step, the totals over the ranks of ``num_samples``,
       ``len_sum`` and ``len_sq_sum`` (invariant when samples move between ranks), over the
       shared steps that every rank of each run logged;
    3. both ``run.json`` have a workload: its ``WORKLOAD_KEYS`` present in both;
    4. otherwise None (cannot be told).
    """
    checks = (
        (_digests, "batch digests"),
        (_totals, "batch totals (samples, sum of lengths, sum of squared lengths)"),
    )
    for per_step, what in checks:
        a, b = per_step(control), per_step(test)
        if a is None or b is None:
            continue
        common = a.index.intersection(b.index)
        if len(common):
            differ = [int(s) for s in common if a[s] != b[s]]
            if not differ:
                return True, []
            return False, [
                f"the runs did not see the same global batches: {what} differ in "
                f"{len(differ)} of {len(common)} common steps (first: step {differ[0]})"
            ]
    return _same_workload(control, test)


def _digests(run: Run[Any]) -> pd.Series | None:
    """Step -> the sorted tuple of batch digests the ranks logged; None without digests."""
    side = run.sidecar
    if side is None or "batch_digest" not in side or side["batch_digest"].isna().all():
        return None
    side = side.dropna(subset=["batch_digest"])
    return side.groupby("step")["batch_digest"].agg(lambda s: tuple(sorted(set(s))))


def _totals(run: Run[Any]) -> pd.Series | None:
    """Step -> (Σ num_samples, Σ len_sum, Σ len_sq_sum) over the ranks, for the steps that every
    rank of the run logged; None without sidecars."""
    side = run.sidecar
    if side is None or side.empty:
        return None
    side = side.drop_duplicates(["rank", "step"], keep="last")
    grouped = side.groupby("step")
    full = grouped["rank"].nunique() == run.world_size
    sums = grouped[list(_TOTALS)].sum()[full]
    return pd.Series([tuple(int(v) for v in row) for row in sums.to_numpy()], index=sums.index)


def _same_workload(control: Run[Any], test: Run[Any]) -> tuple[bool | None, list[str]]:
    a, b = _workload(control), _workload(test)
    keys = [k for k in WORKLOAD_KEYS if k in a and k in b]
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


def _workload(run: Run[Any]) -> dict[str, Any]:
    meta = run.meta
    if meta is None or not meta.workload:
        return {}
    world_size = meta.world_size if meta.world_size is not None else run.world_size
    return {"world_size": world_size} | dict(meta.workload)


def _run_warnings(control: Analysis, test: Analysis) -> list[str]:
    """World sizes, simulated against measured, incomplete runs, runs without steps."""
    out = []
    cw, tw = control.run.world_size, test.run.world_size
    if cw != tw:
        out.append(f"world sizes differ: control {cw}, test {tw}")
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
    if incomplete or len(run.ranks) < run.world_size:
        reason = (meta and meta.reason) or "some ranks are missing"
        out.append(
            f"the {role} run is incomplete ({reason}; "
            f"{len(run.ranks)} of {run.world_size} ranks loaded)"
        )
    if analysis.steps.empty:
        out.append(f"the {role} run has no step with a bubble breakdown")
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
