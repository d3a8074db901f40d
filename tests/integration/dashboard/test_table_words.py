"""Tables speak words (issue 35, point 4): every table the dashboard shows has its columns
under words, never fsobs's identifiers (``bubble_ms_per_step``), and shows no "None", "nan" or
"NaN" (a missing value is an em dash). Checked on every page and Bubbles tab of the shared test
store (a GPU and a CPU run, a control / test pair, the arms, the Optimizer and What-if of a
run with sidecars), through AppTest; and the rule that names a column, on names worked out by
hand.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.tables import column_label
from dashboard.widgets import MISSING
from tests.support.stores import open_page

ROOT = Path(__file__).resolve().parents[3]
GLOO = "reference/gloo_straggler_4rank"
TABS = ("Step timeline", "Stragglers", "Data attribution", "All-to-all", "HTA tables")
IDENTIFIER = re.compile(r"[A-Za-z0-9]+_[A-Za-z0-9_]+")
"""A snake_case name: words joined by underscores."""


def _open(page: str = "runs", **query: str) -> AppTest:
    return open_page(page, timeout=120, **query)


def _problems(at: AppTest, where: str) -> list[str]:
    """What the page's tables show wrong: a column under an identifier, a missing value shown
    by Streamlit's "None", a cell that reads None / nan / NaN."""
    problems = []
    for frame in at.dataframe:
        config = json.loads(frame.proto.columns or "{}")
        if frame.proto.placeholder != MISSING:
            problems.append(f"{where}: placeholder {frame.proto.placeholder!r}")
        table = frame.value
        for name in map(str, table.columns):
            column = config.get(name, {})
            if column.get("hidden"):
                continue
            label = column.get("label") or name
            if IDENTIFIER.search(label):
                problems.append(f"{where}: column {name!r} shown as {label!r}")
            texts = table[name].map(lambda v: v if isinstance(v, str) else "")
            bad = texts[texts.str.strip().isin(["None", "nan", "NaN"])]
            if len(bad):
                problems.append(f"{where}: column {label!r} shows {bad.iloc[0]!r}")
    return problems


def _tabs(at: AppTest, where: str) -> list[str]:
    problems = []
    for tab in TABS:
        at.session_state["bubbles_tab"] = tab
        at.run()
        assert not at.exception, (where, tab, at.exception)
        problems += _problems(at, f"{where} / {tab}")
    return problems


def test_every_table_speaks_words(shared_app_env):
    assert _problems(_open("runs"), "Runs") == []
    assert _tabs(_open("bubbles", run="sim/control"), "Bubbles (GPU)") == []
    cpu = _open("bubbles", run=GLOO)
    assert any(not f.value.empty for f in cpu.dataframe)
    assert _tabs(cpu, "Bubbles (CPU)") == []
    compare = _open("compare", control="sim/control", test="sim/test")
    assert len(compare.dataframe) >= 2  # every KPI, per rank
    assert _problems(compare, "Compare") == []
    diff = _open("compare", control=GLOO, test=GLOO)
    diff.checkbox(key="op_diff").check().run()
    assert _problems(diff, "Compare (op diff)") == []
    assert _problems(_open("arms"), "Arms") == []
    assert _problems(_open("optimizer", run="sim/control"), "Optimizer") == []
    assert _problems(_open("whatif", run="sim/control"), "What-if") == []


def test_missing_values_show_as_a_dash(shared_app_env):
    """The CPU run has no GPU: the stragglers' GPU columns are NaN, shown as the dash."""
    at = _open("bubbles", run=GLOO)
    at.session_state["bubbles_tab"] = "Stragglers"
    at.run()
    stragglers = next(f for f in at.dataframe if "gpu_active_share" in f.value.columns)
    assert stragglers.value["gpu_active_share"].isna().all()
    assert stragglers.proto.placeholder == "—"


def test_tables_are_shown_through_one_widget():
    """``dashboard.widgets.table`` is the only caller of ``st.dataframe`` (so the Live page's
    tables follow the same rule without a live run here)."""
    callers = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "dashboard").rglob("*.py"))
        if "st.dataframe(" in path.read_text() or "st.table(" in path.read_text()
    ]
    assert callers == ["dashboard/widgets.py"]


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("bubble_ms_per_step", "bubble / step (ms)"),
        ("straggler_wait_ms_test", "straggler wait (ms): test"),
        ("idle_time_us", "idle time (µs)"),
        ("idle_time_pctg", "idle time (%)"),
        ("gpu_active_share", "GPU working"),
        ("times_last", "steps last"),
        ("ci_lo", "CI low"),
        ("samples_before", "samples before"),
        ("world size", "world size"),
        ("send max/mean", "send max/mean"),
    ],
)
def test_column_label(name, label):
    assert column_label(name) == label
