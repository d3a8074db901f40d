"""examples/ranker_candidates.py on 2 gloo ranks (torchrun), each toggle on and off.

The example is a loop without a train pipeline (the model called by the loop, the item table's
optimizer applied in backward, a batch class whose ``.to()`` moves every attribute) whose loss
is the mean over a variable number of candidates per user. The gradient runs train with SGD on
the table and the dense part (``--sgd``): SGD's update is the gradient times the learning rate,
so a wrong loss weight shows in the parameters (Adam and Adagrad would absorb a scale). Their
reference is the plain loop made exact by hand: each rank's sum of candidate losses times the
world size over the global batch's candidates, counted by an all-reduce (``--global-mean``).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from fsobs.runformat import read_run_json, read_sidecars
from tests.support.procs import torchrun_example

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "ranker_candidates.py"
STEPS = 6
TOLERANCE = 1e-3
"""Largest parameter difference from the reference allowed, as a share of the reference's
largest update of that tensor over the run. Float reordering (another split of the global
batch, another order of the sums) moves a parameter by an ulp or two: up to 2e-4 of the update
of the first block's attention weights (their update is 4e-5 on values near 0.2), 1e-5 or less
elsewhere. A loss weight off by a factor ``f`` moves every update by ``|1 - f|`` of itself."""


def _run(root: Path, name: str, *flags: str, params: bool = False) -> Path:
    out = root / name
    losses = f"--losses-out={root / f'{name}.losses.json'}"
    extra = [f"--params-out={root / f'{name}.pt'}"] if params else []
    torchrun_example(EXAMPLE, f"--out={out}", losses, f"--steps={STEPS}", "--batch-size=8",
                     *flags, *extra)  # fmt: skip
    return out


def _result(run: Path) -> dict:
    return json.loads(run.with_name(f"{run.name}.losses.json").read_text())


def _params(run: Path) -> dict[str, dict[str, torch.Tensor]]:
    return torch.load(run.with_name(f"{run.name}.pt"))


def _global_batches(run: Path) -> list[Counter[int]]:
    """Per step, the multiset of the history lengths both ranks trained (the global batch)."""
    sidecar = read_sidecars(run)
    return [
        Counter(n for lengths in group["seq_lengths"] for n in lengths)
        for _, group in sidecar.sort_values("step").groupby("step")
    ]


def _deviation(run: Path, reference: Path) -> float:
    """The largest difference of ``run``'s final parameters from ``reference``'s, per tensor as
    a share of the largest update the reference made to it (both start from the same ones)."""
    mine, ref = _params(run), _params(reference)
    worst = 0.0
    for key, start in ref["initial"].items():
        assert torch.equal(mine["initial"][key], start), key  # the same initial model
        update = float((ref["final"][key] - start).abs().max())
        assert update > 0, key  # every tensor trains
        worst = max(worst, float((mine["final"][key] - ref["final"][key]).abs().max()) / update)
    return worst


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ranker")
    balance = ("--sgd", "--balance")
    return {
        "plain": _run(root, "plain", "--sgd", "--plain"),
        "reference": _run(root, "reference", "--sgd", "--plain", "--global-mean", params=True),
        "off": _run(root, "off", "--sgd", params=True),
        "balance": _run(root, "balance", *balance, params=True),
        "unequal": _run(root, "unequal", *balance, "--balance-counts=unequal", params=True),
        "events": _run(root, "events", *balance, "--weigh-by-events", params=True),
        "priority_gc": _run(root, "priority_gc", "--sgd", "--priority-overlap", "--sync-gc"),
    }


def test_freescale_adds_at_most_15_lines() -> None:
    marked = [line for line in EXAMPLE.read_text().splitlines() if "# FreeScale" in line]
    assert 0 < len(marked) <= 15


def test_every_run_is_whole_and_trains_the_same_global_batches(runs: dict[str, Path]) -> None:
    batches = {name: _global_batches(run) for name, run in runs.items()}
    for name, run in runs.items():
        meta = read_run_json(run)
        assert meta.status == "complete" and meta.world_size == 2, name
        assert len(batches[name]) == STEPS and batches[name] == batches["plain"], name
    # kk with unequal counts moves samples between ranks: other counts, the same global batches
    assert set(read_sidecars(runs["unequal"])["num_samples"]) != {8}
    assert set(read_sidecars(runs["balance"])["num_samples"]) == {8}


def test_freescale_trains_the_global_batch_mean_over_candidates(runs: dict[str, Path]) -> None:
    """Toggles off, balance (equal counts) and balance with unequal counts end at the
    reference's parameters, float reordering aside: each step's gradient is the global batch's
    mean over candidates, whatever the split."""
    reference = _result(runs["reference"])["losses"]
    assert len(set(reference)) == STEPS  # it trains
    for name in ("off", "balance", "unequal"):
        assert _deviation(runs[name], runs["reference"]) < TOLERANCE, name
        assert _result(runs[name])["losses"] == pytest.approx(reference, rel=1e-5), name
        assert read_run_json(runs[name]).toggles["balance"].applied == (name != "off")


def test_the_weight_by_events_would_fail_it(runs: dict[str, Path]) -> None:
    """The loss weight counted in the histories' events instead of the candidates (what a
    token-mean weight over the lengths gives) scales every update by the global batch's
    candidates over its events, far beyond the tolerance."""
    assert _deviation(runs["events"], runs["reference"]) > 0.5


def test_the_plain_loop_trains_another_model(runs: dict[str, Path]) -> None:
    """Each rank's own mean over its candidates weighs a candidate by 1 / (its rank's
    candidates): the same loss at step 0 (the same model, the same global batch), other losses
    after."""
    plain, off = _result(runs["plain"])["losses"], _result(runs["off"])["losses"]
    assert plain[0] == pytest.approx(off[0], rel=1e-6)
    assert plain[1:] != pytest.approx(off[1:], rel=1e-6)


def test_priority_overlap_and_sync_gc_change_no_number(runs: dict[str, Path]) -> None:
    """Without torchrec's pipeline PEC cannot act, and the status says so; the dense
    all-reduce ordered behind the embedding all-to-all and the collections at the same steps
    change no number: the losses are the toggles-off run's, bit for bit."""
    result = _result(runs["priority_gc"])
    assert result["losses"] == _result(runs["off"])["losses"]
    toggles = result["toggles"]
    assert {k: t.to_json() for k, t in read_run_json(runs["priority_gc"]).toggles.items()} == (
        toggles
    )
    assert toggles["sync_gc"] == {
        "requested": True,
        "applied": True,
        "reason": "automatic collection off; no synchronized collection yet "
        "(fs.after_step(step) collects after every 10th step)",  # 6 steps < 10
    }
    priority = toggles["priority_overlap"]
    # PEC took the table (fs.prepare), but PEC's schedule is a pipeline's: not applied
    assert priority["requested"] and not priority["applied"]
    assert priority["reason"].startswith(
        "PEC took tables t_items, but the loop has no train pipeline from fs.pipeline"
    )
    assert "; dense order: auto: " in priority["reason"]
