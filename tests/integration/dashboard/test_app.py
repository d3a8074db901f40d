"""Every page through Streamlit's AppTest: KPIs and charts against fsobs; good and bad uploads."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs

import numpy as np
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from dashboard import cache, disk_cache
from dashboard.balance_plan import balance_plan, default_model
from dashboard.store import folder_signature, list_runs
from dashboard.text import esc
from dashboard.upload import MAX_UPLOAD_BYTES
from dashboard.widgets import KPIS, format_kpi
from fsobs import analyze_path
from fsobs.analysis.comparison.ab import compare
from fsobs.analysis.costfit import fit_cost
from fsobs.runformat import read_step_lengths
from tests.support.stores import (
    RUN_IDS,
    listing,
    open_page,
    run_files,
    tar_gz_bytes,
    tar_gz_declaring,
    zip_bytes,
)

GLOO = "reference/gloo_straggler_4rank"
TAB_KEY = "bubbles_tab"  # the Bubbles page's st.tabs (importing the page would run it)


def _open(page: str = "runs", **query: str) -> AppTest:
    return open_page(page, timeout=60, **query)


def _title(spec: dict) -> str:
    """A chart's title as sent: in bold once, in the figure's template (``widgets.chart``)."""
    assert "title" not in spec["layout"], spec["layout"]["title"]
    text = spec["layout"]["template"]["layout"]["title"]["text"]
    assert text.startswith("<b>") and text.endswith("</b>") and text.count("<b>") == 1, text
    return text.removeprefix("<b>").removesuffix("</b>")


def _charts(at: AppTest) -> dict[str, dict]:
    """Plotly specs by figure title."""
    specs = [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]
    return {_title(spec): spec for spec in specs}


def _values(data: list | dict) -> np.ndarray:
    """A Plotly JSON array: a plain list, or a typed array ``{dtype, bdata[, shape]}``."""
    if isinstance(data, list):
        return np.asarray(data, dtype=float)
    flat = np.frombuffer(base64.b64decode(data["bdata"]), dtype=data["dtype"])
    shape = data.get("shape")
    if shape:
        flat = flat.reshape([int(n) for n in str(shape).split(",")])
    return flat.astype(float)


def _chart(at: AppTest, title_start: str) -> dict:
    return next(s for t, s in _charts(at).items() if t.startswith(title_start))


def _metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_runs_page_lists_every_run_with_its_facts(shared_app_env):
    at = _open()
    assert at.title[0].value == "Runs"
    table = at.dataframe[0].value.set_index("run")
    assert tuple(table.index) == RUN_IDS
    expected = analyze_path(shared_app_env / "sim" / "control").summary["bubble_ratio"]
    # every table shows 4 significant digits (dashboard.numbers.tidy)
    assert table.loc["sim/control", "bubble ratio"] == pytest.approx(expected, rel=5e-4)
    assert table.loc["sim/control", "world size"] == 4
    assert bool(table.loc["sim/control", "simulated"])
    assert "sm_free (requested, not applied)" in table.loc["sim/control", "toggles"]
    assert "not valid JSON" in table.loc["broken", "problem"]


def test_bubbles_page_picks_the_first_run_with_data(shared_app_env):
    at = _open("bubbles")
    assert at.title[0].value == "Bubbles"
    assert at.selectbox(key="run").value == GLOO  # "broken" comes first but has no data
    summary = analyze_path(shared_app_env / GLOO).summary
    assert _metrics(at)["Bubble ratio"] == format_kpi(summary["bubble_ratio"], "pct")


def test_bubbles_page_kpis_and_charts(shared_app_env):
    at = _open("bubbles", run="sim/control")
    analysis = analyze_path(shared_app_env / "sim" / "control")
    metrics = _metrics(at)
    for key, label, unit in KPIS:
        assert metrics[label] == format_kpi(analysis.summary[key], unit)
    bars = _chart(at, "Bubble per rank")
    means = analysis.steps.groupby("rank")["straggler_wait_ms"].mean()
    np.testing.assert_allclose(_values(bars["data"][0]["y"]), means.to_numpy())
    heat = _chart(at, "Straggler wait per rank")
    matrix = analysis.steps.pivot(index="rank", columns="step", values="straggler_wait_ms")
    np.testing.assert_allclose(_values(heat["data"][0]["z"]), matrix.to_numpy())
    assert _chart(at, "Steps 10–11 across ranks")
    assert len(at.get("plotly_chart")) == 4  # other tabs run only when chosen
    for tab, start in (
        ("Stragglers", "Straggler rank per step"),
        ("Data attribution", "Data cost"),
        ("HTA tables", "GPU temporal"),
    ):
        at.session_state[TAB_KEY] = tab
        at.run()
        titles = list(_charts(at))
        assert len(titles) == 3 and any(t.startswith(start) for t in titles), (tab, titles)
    infos = [i.value for i in at.info]
    assert any("`sm_free` was requested but not applied: no GPU" in i for i in infos)
    assert any("badge[" in m.value and "simulated" in m.value for m in at.markdown)


def test_stragglers_tab_says_why_or_that_it_is_unknown_and_compare_shows_toggles(shared_app_env):
    at = _open("bubbles", run=GLOO)
    at.session_state[TAB_KEY] = "Stragglers"
    at.run()
    assert "Why the straggler was late" in [h.value for h in at.subheader]
    # the reference gloo run has no step sidecars: the causes are unknown, and said so
    want = "Unknown: the run has no step sidecars (steps.rank<R>.jsonl: "
    assert any(i.value.startswith(want) for i in at.info)
    at = _open("compare", control="sim/control", test="sim/test")
    captions = [c.value for c in at.caption]
    assert any(c.startswith("Control toggles: ") for c in captions)
    assert any(esc("sm_free requested, not applied") in c for c in captions)


def test_a_run_id_from_the_url_is_only_matched_never_opened(shared_app_env):
    """An id the store does not list is named in one error, and nothing else is shown (issue
    26: it used to open another run silently)."""
    at = _open("bubbles", run="../../../etc")
    assert [e.value for e in at.error] == ["No run `../../../etc` in the store (run= in the URL)."]
    assert not at.selectbox and not at.metric and not at.get("plotly_chart")


def test_a_broken_run_shows_its_error_and_the_app_keeps_working(shared_app_env):
    at = _open("bubbles", run="broken")
    assert len(at.error) == 1
    assert esc("broken/rank0.json: not valid JSON") in at.error[0].value
    at.selectbox(key="run").set_value("sim/test").run()
    assert not at.exception and not at.error
    assert _metrics(at)["Bubble ratio"].endswith("%")
    at = _open("compare", control="broken", test="sim/test")
    assert [e.value for e in at.error] == [
        "Cannot analyze the control run `broken`: "
        + esc(
            "broken/rank0.json: not valid JSON: truncated "
            "(the file ends in the middle of the JSON text)"
        )
    ]


def test_compare_page_shows_the_bubble_reduction(shared_app_env):
    at = _open("compare", control="sim/control", test="sim/test")
    assert at.title[0].value == "Compare"
    comp = compare(
        analyze_path(shared_app_env / "sim" / "control"),
        analyze_path(shared_app_env / "sim" / "test"),
    )
    assert _metrics(at)["Bubble reduction"] == f"{comp.bubble_reduction:.1%}"
    assert any("same global batches" in s.value for s in at.success)
    reduction = _chart(at, "Bubble reduction")
    assert _values(reduction["data"][0]["y"])[0] == pytest.approx(100 * comp.bubble_reduction)
    boxes = _chart(at, "Step time distribution")
    assert [b["name"] for b in boxes["data"]] == ["control", "test"]
    pytest.importorskip("hta.trace_diff")
    at.checkbox(key="op_diff").check().run()
    assert not at.exception
    assert any("Source: HTA TraceDiff" in c.value for c in at.caption)
    assert int(_metrics(at)["ops added"]) >= 0


def test_compare_page_defaults_to_a_control_test_pair(shared_app_env):
    at = _open("compare")
    assert (at.selectbox(key="control").value, at.selectbox(key="test").value) == (
        "sim/control",
        "sim/test",
    )


def _links(at: AppTest) -> dict[str, dict[str, list[str]]]:
    """The sidebar's (and the page's) links: label -> query parameters."""
    return {link.proto.label: parse_qs(link.proto.query_string) for link in at.get("page_link")}


def test_the_session_carries_the_run_to_a_page_opened_without_one(shared_app_env):
    """Bubbles of sim/test, then What-if by a bare URL: still sim/test (What-if's own default
    is the first run with sidecars, sim/control); every sidebar link that reads a run carries it,
    and Compare's carries the pair once Compare chose one."""
    at = _open("bubbles", run="sim/test")
    at.query_params.clear()
    at.switch_page("app_pages/whatif.py").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="run").value == "sim/test"
    links = _links(at)
    for page in ("Runs", "Optimizer", "What-if"):
        assert links[page] == {"run": ["sim/test"]}, (page, links)
    assert links["Bubbles"] == {"run": ["sim/test"], "ranks": ["All"]}  # its rank filter too
    assert links["Compare"] == {} and links["Arms"] == {}
    at.switch_page("app_pages/compare.py").run()
    assert (at.selectbox(key="control").value, at.selectbox(key="test").value) == (
        "sim/control",
        "sim/test",
    )
    assert _links(at)["Compare"] == {"control": ["sim/control"], "test": ["sim/test"]}


