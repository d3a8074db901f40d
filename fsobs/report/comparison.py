"""``fsobs compare``: a :class:`~fsobs.analysis.Comparison` for machines (:func:`compare_json`)
and for people (:func:`render_comparison`); several pairs with their summary
(:class:`~fsobs.analysis.comparison.pairs.PairSummary`) as :func:`pairs_json` and
:func:`render_pairs`."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, cast

from rich.console import Console
from rich.table import Table

from fsobs.analysis import Comparison
from fsobs.analysis.bubbles.parts import BUBBLE_CLASSES
from fsobs.analysis.comparison.ab import MIN_STEPS_FOR_CI, BatchCheck
from fsobs.analysis.comparison.pairs import MIN_PAIRS, PairSummary
from fsobs.analysis.pipeline import EMBEDDING_TOTAL
from fsobs.report._format import number, percent
from fsobs.report._json import plain, records
from fsobs.report.analysis import EMBEDDING_TOTAL_NOTE
from optim.status import PARTLY

STEPS_CI_NOTE = (
    "(the CI resamples this pair's steps: run-to-run variation is not in it; for that, compare "
    "several pairs with --control A1 A2 A3 --test B1 B2 B3)"
)
PAIRS_CI_NOTE = "Student t interval over the pairs' reductions (mean ± t · sd / sqrt(n))"


def compare_json(c: Comparison) -> dict[str, Any]:
    """The ``fsobs compare --json`` object: strict JSON (NaN, unknown roles included, becomes
    None)."""
    return {
        "control": c.control_name,
        "test": c.test_name,
        "kpis": {
            str(name): {k: plain(v) for k, v in row.items()}
            for name, row in c.kpis.to_dict("index").items()
        },
        "bubble_reduction": plain(c.bubble_reduction),
        "by_class": {k: plain(v) for k, v in c.by_class.items()},
        "bubble_reduction_ci": [plain(v) for v in c.bubble_reduction_ci],
        "by_class_ci": {k: [plain(v) for v in ci] for k, ci in c.by_class_ci.items()},
        "ci_over": "steps",
        "by_role": records(c.by_role),
        "roles_known": {"control": c.control_roles_known, "test": c.test_roles_known},
        "confidence": c.confidence,
        "step_time_ratio": plain(c.step_time_ratio),
        "per_rank": records(c.per_rank),
        "same_batches": c.same_batches,
        "same_batches_check": c.batch_check.to_json(),
        "toggles": {"control": c.control_toggles, "test": c.test_toggles},
        "warnings": list(c.warnings),
        "not_comparable": c.not_comparable,
    }


def render_comparison(c: Comparison, console: Console) -> None:
    """The human report of ``fsobs compare``: the KPI table, then the reductions and warnings."""
    table = Table(title=f"{c.control_name} (control) vs {c.test_name} (test)", title_justify="left")
    for header in ("KPI", "control", "test", "delta"):
        table.add_column(header, justify="right")
    for name, row in c.kpis.iterrows():
        table.add_row(str(name), *(number(row[k]) for k in ("control", "test", "delta")))
    console.print(table)
    console.print(f"bubble reduction: {reduction_text(c)}")
    if not math.isnan(c.bubble_reduction_ci[0]):
        console.print(f"  {STEPS_CI_NOTE}")
    for line in _class_lines(c):
        console.print(line)
    ratio = "-" if math.isnan(c.step_time_ratio) else f"{c.step_time_ratio:.3f}"
    console.print(f"step time ratio (median, test / control): {ratio}")
    console.print(f"same global batches: {batch_line(c.batch_check)}")
    for role, toggles in (("control", c.control_toggles), ("test", c.test_toggles)):
        console.print(f"toggles of the {role}: {toggles_line(toggles)}")
    for warning in c.warnings:
        console.print(f"[yellow]warning:[/] {warning}")


def reduction_text(c: Comparison) -> str:
    """``62.0% (95% CI 55.1% – 68.3%)``; without an interval, why; marked when the runs'
    windows are not comparable (:attr:`Comparison.not_comparable`)."""
    lo, hi = c.bubble_reduction_ci
    steps = c.step_times.groupby("run")["step"].nunique()
    if not (math.isnan(lo) or math.isnan(hi)):
        ci = f"{c.confidence:.0%} CI {percent(lo)} – {percent(hi)}"
    elif min(steps.get("control", 0), steps.get("test", 0)) < MIN_STEPS_FOR_CI:
        ci = f"no CI: fewer than {MIN_STEPS_FOR_CI} steps on a side"
    else:
        ci = "no CI"
    text = f"{percent(c.bubble_reduction)} ({ci})"
    return f"{text} [NOT COMPARABLE: see the warning]" if c.not_comparable else text


_BASIS_NAMES = {
    "digest": "batch digest",
    "sample_ids": "sample ids",
    "totals": "totals only (samples, sum of lengths, sum of squared lengths)",
}


def batch_line(check: BatchCheck) -> str:
    """How the runs' global batches compare, and by what: ``yes, by batch digest on all 18
    common steps``; a weaker basis says why the stronger ones could not decide."""
    same = {True: "yes", False: "no", None: "cannot tell"}[check.same]
    why = f": {'; '.join(check.skipped)}" if check.skipped else ""
    if check.basis == "none":
        return f"{same} (no basis: {'; '.join(check.skipped)}; no workload in both run.json)"
    if check.basis == "run_json":
        return f"{same}, by run.json workload only{why}"
    basis = _BASIS_NAMES[check.basis]
    unit = "window" if check.window > 1 else "step"
    if check.window > 1:
        basis += f" over each window of {check.window} steps"
    n = len(check.checked)
    units = unit if n == 1 else f"{unit}s"
    if check.same:
        every = "the 1" if n == 1 else f"all {n}"
        return f"{same}, by {basis} on {every} common {units}{why}"
    return (
        f"{same}, by {basis}: {len(check.differing)} of {n} common {units} differ "
        f"(first: {unit} {check.differing[0]}){why}"
    )


def _class_lines(c: Comparison) -> list[str]:
    """The reduction of every bubble class, then of every (role, class) with a bubble."""
    lines = []
    for name in BUBBLE_CLASSES:
        lo, hi = c.by_class_ci[name]
        ci = "" if math.isnan(lo) else f" (CI {percent(lo)} – {percent(hi)})"
        lines.append(f"  {name.replace('_', ' ')}: {percent(c.by_class[name])}{ci}")
    return lines + _role_lines(c)


def _role_lines(c: Comparison) -> list[str]:
    """Every (role, class) with time in either run; ``unknown`` for a run without roles."""
    if not (c.control_roles_known or c.test_roles_known):
        return ["  per role: unknown (neither run's collectives carry roles)"]
    lines = []
    # pandas-stubs types a field as any scalar: here role and class names, then floats
    for row in cast("Iterable[Any]", c.by_role.itertuples(index=False)):
        if not (row.control > 0 or row.test > 0):
            continue
        if math.isnan(row.control) or math.isnan(row.test):
            reduction = "reduction unknown"
        else:
            reduction = f"reduction {percent(row.reduction)}" + (
                "" if math.isnan(row.ci_lo) else f", CI {percent(row.ci_lo)} – {percent(row.ci_hi)}"
            )
        lines.append(
            f"  {row.role} {row[1].replace('_', ' ')}: {_ms(row.control)} -> {_ms(row.test)} ms "
            f"per step ({reduction})"
        )
    if (c.by_role["role"] == EMBEDDING_TOTAL).any():
        lines.append(f"  ({EMBEDDING_TOTAL_NOTE})")
    return lines


def _ms(value: float) -> str:
    return "unknown" if math.isnan(value) else f"{value:.2f}"


def pairs_json(summary: PairSummary) -> dict[str, Any]:
    """The ``fsobs compare --control ... --test ...`` object: every pair's
    :func:`compare_json`, then what holds over the pairs."""
    return {
        "pairs": [compare_json(p) for p in summary.pairs],
        "over_pairs": {
            "num_pairs": len(summary.pairs),
            "confidence": summary.confidence,
            "ci_over": "pairs",
            "ci_method": PAIRS_CI_NOTE,
            "min_pairs_for_ci": MIN_PAIRS,
            "bubble_reduction": plain(summary.bubble_reduction),
            "bubble_reduction_ci": [plain(v) for v in summary.bubble_reduction_ci],
            "by_class": {k: plain(v) for k, v in summary.by_class.items()},
            "by_class_ci": {k: [plain(v) for v in ci] for k, ci in summary.by_class_ci.items()},
            "same_batches": [p.same_batches for p in summary.pairs],
            "same_batches_basis": [p.batch_check.basis for p in summary.pairs],
            "warnings": list(summary.warnings),
        },
    }


def render_pairs(summary: PairSummary, console: Console) -> None:
    """Every pair's :func:`render_comparison`, then the reductions over the pairs."""
    for i, pair in enumerate(summary.pairs, start=1):
        console.print(f"[bold]pair {i}[/]")
        render_comparison(pair, console)
        console.print()
    console.print(
        f"[bold]over {len(summary.pairs)} pairs[/] (control and test matched by position)"
    )
    n = len(summary.pairs)
    console.print(
        "bubble reduction: "
        + _over_pairs(summary.bubble_reduction, summary.bubble_reduction_ci, summary.confidence, n)
    )
    for name in BUBBLE_CLASSES:
        line = _over_pairs(summary.by_class[name], summary.by_class_ci[name], summary.confidence, n)
        console.print(f"  {name.replace('_', ' ')}: {line}")
    each = ", ".join(percent(p.bubble_reduction) for p in summary.pairs)
    console.print(f"  per pair: {each}")
    same = {True: "yes", False: "no", None: "cannot tell"}
    console.print(
        "same global batches: "
        + ", ".join(
            f"pair {i} {same[p.same_batches]} ({_PAIR_BASIS[p.batch_check.basis]})"
            for i, p in enumerate(summary.pairs, 1)
        )
    )
    for warning in summary.warnings:
        console.print(f"[yellow]warning:[/] {warning}")


