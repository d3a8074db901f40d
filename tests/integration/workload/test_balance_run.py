"""The ``balance`` toggle in the real job (torchrun, 2 gloo ranks, torchrec DMP): every sample of
each global batch trained exactly once, and the same training as the baseline.

Every run trains with plain SGD (``JobConfig(optimizer="sgd")``, exact SGD on the tables too): an
update is ``lr`` times the gradient, so the parameters show the gradient itself. (Adagrad would
hide a wrong constant factor on the loss: its update ``g / sqrt(Σ g²)`` does not change when
every gradient is scaled by the same factor.)

Tolerance, balanced vs baseline on the same global batches: each rank trains other samples, so
only the float summation order of the gradients differs: they agree to float32 rounding (relative
~1e-7) on updates ``lr · g`` below ~1e-3, and a parameter below 1 rounds at 6e-8 or less, so the
parameters differ by ~1e-8 after the 6 steps. We require every parameter within ``ATOL = 1e-6``
and the global mean loss of every step within 1e-5 (relative). With unequal
counts (``lpt``) the loss scale ``W·n_r/N`` makes the averaged gradient the global mean; without
its factor ``W = 2`` every gradient would be halved and the parameters would move half as far:
differences of half the training's movement, far above ``ATOL`` (checked by dropping the factor:
up to 4e-3, and above 1e-6 on over half the elements of every trained tensor).
Plan and shuffle mode train the same samples in the same order: identical.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fsobs.cli import build_parser  # noqa: E402
from fsobs.cli.run import job_config  # noqa: E402
from fsobs.runformat import read_sidecars  # noqa: E402
from fsobs.workload.config import ModelConfig, data_config_for  # noqa: E402
from fsobs.workload.cost import cost_coefficients  # noqa: E402
from fsobs.workload.data import SyntheticHistories, global_batches  # noqa: E402
from fsobs.workload.launch import LaunchConfig, launch  # noqa: E402
from optim.balance import CostModel, imbalance  # noqa: E402
from optim.plan import batch_digest  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
STEPS, BATCH, WORLD = 6, 8, 2
ATOL = 1e-6
"""Largest difference allowed between a balanced run's parameters and the baseline's."""
VARIANTS = {
    "baseline": (),
    "kk_plan": ("--balance",),
    "kk_shuffle": ("--balance", "--balance-mode=shuffle"),
    "lpt_plan": ("--balance", "--balance-method=lpt", "--cost-model={cost}"),
    "window": ("--balance", "--balance-counts=unequal", "--balance-window=2"),
    "window_shuffle": (
        "--balance",
        "--balance-counts=unequal",
        "--balance-window=2",
        "--balance-mode=shuffle",
    ),
}
COST = CostModel(c0=5000.0, a=40.0, b=2.0)
"""The lpt run balances with this model (as ``fsobs fit-cost`` would write it)."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("balance")
    COST.to_json(root / "cost.json")
    out = {}
    for name, variant_flags in VARIANTS.items():
        flags = [f.format(cost=root / "cost.json") for f in variant_flags]
        argv = ["run", f"--world-size={WORLD}", f"--out={root / name}", f"--steps={STEPS}"]
        argv += ["--model-size=tiny", f"--batch-size={BATCH}", "--no-profile", *flags]
        job = job_config(build_parser().parse_args(argv))  # as `fsobs run` builds it
        job = dataclasses.replace(job, save_params=True, optimizer="sgd")  # test-only knobs
        config = LaunchConfig(world_size=WORLD, out=root / name, job=job)
        assert launch(config, progress=False) == 0, name
        out[name] = root / name
    return out


def _sidecar(run: Path):
    return read_sidecars(run).sort_values(["step", "rank"]).reset_index(drop=True)


def _global_loss(frame) -> np.ndarray:
    weighted = frame.assign(w=frame["loss"] * frame["num_samples"]).groupby("step")
    return (weighted["w"].sum() / weighted["num_samples"].sum()).to_numpy()


def _params(run: Path, rank: int) -> dict[str, torch.Tensor]:
    return torch.load(run / f"params.rank{rank}.pt")


def test_run_json_records_the_toggle(runs):
    meta = json.loads((runs["kk_shuffle"] / "run.json").read_text())
    assert meta["toggles"]["balance"] == {"requested": True, "applied": True, "reason": None}
    balance = meta["workload"]["freescale"]["balance"]
    assert (balance["method"], balance["mode"]) == ("kk", "shuffle")
    assert meta["workload"]["cost_model"] is None  # the analytic model of the shape
    assert meta["workload"]["optimizer"] == "sgd"
    base = json.loads((runs["baseline"] / "run.json").read_text())
    assert base["toggles"]["balance"]["requested"] is False


@pytest.mark.parametrize("variant", ["kk_plan", "kk_shuffle", "lpt_plan"])
def test_every_sample_exactly_once_and_better_balanced(runs, variant):
    data = SyntheticHistories(data_config_for(ModelConfig.preset("tiny"), num_samples=100_000))
    batches = global_batches(len(data), WORLD * BATCH, STEPS, 0)
    frame = _sidecar(runs[variant])
    model = COST if variant == "lpt_plan" else cost_coefficients(ModelConfig.preset("tiny"))
    for step, batch in enumerate(batches):
        rows = frame[frame["step"] == step]
        assert rows["num_samples"].sum() == len(batch)
        # lengths of the union over ranks = lengths of the global batch (as multisets)
        want = np.sort(data.lengths[batch])
        assert rows["len_sum"].sum() == want.sum()
        assert rows["len_sq_sum"].sum() == (want**2).sum()
        assert set(rows["batch_digest"]) == {batch_digest(batch)}
        assert sorted(np.concatenate(rows["sample_ids"].tolist()).tolist()) == sorted(batch)
        costs = model(data.lengths[batch])  # the random split: contiguous halves
        assert rows["imbalance_before"].iloc[0] == pytest.approx(
            imbalance(costs, np.array_split(np.arange(len(batch)), WORLD)), rel=1e-12
        )
    assert (frame["imbalance_after"] <= frame["imbalance_before"] + 1e-12).all()
    assert frame["imbalance_after"].mean() < frame["imbalance_before"].mean()
    if variant.startswith("kk"):
        assert set(frame["num_samples"]) == {BATCH}


