"""The Stragglers tab of the Bubbles page shows the split bound (fsobs.analysis.whatif.bounds)
of the test store's simulated run, whose sidecars were written from known global batches."""

from __future__ import annotations

import numpy as np
from streamlit.testing.v1 import AppTest

from fsobs import analyze_path
from fsobs.analysis.whatif.bounds import run_bounds
from tests.support.stores import APP, NUM_RANKS, global_batches

TAB_KEY = "bubbles_tab"


def test_stragglers_tab_shows_the_bound(shared_app_env):
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["run"] = "sim/control"
    at.switch_page("app_pages/bubbles.py")
    at.run()
    at.session_state[TAB_KEY] = "Stragglers"
    at.run()
    assert not at.exception, at.exception
    metrics = {m.label: m.value for m in at.metric}
    # by hand from the batches the sidecars were written from: cost L + L², contiguous split
    whales, imbalances = 0, []
    batches = global_batches()
    for lengths in batches.values():
        costs = lengths + lengths.astype(np.float64) ** 2
        mean = costs.sum() / NUM_RANKS
        whales += int(costs.max() > mean)
        loads = [c.sum() for c in np.array_split(costs, NUM_RANKS)]
        imbalances.append(max(loads) / mean)
    assert metrics["Steps with a whale"] == f"{whales} of {len(batches)}"
    assert metrics["Imbalance of the split (max / mean)"] == f"{np.mean(imbalances):.3f}×"
    bounds = run_bounds(analyze_path(shared_app_env / "sim" / "control"))
    assert bounds is not None
    assert metrics["No split can go below"] == f"{bounds.summary().equal_bound:.3f}×"
