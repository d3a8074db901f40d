"""Big runs on the Bubbles page: the rank filter, the aggregated per-rank charts, and the
Streamlit settings shipped with the app (no Deploy button, the 512 MiB upload rule)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tomllib
from streamlit.testing.v1 import AppTest

from dashboard import figures
from dashboard.ranks import (
    AGGREGATE_ABOVE,
    DEFAULT_TOP_K,
    OTHERS,
    choose_ranks,
    default_mode,
    format_ranks,
    parse_rank_list,
    top_and_rest,
    top_stragglers,
)
from dashboard.tables import class_means_by_rank
from dashboard.upload import MAX_UPLOAD_BYTES, UPLOADER_MB
from fsobs import analyze_path
from fsobs.analysis.bubbles.parts import BUBBLE_CLASSES
from tests.support.stores import APP, BIG_RANKS, BIG_RUN_ID, ROOT, write_big_run

PER_RANK = pd.DataFrame(
    {
        "rank": [0, 1, 2, 3, 4],
        "times_last": [0, 2, 1, 1, 0],
        "wait_caused_ms": [0.0, 5.0, 3.0, 3.0, 0.0],
    }
)


# ---- the rank filter ----
@pytest.mark.parametrize(
    ("text", "ranks", "problems"),
    [
        ("0-3, 8 12", [0, 1, 2, 3, 8, 12], []),
        ("0 - 2; 5..6", [0, 1, 2, 5, 6], []),
        ("3-1", [1, 2, 3], []),
        ("60-70, x, 99", [60, 61, 62, 63], ["60-70: 7 rank(s) not", "'x'", "no rank 99"]),
        ("", [], []),
    ],
)
def test_a_rank_list_reads_ranks_and_ranges(text, ranks, problems):
    chosen, found = parse_rank_list(text, range(64))
    assert chosen == ranks
    assert len(found) == len(problems)
    for problem, expected in zip(found, problems, strict=True):
        assert expected in problem


def test_ranks_are_written_as_ranges():
    assert format_ranks([8, 0, 1, 2, 3, 10, 11]) == "0–3, 8, 10–11"


def test_top_stragglers_by_wait_caused_then_times_last_then_rank():
    assert top_stragglers(PER_RANK, 2) == [1, 2]  # 5.0 ms; 3.0 ms twice, rank 2 before 3
    assert top_stragglers(PER_RANK, 4) == [0, 1, 2, 3]  # then no wait: the lowest rank
    assert top_stragglers(PER_RANK, 9) == [0, 1, 2, 3, 4]


def test_each_mode_of_the_filter():
    ranks = list(range(5))
    assert choose_ranks("all", ranks, PER_RANK).ranks == ranks
    assert choose_ranks("top", ranks, PER_RANK, k=1).ranks == [1]
    assert choose_ranks("range", ranks, PER_RANK, span=(3, 1)).ranks == [1, 2, 3]
    listed = choose_ranks("list", ranks, PER_RANK, text="4, 0, 9")
    assert (listed.ranks, listed.label) == ([0, 4], "ranks 0, 4")
    assert listed.problems == ["no rank 9 in this run"]
    empty = choose_ranks("list", ranks, PER_RANK, text="")  # falls back to the default
    assert empty.ranks == ranks and empty.problems == ["the list names no rank"]


def test_big_runs_open_on_the_top_stragglers():
    assert default_mode(AGGREGATE_ABOVE) == "all"
    assert default_mode(AGGREGATE_ABOVE + 1) == "top"
    per_rank = pd.DataFrame(
        {"rank": range(64), "times_last": [0] * 64, "wait_caused_ms": np.arange(64.0)}
    )
    fallback = choose_ranks("list", range(64), per_rank, text="x")
    assert fallback.ranks == list(range(64 - DEFAULT_TOP_K, 64))


# ---- per-rank charts of big runs ----
def _steps(num_ranks: int, num_steps: int = 3) -> pd.DataFrame:
    """A bubble table: rank r has r ms of straggler wait and 1 ms of everything else per step."""
    rows = []
    for rank in range(num_ranks):
        for step in range(num_steps):
            row = {"rank": rank, "step": step} | {f"{c}_ms": 1.0 for c in BUBBLE_CLASSES}
            row["straggler_wait_ms"] = float(rank + step)
            rows.append(row)
    return pd.DataFrame(rows)


def test_top_and_rest_keeps_small_runs_whole():
    means = class_means_by_rank(_steps(AGGREGATE_ABOVE))
    shown, folded = top_and_rest(means, means.sum(axis=1))
    assert folded == 0 and list(shown.index) == [str(r) for r in range(AGGREGATE_ABOVE)]


def test_the_class_bars_of_a_64_rank_run_are_the_top_ranks_and_the_mean_of_the_others():
    steps = _steps(64)
    fig = figures.bubble_classes_by_rank(steps)
    assert fig.layout.title.text.endswith("top 16 ranks by bubble, then the mean of the 48 others")
    wait = next(bar for bar in fig.data if bar.name == "straggler wait")
    assert list(wait.x) == [str(r) for r in range(63, 47, -1)] + [OTHERS]
    assert wait.y[0] == pytest.approx(64.0)  # rank 63: 63 + mean(0, 1, 2)
    assert wait.y[-1] == pytest.approx(np.mean(range(48)) + 1)  # ranks 0-47
    other = next(bar for bar in fig.data if bar.name == "other")
    assert list(other.y) == pytest.approx([1.0] * 17)  # means stack like the ranks' bars


def test_the_heatmap_shows_only_the_chosen_ranks():
    fig = figures.straggler_wait_heatmap(_steps(64), [0, 5, 63])
    assert list(fig.data[0].y) == ["0", "5", "63"]
    assert fig.layout.title.text.endswith(": 3 of 64 ranks")
    assert figures.straggler_wait_heatmap(_steps(4)).layout.title.text == (
        "Straggler wait per rank and step (ms)"
    )


def test_the_attribution_of_a_big_run_is_one_trace_colored_by_rank():
    lateness = pd.DataFrame(
        {"rank": np.repeat(np.arange(64), 2), "step": [0, 1] * 64, "cost": 1.0, "lateness_ms": 2.0}
    )
    fig = figures.data_attribution(lateness, "est_cost")
    assert len(fig.data) == 1 and list(fig.data[0].marker.color) == list(lateness["rank"])
    assert len(figures.data_attribution(lateness[lateness["rank"] < 4], "est_cost").data) == 4


# ---- the Bubbles page on a 64-rank run ----
@pytest.fixture(scope="module")
def big_store(tmp_path_factory) -> Path:
    store = tmp_path_factory.mktemp("big") / "store"
    write_big_run(store)
    return store


def _page(big_store: Path, monkeypatch, **query: str) -> AppTest:
    monkeypatch.setenv("FSOBS_STORE", str(big_store))
    at = AppTest.from_file(APP, default_timeout=120)
    at.switch_page("app_pages/bubbles.py")
    for key, value in {"run": BIG_RUN_ID, **query}.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, at.exception
    return at


def _shown(at: AppTest) -> tuple[list[str], list[str], int]:
    """Heatmap rows, timeline ranks and the number of class bars."""
    specs = [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]
    heatmap = next(s for s in specs if s["data"][0]["type"] == "heatmap")
    timeline = next(s for s in specs if "ticktext" in s["layout"].get("yaxis", {}))
    classes = next(s for s in specs if s["data"][0].get("orientation") != "h")
    ticks = [t.removeprefix("rank ") for t in timeline["layout"]["yaxis"]["ticktext"]]
    return heatmap["data"][0]["y"], ticks, len(classes["data"][0]["x"])


def test_a_64_rank_run_opens_on_its_top_stragglers(big_store, monkeypatch):
    at = _page(big_store, monkeypatch)
    top = top_stragglers(analyze_path(big_store / BIG_RUN_ID).stragglers.per_rank, DEFAULT_TOP_K)
    heatmap, timeline, bars = _shown(at)
    assert heatmap == timeline == [str(r) for r in top]
    assert bars == DEFAULT_TOP_K + 1
    at.get("button_group")[0].set_value("all").run()
    heatmap, timeline, _ = _shown(at)
    assert heatmap == [str(r) for r in range(BIG_RANKS)] and len(timeline) == 32


def test_a_rank_list_from_the_url(big_store, monkeypatch):
    at = _page(big_store, monkeypatch, ranks="List", rank_list="0-3, 60, 99")
    assert _shown(at)[:2] == (["0", "1", "2", "3", "60"],) * 2
    assert [w.value for w in at.warning] == ["Rank filter: no rank 99 in this run"]
    at.text_input(key="rank_list").set_value("7").run()
    assert _shown(at)[:2] == (["7"], ["7"])


# ---- Streamlit settings shipped with the app ----
def test_the_app_config_hides_developer_options_and_states_the_upload_rule():
    config = tomllib.loads((ROOT / "dashboard" / ".streamlit" / "config.toml").read_text())
    assert config["client"]["toolbarMode"] == "viewer"
    assert config["server"]["maxUploadSize"] * 2**20 == MAX_UPLOAD_BYTES  # Streamlit: MiB
    # the uploader counts 10**6 bytes per MB in most browsers: it must admit a whole 512 MiB
    assert UPLOADER_MB * 10**6 >= MAX_UPLOAD_BYTES > (UPLOADER_MB - 1) * 10**6
    assert math.ceil(MAX_UPLOAD_BYTES / 10**6) == UPLOADER_MB


def test_streamlit_reads_the_config_next_to_the_app(tmp_path, monkeypatch):
    """``streamlit run dashboard/streamlit_app.py`` from another directory uses it too."""
    from streamlit import config

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(config, "_main_script_path", APP)
    files = config.get_config_files("config.toml")
    assert files[-1] == str(ROOT / "dashboard" / ".streamlit" / "config.toml")