def test_a_remembered_run_deleted_since_gives_the_default_not_an_error(app_env):
    at = _open("bubbles", run="sim/test")
    shutil.rmtree(app_env / "sim" / "test")
    at.query_params.clear()
    at.switch_page("app_pages/optimizer.py").run()
    assert not at.exception and not at.error
    assert at.selectbox(key="run").value == "sim/control"  # the first run with sidecars left


def test_arms_page_each_arm_against_the_run_with_every_toggle_off(shared_app_env):
    """Bare /arms: the control is sim/control (every toggle applied off) and the arms are its
    folder's runs; the bar and the table row of sim/test are its reduction against the control,
    ``1 - bubble(test) / bubble(control)``, with that pair's bootstrap interval."""
    at = _open("arms")
    assert at.multiselect(key="runs").value == ["sim/control", "sim/test"]
    assert at.selectbox(key="control").value == "sim/control"
    control = analyze_path(shared_app_env / "sim" / "control")
    test = analyze_path(shared_app_env / "sim" / "test")
    bubble = (control.summary["bubble_ms_per_step"], test.summary["bubble_ms_per_step"])
    reduction = 1 - bubble[1] / bubble[0]
    lo, hi = compare(control, test).bubble_reduction_ci
    bars = _chart(at, "Bubble reduction of each arm against sim/control")
    assert bars["data"][0]["x"] == ["sim/test"]
    assert _values(bars["data"][0]["y"])[0] == pytest.approx(100 * reduction)
    errors = bars["data"][0]["error_y"]
    assert _values(errors["array"])[0] == pytest.approx(100 * (hi - reduction))
    assert _values(errors["arrayminus"])[0] == pytest.approx(100 * (reduction - lo))
    table = at.dataframe[0].value.set_index("arm")
    assert list(table.index) == ["sim/control", "sim/test"]
    assert list(table["role"]) == ["control", "test"]
    assert list(table["toggles"]) == ["none", "balance"]
    # every table shows 4 significant digits (dashboard.numbers.tidy)
    assert list(table["bubble_ms"]) == pytest.approx(list(bubble), rel=5e-4)
    assert table.loc["sim/test", "reduction"] == pytest.approx(reduction, rel=5e-4)
    ci = (table.loc["sim/test", "ci_lo"], table.loc["sim/test", "ci_hi"])
    assert ci == pytest.approx((lo, hi), rel=5e-4)
    assert np.isnan(table.loc["sim/control", "reduction"])
    # A third arm by URL, with another control: the control's row comes first.
    at = _open("arms", control="sim/test", runs=f"sim/control,sim/test,{GLOO}")
    table = at.dataframe[0].value
    assert list(table["arm"]) == ["sim/test", "sim/control", GLOO]
    assert any("simulated and the other is not" in w.value for w in at.warning)
    # The control is one of the arms: removing it from the arms makes the first with every
    # toggle off (sim/control) the control.
    at.multiselect(key="runs").set_value(["sim/control", GLOO]).run()
    assert at.selectbox(key="control").value == "sim/control"
    assert list(at.dataframe[0].value["arm"]) == ["sim/control", GLOO]


