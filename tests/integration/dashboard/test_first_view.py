"""The first view leads with the answer (issue 35, point 4): on Bubbles the bubble ratio, the
dominant class with its share, the one thing to do about it and a chart come first, the
findings and the other KPIs folded below; on Compare the verdict in words and the reduction
with its interval.

The runs are simulated (``fsobs simulate``, a second each) with a known cause:

- ``shift``: rank 2's samples are 3x longer from step 0, so rank 2 is late in every step and
  the others wait for it: straggler wait is the dominant class and the data is its cause, so
  the thing to do is the balance toggle;
- ``balanced``: the same with the balance toggle applied (recorded in its run.json), so the
  page says it is on already instead of asking for it;
- ``gc``: rank 1 pauses 1000 ms per step for garbage collection: straggler wait dominates
  again, but GC is the largest cause of the straggler's lateness, so the thing to do is
  sync_gc.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.text import esc
from fsobs import analyze_path
from fsobs.cli import main
from fsobs.report import findings
from tests.support.kineto import cpu_doc, cpu_op, gloo, write
from tests.support.stores import APP

SIM = ("--world-size", "4", "--steps", "6", "--workers", "1")
SHIFT = ("--shift-rank", "2", "--shift-from", "0", "--shift-factor", "3")
RUNS = {
    "shift": SHIFT,
    "balanced": (*SHIFT, "--toggles", "balance"),
    "gc": ("--gc-rank", "1", "--gc-ms", "1000"),
}
CLASSES = ("straggler_wait", "exposed_comm", "unattributed_comm", "host_idle", "other")


@pytest.fixture(scope="module")
def sim_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("first_view")
    for name, flags in RUNS.items():
        assert main(["simulate", *SIM, "--out", str(store / name), *flags]) == 0
    return store


def _open(store: Path, page: str, monkeypatch: pytest.MonkeyPatch, **query: str) -> AppTest:
    monkeypatch.setenv("FSOBS_STORE", str(store))
    at = AppTest.from_file(APP, default_timeout=60)
    for key, value in query.items():
        at.query_params[key] = value
    at.switch_page(f"app_pages/{page}.py")
    at.run()
    assert not at.exception, at.exception
    return at


def _flat(node: Any) -> list[Any]:
    """The page's elements in order, columns and containers opened; an expander is one element
    (its content is what a reader sees only on a click)."""
    out = []
    for child in node.children.values():
        if child.type in ("flex_container", "column", "vertical"):
            out += _flat(child)
        else:
            out.append(child)
    return out


def _answer(at: AppTest) -> list[Any]:
    """The elements from the first metric on (before it: the title, the run picker and the
    run's header)."""
    elements = _flat(at.main)
    first = next(i for i, e in enumerate(elements) if e.type == "metric")
    return elements[first:]


def _by_hand(store: Path, run: str) -> dict[str, float]:
    """The page's numbers worked out from the per-(rank, step) table by the KPIs' rules: the
    ratio is Σ bubble / Σ window; a class's ms per step is its mean over ranks and steps."""
    steps = analyze_path(store / run).steps
    out = {"ratio": steps["bubble_ms"].sum() / steps["window_ms"].sum()}
    out |= {c: steps[f"{c}_ms"].mean() for c in CLASSES}
    out["bubble"] = steps["bubble_ms"].mean()
    return out


def test_bubbles_leads_with_ratio_dominant_class_action_and_chart(sim_store, monkeypatch):
    at = _open(sim_store, "bubbles", monkeypatch, run="shift")
    hand = _by_hand(sim_store, "shift")
    dominant = max(CLASSES, key=hand.__getitem__)
    assert dominant == "straggler_wait"  # rank 2's longer samples make the others wait
    ratio, ratio_note, cls, cls_note, action, link, chart, folded, kpis = _answer(at)[:9]
    assert (ratio.type, ratio.label) == ("metric", "Bubble ratio")
    assert ratio.value == f"{hand['ratio']:.1%}"
    assert ratio_note.value.startswith(f"{hand['bubble']:,.2f} ms of bubble per rank and step")
    assert (cls.type, cls.label) == ("metric", "Straggler wait / step")
    assert cls.value == f"{hand['straggler_wait']:,.2f} ms"
    share = hand["straggler_wait"] / hand["bubble"]
    assert cls.proto.delta == f"{share:.0%} of the bubble"
    assert cls_note.value == "The largest bubble class."
    assert action.type == "success" and action.value.startswith("**What to do:** balance ")
    assert "the balance toggle (fsobs run --balance)" in action.value
    assert link.type == "page_link" and "whatif" in link.proto.page
    assert link.proto.query_string == "run=shift"
    assert chart.type == "plotly_chart"
    spec = json.loads(chart.proto.spec)
    assert spec["layout"]["template"]["layout"]["title"]["text"].startswith(
        "<b>Bubble per rank by class"
    )
    lines = findings(analyze_path(sim_store / "shift"))
    assert (folded.type, folded.label) == ("expander", f"Every finding ({len(lines)})")
    assert [m.value for m in folded.markdown] == [
        f"- {esc(line)}" for line in lines
    ]  # escaped text
    assert (kpis.type, kpis.label) == ("expander", "The other KPIs (9)")
    shown = [m.label for m in kpis.metric]
    assert "Bubble ratio" not in shown and "Straggler wait / step" not in shown
    assert "Exposed comm / step" in shown and len(shown) == 9


def test_an_applied_toggle_is_said_to_be_on_already(sim_store, monkeypatch):
    at = _open(sim_store, "bubbles", monkeypatch, run="balanced")
    assert _by_hand(sim_store, "balanced")["straggler_wait"] > 0
    action = _answer(at)[4]
    assert action.type == "info" and action.value.startswith("**What to do:** balance ")
    assert "This run has `balance` applied already" in action.value


def test_gc_pauses_ask_for_sync_gc(sim_store, monkeypatch):
    at = _open(sim_store, "bubbles", monkeypatch, run="gc")
    hand = _by_hand(sim_store, "gc")
    assert max(CLASSES, key=hand.__getitem__) == "straggler_wait"
    causes = analyze_path(sim_store / "gc").causes
    assert causes is not None and causes.shares["gc"] > causes.shares["data"]
    action, after = _answer(at)[4:6]
    assert action.type == "success" and "the sync_gc toggle (fsobs run --sync-gc)" in action.value
    assert after.type == "plotly_chart"  # What-if does not predict sync_gc: no link to it


def test_compare_leads_with_the_verdict(sim_store, monkeypatch):
    """The GC run as control (rank 1 pauses 1000 ms in every step, the others wait) and the
    shifted run as test (rank 2's data 3x: about half that wait): the test has less bubble in
    every step, so its interval is above 0 and the verdict says it removes bubble."""
    at = _open(sim_store, "compare", monkeypatch, control="gc", test="shift")
    elements = _flat(at.main)
    first = next(i for i, e in enumerate(elements) if e.type == "metric")
    verdict, metric, ci = elements[first - 1], elements[first], elements[first + 1]
    control, test = _by_hand(sim_store, "gc"), _by_hand(sim_store, "shift")
    reduction = 1 - test["bubble"] / control["bubble"]
    assert reduction > 0.2
    assert (metric.label, metric.value) == ("Bubble reduction", f"{reduction:.1%}")
    assert verdict.type == "success"
    assert verdict.value.startswith(f"**The test removes {reduction:.1%} of the control's bubble**")
    assert ci.value.startswith("95% CI: ")
    assert any(e.type == "expander" and e.label.startswith("Every KPI") for e in elements)


@pytest.mark.parametrize(
    ("run", "toggle", "words", "applied"),
    [
        ("shift", "balance", "the balance toggle (fsobs run --balance)", False),
        ("balanced", "balance", "the balance toggle (fsobs run --balance)", True),
        ("gc", "sync_gc", "the sync_gc toggle (fsobs run --sync-gc)", False),
    ],
)
def test_fsobs_analyze_ends_its_findings_with_the_next_step(
    sim_store, capsys, run, toggle, words, applied
):
    """The CLI says the same thing to do as the page, after the findings, and ``--json`` holds
    it under ``next_step``."""
    assert main(["analyze", str(sim_store / run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    (line,) = [line for line in lines if line.startswith("next step: ")]
    last_finding = max(i for i, text in enumerate(lines) if text.startswith("- "))
    assert lines.index(line) == last_finding + 1
    assert words in line
    assert (
        line.endswith(
            f"this run has {toggle} applied already: what is left is in the "
            "findings above and in fsobs whatif's oracle"
        )
        is applied
    )
    assert main(["analyze", "--json", str(sim_store / run)]) == 0
    got = json.loads(capsys.readouterr().out)["next_step"]
    assert got["dominant_class"] == "straggler_wait_ms_per_step"
    assert (got["toggle"], got["applied_already"], words in got["text"]) == (toggle, applied, True)


def test_compare_names_a_whole_trace_window_against_steps_not_comparable(
    sim_store, monkeypatch, tmp_path
):
    """A run without ProfilerStep (one whole-trace window) as control, six steps as test: no
    verdict, the reason instead (issue 36, point 2)."""
    store = tmp_path / "store"
    shutil.copytree(sim_store / "shift", store / "shift")
    work = [cpu_op("aten::mm", 0, 30), gloo("all_reduce", 30, 20)]
    write(store / "whole" / "rank0.json", cpu_doc(0, work, world_size=1, steps=()))
    at = _open(store, "compare", monkeypatch, control="whole", test="shift")
    elements = _flat(at.main)
    first = next(i for i, e in enumerate(elements) if e.type == "metric")
    verdict = elements[first - 1]
    assert verdict.type == "warning"
    reason = (
        "the control run is one whole-trace window (no ProfilerStep: the profiler's start and "
        "stop idle are in it) and the test run has 6 step(s); the reduction sets the one "
        "against the other"
    )
    assert verdict.value.startswith(f"**Not comparable**: {esc(reason)}. The bubble reduction")
    assert verdict.value.endswith("is shown for what it is, with no verdict.")
