"""Text from a run or a URL is text on every page (AppTest: the Markdown each element is sent).

A hostile run: a folder whose name holds a Markdown link, an image and HTML, a ``run.json``
whose reason and toggle reason forge a "Session expired: sign in" link, an archive member named
like a link, a run id in ``?run=`` / ``control=`` / ``test=`` / ``runs=``. The Markdown sent
must be the escaped text (:func:`dashboard.text.esc`, or a code span, :func:`code`), so that
the browser shows it as it is (``test_escape_browser.py`` checks the DOM).
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dashboard.figures.arms import arm_reductions
from dashboard.text import code, esc
from fsobs.runformat import RunMeta, ToggleStatus, write_run_json
from tests.support.stores import GLOO_REFERENCE, listing, open_page, small_run, zip_bytes

FORGED = (
    "Session expired: [sign in](http://evil.example/login) ![pixel](http://evil.example/x.png) "
    "<img src=http://evil.example/y.png> `tick` :red[red] $x$ www.evil.example"
)
"""A reason, a URL id: a link, an image, HTML, a code span, a colour, LaTeX, an autolink."""
FOLDER = "x [sign in](https:evil.example) ![p](https:evil.example) `t` <img src=https:evil.example>"
"""A folder name (no ``/``) with a link, an image, a backtick and HTML."""
HOSTILE_ID = f"hostile/{FOLDER}"


def _outside_code(markdown: str) -> str:
    """``markdown`` without its code spans (Markdown reads nothing inside one)."""
    return re.sub(r"(?<![\\`])(`+)(?!`).*?(?<!`)\1(?!`)", "", markdown)


def _markup(markdown: str) -> list[str]:
    """The forged links, images and HTML that ``markdown`` would render (not backslash-escaped,
    not in a code span)."""
    text = _outside_code(markdown)
    forged = r"(?<!\\)\]\((?:http://evil|https:evil)|(?<!\\)<img"
    bare = r"(?<![\u200b])(?:https?\\?://|www\\?\.)evil"  # a bare link esc() left whole
    return re.findall(forged, text) + re.findall(bare, text)


def _open(page: str = "runs", **query: str) -> AppTest:
    return open_page(page, timeout=60, **query)


@pytest.fixture
def hostile_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store of two runs: a plain copy of the gloo reference run, and the same traces in a
    hostile folder whose run.json is incomplete with a forged reason and toggle reason."""
    store = tmp_path / "store"
    shutil.copytree(GLOO_REFERENCE, store / "reference" / "gloo")
    run = Path(shutil.copytree(GLOO_REFERENCE, store / HOSTILE_ID))
    write_run_json(
        run,
        RunMeta(
            world_size=4,
            status="incomplete",
            reason=FORGED,
            toggles={"balance": ToggleStatus(requested=True, applied=False, reason=FORGED)},
        ),
    )
    monkeypatch.setenv("FSOBS_STORE", str(store))
    return store


@pytest.mark.parametrize(
    ("page", "key"), [("bubbles", "run"), ("compare", "control"), ("arms", "runs")]
)
def test_an_unknown_run_id_of_the_url_is_shown_as_text(hostile_store: Path, page: str, key: str):
    at = _open(page, **{key: FORGED})
    assert [e.value for e in at.error] == [
        f"No run {code(FORGED)} in the store ({key}= in the URL)."
    ]


def test_the_helpers_leave_no_markup():
    assert code("a`b") == "``a`b``" and code("`a") == "`` `a ``" and code("ab") == "`ab`"
    assert len(_markup(FORGED)) == 3 + 4 and _markup(esc(FORGED)) == _markup(code(FORGED)) == []


def test_a_hostile_run_shows_its_folder_and_reasons_as_text(hostile_store: Path):
    at = _open("bubbles", run=HOSTILE_ID)
    assert any(c.value.startswith(f"{code(HOSTILE_ID)} · CPU") for c in at.caption)
    warnings = [w.value for w in at.warning]
    assert f"Incomplete run: {esc(FORGED)}" in warnings
    assert f"{code('balance')} was requested but not applied: {esc(FORGED)}" in [
        i.value for i in at.info
    ]
    for element in [*at.markdown, *at.caption, *at.warning, *at.info, *at.error]:
        assert _markup(element.value) == [], element.value