def test_a_cost_model_file_is_what_the_job_balances_with(runs):
    meta = json.loads((runs["lpt_plan"] / "run.json").read_text())
    assert meta["workload"]["cost_model"].endswith("cost.json")
    frame = _sidecar(runs["lpt_plan"])
    want = COST.c0 * frame["num_samples"] + COST.a * frame["len_sum"] + COST.b * frame["len_sq_sum"]
    np.testing.assert_allclose(frame["est_cost"], want, rtol=1e-12)


def test_baseline_split_and_equal_imbalance(runs):
    frame = _sidecar(runs["baseline"])
    assert set(frame["num_samples"]) == {BATCH}
    assert (frame["imbalance_after"] == frame["imbalance_before"]).all()


@pytest.mark.parametrize("variant", ["kk_plan", "lpt_plan"])
def test_balanced_training_equals_the_baseline(runs, variant):
    base, bal = _sidecar(runs["baseline"]), _sidecar(runs[variant])
    np.testing.assert_allclose(_global_loss(bal), _global_loss(base), rtol=1e-5)
    if variant == "lpt_plan":
        assert set(bal["num_samples"]) != {BATCH}  # unequal counts: the loss scale is not 1
    for rank in range(WORLD):
        a, b = _params(runs["baseline"], rank), _params(runs[variant], rank)
        assert a.keys() == b.keys()
        for name in a:
            torch.testing.assert_close(b[name], a[name], rtol=0, atol=ATOL, msg=name)


def test_plan_and_shuffle_modes_train_identically(runs):
    plan, shuffle = _sidecar(runs["kk_plan"]), _sidecar(runs["kk_shuffle"])
    assert plan["loss"].tolist() == shuffle["loss"].tolist()
    assert plan["len_sum"].tolist() == shuffle["len_sum"].tolist()
    for rank in range(WORLD):
        a, b = _params(runs["kk_plan"], rank), _params(runs["kk_shuffle"], rank)
        assert all(torch.equal(a[name], b[name]) for name in a)


def test_a_window_trains_identically_in_plan_and_shuffle_modes(runs):
    """Shuffle mode exchanges a window's rows once (each rank loads its random-split share of
    each batch) and must deal them as plan mode does: the same samples per rank and step, the
    same losses, the same parameters."""
    plan, shuffle = _sidecar(runs["window"]), _sidecar(runs["window_shuffle"])
    assert [ids.tolist() for ids in plan["sample_ids"]] == [
        ids.tolist() for ids in shuffle["sample_ids"]
    ]
    assert plan["loss"].tolist() == shuffle["loss"].tolist()
    for rank in range(WORLD):
        a, b = _params(runs["window"], rank), _params(runs["window_shuffle"], rank)
        assert all(torch.equal(a[name], b[name]) for name in a)


def test_id_overlap_is_the_same_on_every_rank_whatever_the_toggles(runs):
    """It depends on the global batches only, which balancing does not change."""
    want = _sidecar(runs["baseline"]).groupby("step")["id_overlap"].first().tolist()
    assert want[0] is None and all(isinstance(s, dict) and len(s) == 4 for s in want[1:])
    for variant in VARIANTS.keys() - {"window", "window_shuffle"}:  # windows: other sets
        frame = _sidecar(runs[variant])
        for step, shares in frame.groupby("step")["id_overlap"]:
            assert shares.tolist() == [want[step]] * WORLD, (variant, step)


def test_a_window_from_the_command_line_trains_each_window_once(runs):
    """``fsobs run --balance --balance-counts=unequal --balance-window=2``: the job.json the
    ranks read holds the window; the sidecars' sample ids of steps 2w and 2w+1 are global
    batches 2w and 2w+1, each sample once; run.json says the counts and the window."""
    data = SyntheticHistories(data_config_for(ModelConfig.preset("tiny"), num_samples=100_000))
    batches = global_batches(len(data), WORLD * BATCH, STEPS, 0)
    frame = _sidecar(runs["window"])
    for first in range(0, STEPS, 2):
        rows = frame[frame["step"].isin([first, first + 1])]
        trained = np.concatenate(rows["sample_ids"].tolist())
        assert sorted(trained.tolist()) == sorted(np.concatenate(batches[first : first + 2]))
    for step, shares in frame.groupby("step")["id_overlap"]:  # of the step's own samples
        assert shares.iloc[0] == shares.iloc[1] and (step == 0) == (shares.iloc[0] is None)
    meta = json.loads((runs["window"] / "run.json").read_text())
    balance = meta["workload"]["freescale"]["balance"]
    assert (balance["counts"], balance["window"]) == ("unequal", 2)
    job = json.loads((runs["window"] / "job.json").read_text())
    assert job["freescale"]["balance"]["window"] == 2