def test_compare_from_a_control_link_defaults_the_test_to_another_run(shared_app_env):
    """Runs' "Compare (as control)" link names only the control: when it is the default pair's
    test, the test is the pair's control instead of the same run."""
    at = _open("compare", control="sim/test")
    assert at.selectbox(key="test").value == "sim/control"


def test_compare_page_op_diff_of_cpu_runs_comes_from_fsobs(shared_app_env):
    at = _open("compare", control=GLOO, test="sim/control")
    assert any("GPU traces only" in i.value for i in at.info)
    assert any("simulated and the other is not" in w.value for w in at.warning)
    at.checkbox(key="op_diff").check().run()
    assert not at.exception
    assert any("Source: fsobs" in c.value for c in at.caption)


def test_optimizer_page_fit_and_balance_plan(shared_app_env):
    at = _open("optimizer", run="sim/test")
    assert at.title[0].value == "Optimizer"
    run_dir = shared_app_env / "sim" / "test"
    fit = fit_cost(analyze_path(run_dir))
    assert _metrics(at)["Points (rank, step)"] == str(fit.n_points)
    assert _chart(at, "Imbalance per step")
    at.selectbox(key="cost_source").set_value(default_model().source)
    at.selectbox(key="method").set_value("lpt")
    at.selectbox(key="plan_step").set_value(12).run()
    assert not at.exception
    plan = balance_plan(read_step_lengths(run_dir, 12), default_model().model, "lpt")
    bars = _chart(at, "Per-rank cost")
    np.testing.assert_allclose(_values(bars["data"][0]["y"]), plan.per_rank["cost_before"])
    np.testing.assert_allclose(_values(bars["data"][1]["y"]), plan.per_rank["cost_after"])
    assert _metrics(at)["Imbalance after (lpt)"] == f"{plan.imbalance_after:.3f}×"


