"""``fsobs compare``: a :class:`~fsobs.analysis.Comparison` for machines (:func:`compare_json`)
and for people (:func:`render_comparison`)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, cast

from rich.console import Console
from rich.table import Table

from fsobs.analysis import Comparison
from fsobs.analysis.bubbles.parts import BUBBLE_CLASSES
from fsobs.analysis.pipeline import EMBEDDING_TOTAL
from fsobs.report._format import number, percent
from fsobs.report._json import plain, records
from fsobs.report.analysis import EMBEDDING_TOTAL_NOTE


def compare_json(c: Comparison) -> dict[str, Any]:
    """The ``fsobs compare --json`` object: strict JSON (NaN becomes None)."""
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
        "by_role": records(c.by_role),
        "confidence": c.confidence,
        "step_time_ratio": plain(c.step_time_ratio),
        "per_rank": records(c.per_rank),
        "same_batches": c.same_batches,
        "toggles": {"control": c.control_toggles, "test": c.test_toggles},
        "warnings": list(c.warnings),
    }


def render_comparison(c: Comparison, console: Console) -> None:
    """The human report of ``fsobs compare``: the KPI table, then the reductions and warnings."""
    table = Table(title=f"{c.control_name} (control) vs {c.test_name} (test)", title_justify="left")
    for header in ("KPI", "control", "test", "delta"):
        table.add_column(header, justify="right")
    for name, row in c.kpis.iterrows():
        table.add_row(str(name), *(number(row[k]) for k in ("control", "test", "delta")))
    console.print(table)
    lo, hi = c.bubble_reduction_ci
    console.print(
        f"bubble reduction: {percent(c.bubble_reduction)} "
        f"({c.confidence:.0%} CI {percent(lo)} – {percent(hi)})"
    )
    for line in _class_lines(c):
        console.print(line)
    ratio = "-" if math.isnan(c.step_time_ratio) else f"{c.step_time_ratio:.3f}"
    console.print(f"step time ratio (median, test / control): {ratio}")
    same = {True: "yes", False: "no", None: "cannot tell"}[c.same_batches]
    console.print(f"same global batches: {same}")
    for role, toggles in (("control", c.control_toggles), ("test", c.test_toggles)):
        console.print(f"toggles of the {role}: {toggles_line(toggles)}")
    for warning in c.warnings:
        console.print(f"[yellow]warning:[/] {warning}")


def _class_lines(c: Comparison) -> list[str]:
    """The reduction of every bubble class, then of every (role, class) with a bubble."""
    lines = []
    for name in BUBBLE_CLASSES:
        lo, hi = c.by_class_ci[name]
        ci = "" if math.isnan(lo) else f" (CI {percent(lo)} – {percent(hi)})"
        lines.append(f"  {name.replace('_', ' ')}: {percent(c.by_class[name])}{ci}")
    # pandas-stubs types a field as any scalar: here role and class names, then floats
    for row in cast("Iterable[Any]", c.by_role.itertuples(index=False)):
        if row.control > 0 or row.test > 0:
            ci = (
                "" if math.isnan(row.ci_lo) else f", CI {percent(row.ci_lo)} – {percent(row.ci_hi)}"
            )
            lines.append(
                f"  {row.role} {row[1].replace('_', ' ')}: {row.control:.2f} -> {row.test:.2f} ms "
                f"per step (reduction {percent(row.reduction)}{ci})"
            )
    if (c.by_role["role"] == EMBEDDING_TOTAL).any():
        lines.append(f"  ({EMBEDDING_TOTAL_NOTE})")
    return lines


def toggles_line(toggles: dict[str, Any]) -> str:
    """``balance on, priority_overlap off, sm_free requested, not applied (why)``."""
    if not toggles:
        return "not recorded (no run.json, or no toggles in it)"
    parts = []
    for name, t in toggles.items():
        if not t.get("requested"):
            parts.append(f"{name} off")
        elif t.get("applied"):
            parts.append(f"{name} on" + (f" ({t['reason']})" if t.get("reason") else ""))
        else:
            parts.append(f"{name} requested, not applied ({t.get('reason')})")
    return "; ".join(parts)