_PAIR_BASIS = {
    "digest": "by batch digest",
    "sample_ids": "by sample ids",
    "totals": "by totals only",
    "run_json": "by run.json only",
    "none": "no basis",
}


def _over_pairs(point: float, ci: tuple[float, float], confidence: float, n: int) -> str:
    """``41.7% (mean of 3 pairs, 95% CI 20.1% – 63.3%, Student t over pairs)``."""
    if math.isnan(point):
        return "n/a"
    if math.isnan(ci[0]):
        return f"{percent(point)} (mean of {n} pair(s); no CI: fewer than {MIN_PAIRS} pairs)"
    return (
        f"{percent(point)} (mean of {n} pairs, {confidence:.0%} CI {percent(ci[0])} – "
        f"{percent(ci[1])}, Student t over pairs)"
    )


def toggles_line(toggles: dict[str, Any]) -> str:
    """``balance on; priority_overlap partly applied (what, and what not); sm_free requested,
    not applied (why)``."""
    if not toggles:
        return "not recorded (no run.json, or no toggles in it)"
    parts = []
    for name, t in toggles.items():
        if not t.get("requested"):
            parts.append(f"{name} off")
        elif t.get("applied") and str(t.get("reason") or "").startswith(PARTLY):
            parts.append(f"{name} partly applied ({t['reason'][len(PARTLY) :]})")
        elif t.get("applied"):
            parts.append(f"{name} on" + (f" ({t['reason']})" if t.get("reason") else ""))
        else:
            parts.append(f"{name} requested, not applied ({t.get('reason')})")
    return "; ".join(parts)