def test_an_analysis_outlives_the_server_in_the_disk_cache(app_env, monkeypatch):
    """Analyzed once, a run opens from ``.fsobs-cache`` after a restart (the in-memory caches
    cleared) without parsing; a corrupt entry is analyzed again and replaced."""
    at = _open("bubbles", run="sim/control")
    expected = _metrics(at)
    entry = next(e for e in list_runs(app_env) if e.run_id == "sim/control")
    assert disk_cache.is_fresh(app_env, entry.run_id, entry.signature)
    st.cache_resource.clear()

    parsed = []
    with monkeypatch.context() as patch:
        patch.setattr(
            cache,
            "analyze_path",
            lambda path, progress=None: parsed.append(path) or analyze_path(path),
        )
        at = _open("bubbles", run="sim/control")
    assert _metrics(at) == expected
    assert parsed == []
    st.cache_resource.clear()
    disk_cache.entry_path(app_env, "sim/control").write_bytes(b'{"format": 1}\n garbage')
    at = _open("bubbles", run="sim/control")
    assert _metrics(at) == expected
    assert disk_cache.is_fresh(app_env, entry.run_id, entry.signature)


def test_a_run_in_the_url_is_the_only_one_analyzed(app_env, monkeypatch):
    """Opening a page on a run never parses other runs to find a default; without one, big
    runs not analyzed yet are not looked at."""
    shutil.rmtree(app_env / disk_cache.CACHE_DIR, ignore_errors=True)
    st.cache_resource.clear()
    parsed: list[Path] = []
    monkeypatch.setattr(
        cache,
        "analyze_path",
        lambda path, progress=None: parsed.append(path) or analyze_path(path, progress=progress),
    )
    _open("bubbles", run="sim/test")
    _open("compare", control="sim/test", test=GLOO)
    assert parsed == [app_env / "sim" / "test", app_env / GLOO]
    monkeypatch.setattr(cache, "AUTO_ANALYZE_BYTES", 0)  # every run is big now
    at = _open("optimizer")  # the first run with sidecars that is analyzed already
    assert at.selectbox(key="run").value == "sim/test"
    assert parsed == [app_env / "sim" / "test", app_env / GLOO]


# ---- uploads: one writable store for the module, so analyses are cached across tests ----


