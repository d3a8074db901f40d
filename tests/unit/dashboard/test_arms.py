"""Which run is a baseline (every toggle off), and the arms table's control rule (no Streamlit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dashboard.arms import arms_frame, control_among
from dashboard.store import RunEntry, applied_toggles, every_toggle_off, parent_of
from dashboard.urlstate import split
from fsobs.runformat import RunMeta, ToggleStatus

OFF = ToggleStatus(requested=False, applied=False)
ON = ToggleStatus(requested=True, applied=True)
NOT_APPLIED = ToggleStatus(requested=True, applied=False, reason="no GPU")


def _meta(**toggles: ToggleStatus) -> RunMeta:
    return RunMeta.now(
        name="r",
        world_size=2,
        backend="gloo",
        device="cpu",
        hosts=("h",),
        workload={},
        toggles=toggles,
        ranks_present=(0, 1),
        status="complete",
        simulated=False,
    )


def _entry(run_id: str, meta: RunMeta | None) -> RunEntry:
    return RunEntry(run_id=run_id, path=Path(run_id), trace_files=(), signature=(), meta=meta)


@pytest.mark.parametrize(
    ("meta", "off", "applied"),
    [
        (_meta(balance=OFF, sm_free=OFF), True, []),
        (_meta(balance=OFF, sm_free=NOT_APPLIED), True, []),  # requested, nothing acted
        (_meta(sm_free=ON, balance=ON, sync_gc=OFF), False, ["balance", "sm_free"]),
        (_meta(), False, []),  # no toggle recorded: not known to be a baseline
        (None, False, []),  # no run.json
    ],
)
def test_every_toggle_off_means_toggles_recorded_and_none_applied(meta, off, applied):
    assert every_toggle_off(meta) is off
    assert applied_toggles(meta) == applied


def test_the_control_among_arms_is_the_first_with_every_toggle_off():
    arms = [
        _entry("demo/balanced", _meta(balance=ON)),
        _entry("demo/foreign", None),
        _entry("demo/baseline", _meta(balance=OFF)),
    ]
    assert control_among(arms) == "demo/baseline"
    assert control_among(arms[:2]) == "demo/balanced"  # none is off: the first arm


def test_list_parameters_and_folders():
    assert split("a/b, c,,d ") == ["a/b", "c", "d"]
    assert split("") == []
    assert (parent_of("demo/baseline"), parent_of("x/y/z"), parent_of("top")) == ("demo", "x/y", "")


def test_an_arms_table_needs_a_test_arm():
    with pytest.raises(ValueError, match="tests"):
        arms_frame(_entry("a", None), [])
