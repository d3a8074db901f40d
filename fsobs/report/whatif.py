"""``fsobs whatif``: a :class:`~fsobs.analysis.WhatIf` for machines (:func:`whatif_json`) and for
people (:func:`render_whatif`)."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from fsobs.analysis import WhatIf
from fsobs.analysis.whatif.bounds import BoundSummary
from fsobs.analysis.whatif.results import (
    Oracle,
    Prediction,
    ReplayCheck,
    WhatIfCalibration,
    WhatIfRun,
)
from fsobs.report._format import fixed, percent
from fsobs.report._json import clean
from fsobs.report._whales import bound_line

_JSON_NAMES = {"num_steps": "steps", "num_ranks": "ranks"}
"""Fields whose JSON key is shorter than their name."""


def whatif_json(w: WhatIf) -> dict[str, Any]:
    """The JSON object of ``fsobs whatif --json`` (NaN as null)."""
    out: dict[str, Any] = clean(
        {
            "run": _renamed(w.run),
            "baseline": w.baseline,
            "replay": _renamed(w.replay),
            "calibration": _calibration_json(w.calibration),
            "predictions": [_prediction_json(p) for p in w.predictions],
            "oracle": _oracle_json(w.oracle),
            "split_bound": None if w.split_bound is None else asdict(w.split_bound),
            "notes": w.notes,
            "draws": w.draws,
            "confidence": w.confidence,
        }
    )
    return out


def _renamed(facts: WhatIfRun | ReplayCheck) -> dict[str, Any]:
    return {_JSON_NAMES.get(k, k): v for k, v in asdict(facts).items()}


def _calibration_json(c: WhatIfCalibration | None) -> dict[str, Any]:
    if c is None:
        return {"cost_fit": None}
    out: dict[str, Any] = {
        "cost_fit": asdict(c.cost_fit),
        "rank_speed": c.rank_speed,
        "residual_sigma": c.residual_sigma,
    }
    if c.partition_model is not None:
        p = c.partition_model
        out["partition_model"] = {"c0": p.c0, "a": p.a, "b": p.b}
    if c.resplit is not None:
        out.update(asdict(c.resplit))
    return out


def _prediction_json(p: Prediction) -> dict[str, Any]:
    fields = asdict(p)
    return {"toggles": list(fields.pop("toggles")), "predicted": True, **fields}


def _oracle_json(o: Oracle) -> dict[str, Any]:
    # only the wait split can be None (no calibration): then its keys are left out
    return {"predicted": True, **{k: v for k, v in asdict(o).items() if v is not None}}


_TABLE_CLASSES = ("straggler_wait", "exposed_comm", "host_idle")
"""The classes with a column in the table, in order."""


def render_whatif(w: WhatIf, console: Console) -> None:
    """The human report of ``fsobs whatif``: the run and the replay check, the predictions
    (and the oracle) in one table, then what the numbers compare with and the notes."""
    for line in _head_lines(w):
        console.print(line)
    console.print(_table(w))
    for line in _tail_lines(w):
        console.print(line)


def _head_lines(w: WhatIf) -> list[str]:
    run, base, rep = w.run, w.baseline, w.replay
    kind = "simulated" if run.simulated else "measured"
    verdict = "ok" if rep.passed else "FAILED: predictions unreliable"
    return [
        f"{run.path}: {kind} {run.device.upper()} run, {run.num_ranks} ranks, "
        f"{run.num_steps} steps; bubble {base['bubble_ms_per_step']:.2f} ms per rank and step "
        f"({base['bubble_ratio']:.1%} of step time), "
        f"step time p50 {base['step_time_ms_p50']:.1f} ms",
        f"replay check ({verdict}): step time error median {rep.step_time_median:.2%}, "
        f"p90 {rep.step_time_p90:.2%}; classes median {rep.classes_median:.2%}, "
        f"p90 {rep.classes_p90:.2%} of the step",
    ]


def _table(w: WhatIf) -> Table:
    pct = int(round(100 * w.confidence))
    table = Table(
        title=f"Predicted from this run alone ({w.draws} noise draws, {pct}% intervals)",
        title_justify="left",
    )
    for header in (
        "toggles",
        "bubble ms/step",
        "reduction",
        f"{pct}% interval",
        "straggler wait",
        "exposed comm",
        "host idle",
        "step p50 ms",
    ):
        table.add_column(header, justify="left" if header == "toggles" else "right")
    resplit = w.calibration.resplit if w.calibration is not None else None
    mode = f"balance ({resplit.balance_split})" if resplit is not None else "balance"
    for p in w.predictions:
        by_class_ms = {c: v["ms_per_step"] for c, v in p.by_class.items()}
        label = " + ".join(mode if t == "balance" else t for t in p.toggles)
        table.add_row(*_row(label, p, by_class_ms))
    table.add_row(*_row("oracle: equal compute", w.oracle, w.oracle.by_class))
    return table


def _row(label: str, r: Prediction | Oracle, by_class_ms: dict[str, float]) -> list[str]:
    lo, hi = r.bubble_reduction_interval
    return [
        label,
        fixed(r.bubble_ms_per_step, ".2f"),
        percent(r.bubble_reduction),
        f"{percent(lo)} – {percent(hi)}",
        *(fixed(by_class_ms[c], ".2f") for c in _TABLE_CLASSES),
        fixed(r.step_time_ms_p50, ".1f"),
    ]


def _tail_lines(w: WhatIf) -> list[str]:
    lines = []
    resampled = w.replay.baseline_resampled_bubble_ms_per_step
    if not math.isnan(resampled):
        lines.append(
            f"reductions compare each draw with the baseline replayed under the same draw "
            f"(bubble {resampled:.2f} ms per rank and step on the median draw)"
        )
    wait_line = oracle_wait_line(w.oracle)
    if wait_line is not None:
        lines.append(wait_line)
    if w.split_bound is not None:
        lines += _bound_lines(w, w.split_bound)
    return lines + [f"note: {note}" for note in w.notes]


def oracle_wait_line(o: Oracle) -> str | None:
    """The straggler wait split between the data and the noise (parts of it, each at most the
    wait), and the two counterfactual waits the share comes from; None without them."""
    if o.wait_from_data_ms_per_step is None or math.isnan(o.wait_from_data_ms_per_step):
        return None
    assert o.wait_from_noise_ms_per_step is not None and o.data_part_ms_per_step is not None
    return (
        f"straggler wait {o.straggler_wait_ms_per_step:.2f} ms per step: "
        f"{o.data_part_ms_per_step:.2f} of it from the data, {o.noise_part_ms_per_step:.2f} "
        f"from the noise (data share {percent(o.data_share)} of the waits with only the data "
        f"or only the noise differing between the ranks, {o.wait_from_data_ms_per_step:.2f} "
        f"and {o.wait_from_noise_ms_per_step:.2f}: those do not add up)"
    )


def _bound_lines(w: WhatIf, bound: BoundSummary) -> list[str]:
    """Beside the oracle: how far a split can go, and where the oracle is out of reach."""
    line = bound_line(bound)
    resplit = w.calibration.resplit if w.calibration is not None else None
    if resplit is not None:
        mode, after = resplit.balance_split, resplit.imbalance_after
        line += f"; the planner's split (balance {mode}) {after:.2f}"
    reach = (
        f"the oracle's equal compute is out of reach in {bound.num_whale_steps} of "
        f"{bound.num_steps} step(s): their costliest sample alone outweighs the mean rank load"
        if bound.num_whale_steps
        else "no step has a whale: no single sample keeps a split from the oracle's equal compute"
    )
    return [line, reach]