@pytest.fixture(scope="module")
def upload_store(shared_store, tmp_path_factory) -> Iterator[Path]:
    store = Path(shutil.copytree(shared_store, tmp_path_factory.mktemp("uploads") / "store"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FSOBS_STORE", str(store))
        yield store


def _upload(files: list[tuple[str, bytes]], name: str = "") -> AppTest:
    at = _open()
    mime = "application/octet-stream"
    at.file_uploader(key="upload_files").set_value([(n, data, mime) for n, data in files])
    at.text_input(key="upload_name").input(name)
    at.button(key="upload_store").click().run()
    assert not at.exception, at.exception
    return at


@pytest.mark.parametrize("kind", ["files", "zip", "tar.gz"])
def test_good_upload_lands_in_uploads_and_in_the_runs_list(upload_store, kind):
    files = run_files(upload_store / GLOO)
    nested = {f"run/{n}": d for n, d in files.items()}
    payload = {
        "files": list(files.items()),
        "zip": [("gloo.zip", zip_bytes(nested))],
        "tar.gz": [("gloo.tar.gz", tar_gz_bytes(nested))],
    }[kind]
    at = _upload(payload, name=f"good {kind.split('.')[-1]}")
    run_id = f"uploads/good-{kind.split('.')[-1]}"
    assert any(run_id in s.value for s in at.success), [e.value for e in at.error]
    assert sorted(p.name for p in (upload_store / run_id).iterdir()) == sorted(files)
    assert run_id in set(at.dataframe[0].value["run"])
    kept = disk_cache.read(upload_store, run_id, folder_signature(upload_store / run_id))
    assert kept is not None and kept.run.path == upload_store / run_id  # opens without parsing
    at.button(key="upload_store").click().run()  # the uploader was emptied: nothing new
    assert [i.value for i in at.info][-1] == "Choose the files of a run first."
    assert not (upload_store / f"{run_id}-2").exists()


def _bad_payload(store: Path, case: str) -> list[tuple[str, bytes]]:
    rank0 = run_files(store / GLOO)["rank0.json.gz"]
    return {
        "malformed json": [("rank0.json", b'{"traceEvents": [{"ph": "X", ')],
        "traversal": [("t.zip", zip_bytes({"../x.json": rank0}))],
        "symlink": [("s.tar.gz", tar_gz_bytes({}, symlinks={"rank0.json": "/etc/passwd"}))],
        "bomb": [("b.tar.gz", tar_gz_declaring("rank0.json", MAX_UPLOAD_BYTES + 1))],
        "duplicate rank": [("rank0.json.gz", rank0), ("again.json.gz", rank0)],
    }[case]


@pytest.mark.parametrize(
    ("case", "phrase"),
    [
        ("malformed json", "not valid JSON"),
        ("traversal", "absolute paths and '..' are not allowed"),
        ("symlink", "links are not allowed"),
        ("bomb", "larger than 512 MiB"),
        ("duplicate rank", "claim this rank"),
    ],
)
def test_bad_upload_shows_a_clear_message_and_changes_nothing(upload_store, case, phrase):
    before = listing(upload_store)
    at = _upload(_bad_payload(upload_store, case), name="bad")
    assert len(at.error) == 1 and esc(phrase) in at.error[0].value  # Markdown, escaped
    assert at.error[0].value.startswith("Upload refused: ")
    assert listing(upload_store) == before


def test_pec_roles_on_the_bubbles_and_compare_pages(tmp_path, monkeypatch):
    """A store with the hand-built gloo step of tests/unit/analysis/test_pec_roles.py, with and
    without PEC's
    ranges: the Stragglers tab lists PEC's roles and embedding_total, with the note that the
    mask exchange counts as PEC's cost; the compare page shows the roles of either run."""
    from fsobs.report.analysis import EMBEDDING_TOTAL_NOTE
    from tests.support.kineto import write_ranks
    from tests.unit.analysis.test_pec_roles import gloo_pec_rank

    for name, pec in (("plain", False), ("pec", True)):
        write_ranks(tmp_path / name, [gloo_pec_rank(r, pec=pec) for r in (0, 1)])
    monkeypatch.setenv("FSOBS_STORE", str(tmp_path))
    at = _open("bubbles", run="pec")
    at.session_state[TAB_KEY] = "Stragglers"
    at.run()
    assert not at.exception, at.exception
    roles = next(df.value for df in at.dataframe if "role" in df.value.columns)
    assert roles["role"].tolist()[3:] == [
        "pec_overlapped",
        "pec_ahead",
        "pec_mask",
        "pec_overlapped_grad",
        "pec_deferred_grad",
        "embedding_total",
    ]
    assert any(c.value == EMBEDDING_TOTAL_NOTE for c in at.caption)
    at = _open("compare", control="plain", test="pec")
    shown = next(df.value for df in at.dataframe if "role" in df.value.columns)
    assert {"pec_mask", "embedding_total"} <= set(shown["role"])
    assert any(c.value == EMBEDDING_TOTAL_NOTE for c in at.caption)
