"""What each toggle did, as ``FreeScale.status()`` reports it: a toggle is applied only once it
acted, and its reason says what it took and what not (no torch at import; the PEC pipeline's
class is looked up when a PEC status is made).

- ``balance``: applied once a balanced share was served (a split, a sampler's batch);
- ``priority_overlap``: applied once a step trained under PEC's pipeline with a PEC module
  pipelined; "partly applied: ..." when an embedding module stayed plain; the dense order and
  the process groups said after PEC's part, as what they are;
- ``sync_gc``: applied once automatic collection is off (``FreeScale.attach``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from optim.config import ToggleStatus
from optim.sync_gc import SyncGC

if TYPE_CHECKING:
    from optim.ddp import DenseGate
    from optim.pec_setup import PECSetup

__all__ = ["PARTLY", "balance_status", "priority_status", "sync_gc_status"]

PARTLY = "partly applied: "
"""How the reason of a toggle that acted on part of what it was asked for begins (``fsobs
compare`` prints it as "partly applied")."""


def balance_status(served: int) -> ToggleStatus:
    """``balance``, after ``served`` balanced shares."""
    if served:
        return ToggleStatus(True, True)
    return ToggleStatus(
        True,
        False,
        "no balanced share was served: the loop took none from fs.split, fs.shares, "
        "fs.exchange or the batches of fs.sampler / fs.loader",
    )


def sync_gc_status(gc: SyncGC) -> ToggleStatus:
    """``sync_gc``: applied once started, with a note until it has collected."""
    if not gc.started:
        return ToggleStatus(
            True, False, "not started: automatic collection is turned off at fs.attach"
        )
    if gc.collections:
        return ToggleStatus(True, True)
    return ToggleStatus(
        True,
        True,
        f"automatic collection off; no synchronized collection yet (fs.after_step(step) "
        f"collects after every {gc.config.every}th step)",
    )


def priority_status(
    groups: ToggleStatus, pec: PECSetup | None, pipeline: Any, gate: DenseGate | None
) -> ToggleStatus:
    """``priority_overlap``'s status. Applied once PEC acted: a step trained under PEC's
    pipeline with at least one PEC module pipelined; partly applied when some embedding module
    was left plain. The reason names the tables PEC runs on and why the others are not, then
    what the dense ordering and the process groups do (never counted as PEC)."""
    acted, words = _pec_words(pec, pipeline)
    order = f"dense order: {gate.describe() if gate is not None else 'concurrent'}"
    order += f"; process groups: {groups.reason or 'embedding and dense groups of their own'}"
    partly = acted and (pec is not None and bool(pec.skipped) or "not on " in words)
    lead = PARTLY if partly else ""
    return ToggleStatus(True, acted, f"{lead}{words}; {order}")


def _pec_words(pec: PECSetup | None, pipeline: Any) -> tuple[bool, str]:
    """Whether PEC acted, and what it took and did not, in words."""
    from optim.pec import ExactTrainPipelinePEC

    if pec is None:
        return False, "PEC: fs.prepare(model) was not called"
    if not pec.applied:
        return False, f"PEC took no table ({pec.describe()})"
    if not isinstance(pipeline, ExactTrainPipelinePEC):
        return False, (
            f"PEC took tables {', '.join(pec.tables)}, but the loop has no train pipeline from "
            "fs.pipeline (PEC's schedule is a pipeline's): they train as plain "
            "EmbeddingCollections"
        )
    if not pipeline.steps_run:
        return False, f"PEC on tables {', '.join(pec.tables)}: no step trained yet"
    ran = pipeline.pec_module_paths
    tables = [t for path in ran for t in pec.tables_of.get(path, ())]
    lost = [p for p in pec.modules if p not in ran]
    parts = (
        [f"torchrec's PEC (TrainPipelinePEC, gradients exact) on tables {', '.join(tables)}"]
        if tables
        else []
    )
    parts += [
        f"not on {path}: torchrec's pipeline did not pipeline it (its input is not taken from "
        "the batch as it is)"
        for path in lost
    ]
    parts += [f"not on {path}: {why}" for path, why in pec.skipped.items()]
    return bool(tables), "; ".join(parts)
