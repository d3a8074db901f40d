"""examples/seqrec_dataloader.py on 2 gloo ranks (torchrun), each toggle on and off.

The example is the loop most users have (a per-rank DataLoader with a sampler, torchrec's
pipeline, a per-token mean loss); FreeScale's lines are marked ``# FreeScale``. Every run writes
the run format (``fsobs.collect.RunRecorder``) and rank 0 the global token-mean loss per step.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from fsobs.analysis import analyze_path
from fsobs.runformat import read_run_json, read_sidecars
from tests.support.procs import torchrun_example

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "seqrec_dataloader.py"
STEPS = 5


def _run(root: Path, name: str, *flags: str) -> Path:
    out = root / name
    losses = f"--losses-out={root / f'{name}.losses.json'}"
    torchrun_example(EXAMPLE, f"--out={out}", losses, f"--steps={STEPS}", "--batch-size=8", *flags)
    return out


def _losses(run: Path) -> list[float]:
    return json.loads(run.with_name(f"{run.name}.losses.json").read_text())["losses"]


def _global_batches(run: Path) -> list[Counter[int]]:
    """Per step, the multiset of the lengths both ranks trained (the global batch)."""
    sidecar = read_sidecars(run)
    return [
        Counter(n for lengths in group["seq_lengths"] for n in lengths)
        for _, group in sidecar.sort_values("step").groupby("step")
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("seqrec")
    return {
        "plain": _run(root, "plain", "--plain"),
        "off": _run(root, "off"),
        "balance": _run(root, "balance", "--balance"),
        "unequal": _run(root, "unequal", "--balance", "--balance-counts=unequal"),
        "pec": _run(root, "pec", "--priority-overlap"),
    }


def test_freescale_adds_at_most_15_lines() -> None:
    marked = [line for line in EXAMPLE.read_text().splitlines() if "# FreeScale" in line]
    assert 0 < len(marked) <= 15


def test_every_run_is_a_whole_run_with_the_toggles_said(runs: dict[str, Path]) -> None:
    for name, run in runs.items():
        meta = read_run_json(run)
        assert meta.status == "complete" and meta.world_size == 2, name
        analysis = analyze_path(run)
        # the profiler waits one step and warms up one: steps 2.. are traced, each whole
        assert sorted(analysis.steps["step"].unique()) == list(range(2, STEPS)), name
    toggles = read_run_json(runs["pec"]).toggles
    assert toggles["priority_overlap"].applied and not toggles["balance"].requested
    # PEC takes the only table, so the backward issues no embedding all-to-all: the dense order
    # falls back to torchrec's own (holding the dense buckets would only delay them)
    reason = toggles["priority_overlap"].reason or ""
    assert "PEC (TrainPipelinePEC, gradients exact) on tables t_items" in reason
    assert "dense order: auto: concurrent" in reason
    assert read_run_json(runs["balance"]).toggles["balance"].applied


def test_the_toggles_train_the_same_global_batches_to_the_same_model(
    runs: dict[str, Path],
) -> None:
    batches = {name: _global_batches(run) for name, run in runs.items()}
    assert batches["plain"] == batches["off"] == batches["balance"] == batches["pec"]
    # FreeScale's loss weights make each step's gradient the global batch's token mean whatever
    # the split: balance moves samples between ranks and trains the same model (float
    # reordering aside); PEC with exact gradients trains it bit for bit
    off, balance, pec = _losses(runs["off"]), _losses(runs["balance"]), _losses(runs["pec"])
    assert len(set(off)) > 1
    assert balance == pytest.approx(off, rel=1e-5)
    assert pec == off
    # the plain loop averages each rank's own token mean: another loss, another model
    plain = _losses(runs["plain"])
    assert plain[0] == pytest.approx(off[0], rel=1e-5)  # step 0: the same initial model
    assert plain[1:] != pytest.approx(off[1:], rel=1e-6)


def test_balance_splits_by_cost(runs: dict[str, Path]) -> None:
    """With the toggle the two ranks' estimated costs are closer in every step than with the
    random split (the same global batches)."""
    spread = {}
    for name in ("off", "balance"):
        sidecar = read_sidecars(runs[name])
        per_step = sidecar.groupby("step")["est_cost"].agg(["max", "min"])
        spread[name] = (per_step["max"] - per_step["min"]).tolist()
    assert all(b <= o for b, o in zip(spread["balance"], spread["off"], strict=True))
    assert sum(spread["balance"]) < sum(spread["off"])


def test_unequal_counts_train_each_global_batch_once_to_the_same_model(
    runs: dict[str, Path],
) -> None:
    """kk with unequal counts: the same global batches as the toggle off (every sample once),
    other counts per rank, and the share's token-mean weight trains the same model (float
    reordering aside)."""
    assert _global_batches(runs["unequal"]) == _global_batches(runs["off"])
    assert set(read_sidecars(runs["unequal"])["num_samples"]) != {8}
    assert _losses(runs["unequal"]) == pytest.approx(_losses(runs["off"]), rel=1e-5)
    assert read_run_json(runs["unequal"]).toggles["balance"].applied