def test_the_runs_page_names_a_run_with_a_hostile_folder_as_text(hostile_store: Path):
    at = _open()
    assert HOSTILE_ID in set(at.dataframe[0].value["run"])  # a table cell is text already
    for element in [*at.markdown, *at.caption, *at.warning, *at.info]:
        assert _markup(element.value) == [], element.value


def _upload(files: list[tuple[str, bytes]]) -> AppTest:
    at = _open()
    uploader = at.file_uploader(key="upload_files")
    uploader.set_value([(n, data, "application/octet-stream") for n, data in files])
    at.button(key="upload_store").click().run()
    assert not at.exception, at.exception
    return at


def test_archive_member_names_are_text(hostile_store: Path):
    skipped = "notes/[sign in](http://evil.example) ![p](http://evil.example/p.png).txt"
    members = {f"run/{name}": data for name, data in small_run().items()}
    at = _upload([("run.zip", zip_bytes({**members, skipped: b"x"}))])
    (success,) = [s.value for s in at.success]
    assert success == (
        f"Stored as {code('uploads/run')}: {esc('rank0.json, steps.rank0.jsonl')}. "
        f"Skipped (not run files): {esc(skipped)}."
    )


def test_a_refused_member_name_is_text(hostile_store: Path):
    before = listing(hostile_store)
    name = "../[sign in](http://evil.example).json"
    at = _upload([("t.zip", zip_bytes({name: b"{}"}))])
    assert [e.value for e in at.error] == [
        "Upload refused: "
        + esc(f"archive member {name!r}: absolute paths and '..' are not allowed")
    ]
    assert listing(hostile_store) == before


def test_symlinked_files_are_skipped_and_said(hostile_store: Path, tmp_path: Path):
    """A link to a file outside the store, named like a trace: listed as skipped, never read."""
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"traceEvents": []}))
    link = "[x](http:evil.example).json"
    (hostile_store / "reference" / "gloo" / link).symlink_to(outside)
    at = _open()
    assert f"Symbolic links skipped (not followed): {code('reference/gloo')}: {esc(link)}" in [
        c.value for c in at.caption
    ]


def test_a_deep_cost_model_is_one_warning_without_a_path(hostile_store: Path, shared_store: Path):
    run = hostile_store / "sim" / "test"
    shutil.copytree(shared_store / "sim" / "test", run)
    (run / "cost_model.json").write_text("[" * 10**5 + "]" * 10**5)
    at = _open("optimizer", run="sim/test")
    problems = [w.value for w in at.warning if "cost_model.json" in w.value]
    assert problems == [
        "cost_model.json is unusable: "
        + esc("cost_model.json: not a cost model (nested too deep to read)")
    ]
    assert str(hostile_store) not in problems[0]


def test_run_ids_in_a_plotly_chart_are_text():
    """Plotly reads ``<a href>`` in titles and labels: the arms chart gets entities instead."""
    hostile = '<a href="https://evil.example">sign in</a> & more'
    frame = pd.DataFrame(
        {
            "role": ["control", "test"],
            "arm": [hostile, hostile],  # the control's id is in the title
            "reduction": [math.nan, 0.25],
            "ci_lo": [math.nan, 0.1],
            "ci_hi": [math.nan, 0.4],
        }
    )
    fig = arm_reductions(frame)
    entities = '&lt;a href="https://evil.example"&gt;sign in&lt;/a&gt; &amp; more'
    assert list(fig.data[0].x) == [entities]
    assert entities in (fig.layout.title.text or "")


def test_a_linked_cost_model_is_not_followed(hostile_store: Path, shared_store: Path):
    run = hostile_store / "sim" / "test"
    shutil.copytree(shared_store / "sim" / "test", run)
    outside = hostile_store.parent / "elsewhere.json"
    outside.write_text(json.dumps({"c0": 1.0, "a": 2.0, "b": 3.0}))
    (run / "cost_model.json").symlink_to(outside)
    at = _open("optimizer", run="sim/test")
    problems = [w.value for w in at.warning if "cost_model.json" in w.value]
    assert problems == ["cost_model.json is unusable: " + esc("a symbolic link, not followed")]
