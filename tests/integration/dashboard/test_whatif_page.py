"""The What-if page through Streamlit's AppTest: predictions as the library computes them, the
measured A/B beside them, the simulated scale curve, and the simulated label."""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import figures
from dashboard.scale_study import study
from fsobs import analyze_path
from fsobs.analysis.whatif.predict import whatif
from fsobs.simulate.simulator import SimConfig, simulate, write_run
from tests.support.stores import APP

GLOO = "reference/gloo_straggler_4rank"


def _open(**query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    for key, value in query.items():
        at.query_params[key] = value
    at.switch_page("app_pages/whatif.py")
    at.run()
    assert not at.exception, at.exception
    return at


def _values(data: list | dict) -> np.ndarray:
    """A Plotly JSON array: a plain list, or a typed array ``{dtype, bdata}``."""
    if isinstance(data, list):
        return np.asarray(data, dtype=float)
    return np.frombuffer(base64.b64decode(data["bdata"]), dtype=data["dtype"]).astype(float)


def _charts(at: AppTest) -> dict[str, dict]:
    out = {}
    for chart in at.get("plotly_chart"):
        spec = json.loads(chart.proto.spec)
        title = spec["layout"]["template"]["layout"]["title"]["text"]
        out[title.removeprefix("<b>").removesuffix("</b>")] = spec
    return out


def test_predictions_next_to_the_measured_ab(shared_app_env: Path) -> None:
    at = _open(run="sim/control")
    assert at.title[0].value == "What-if"
    charts = _charts(at)
    bars = charts["Bubble reduction, predicted and measured (%)"]["data"]
    assert bars[0]["name"] == "predicted (from this run)"
    expected = whatif(analyze_path(shared_app_env / "sim" / "control"), draws=50)
    labels = [" + ".join(p.toggles) for p in expected.predictions]
    assert list(bars[0]["x"]) == labels
    predicted = _values(bars[0]["y"])
    assert predicted[0] == pytest.approx(100 * expected.predictions[0].bubble_reduction)
    # sim/test sits next to it with balance applied, on the same batches: measured A/B shown
    assert bars[1]["name"] == "measured A/B"
    assert not math.isnan(_values(bars[1]["y"])[labels.index("balance")])
    # the scale study, simulated in a process of its own: the figures of the study made here
    curve, at_scale, _ = study(analyze_path(shared_app_env / "sim" / "control"))
    for want in (figures.scale_curve(curve), figures.toggles_at_scale(at_scale, 256)):
        title = want.layout.title.text
        assert [_values(t["y"]).tolist() for t in charts[title]["data"]] == [
            np.asarray(t.y, dtype=float).tolist() for t in want.data
        ], title
    # a simulated run is labelled so, and so is the scale study
    badges = [m.value for m in at.markdown if "badge[" in m.value and "simulated" in m.value]
    assert len(badges) >= 2  # the run header's and the scale study's
    assert any("prediction" in c.value for c in at.caption)


def test_a_run_without_sidecars_predicts_the_other_toggles(shared_app_env: Path) -> None:
    at = _open(run=GLOO)
    assert at.multiselect[0].value == ["priority_overlap", "sm_free"]
    assert "Bubble reduction, predicted and measured (%)" in _charts(at)


def test_figures_of_the_page() -> None:
    frame = pd.DataFrame(
        {
            "label": ["balance", "sm_free"],
            "predicted": [0.4, 0.1],
            "lo": [0.3, 0.0],
            "hi": [0.5, 0.2],
            "measured": [0.35, math.nan],
            "measured_lo": [0.2, math.nan],
            "measured_hi": [0.5, math.nan],
        }
    )
    fig = figures.whatif_reductions(frame)
    assert [t.name for t in fig.data] == ["predicted (from this run)", "measured A/B"]
    assert list(fig.data[0].error_y.array) == pytest.approx([10.0, 10.0])
    curve = pd.DataFrame({"job": ["a", "a"], "world_size": [8, 16], "bubble_ratio": [0.3, 0.4]})
    assert list(figures.scale_curve(curve).data[0].y) == pytest.approx([30.0, 40.0])


def test_a_run_written_by_the_simulator_is_labelled(tmp_path: Path, monkeypatch) -> None:
    store = tmp_path / "store"
    write_run(
        simulate(SimConfig(world_size=4, steps=3, batch_per_rank=8)), store / "sim4", workers=1
    )
    monkeypatch.setenv("FSOBS_STORE", str(store))
    at = _open(run="sim4")
    assert any("simulator" in c.value for c in at.caption)
    assert "Bubble reduction, predicted and measured (%)" in _charts(at)
