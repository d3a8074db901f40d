"""Unequal counts in the real job (2 gloo ranks, torchrec DMP, ``fsobs.workload.train.train``
through ``tests/support/dist.py``): ``kk`` with ``counts="unequal"``, ``lpt``, and a window of 2
steps.

Every run trains with plain SGD (``optimizer="sgd"``, exact SGD on the tables too), so that the
parameters show the gradient itself (see ``test_balance_run.py``: Adagrad would hide a wrong
constant factor on the loss). Each rank's mean loss is scaled by ``W·n_r/N`` (``N``: the samples
its step trains over all ranks), so the averaged gradient is the mean over the step's samples.

- ``kk_unequal`` and ``lpt`` against the baseline on the same global batches: each rank trains
  other samples, so only the float summation order differs: every parameter within
  ``ATOL = 1e-6`` and the global mean loss of each step within 1e-5 (relative), the tolerance
  of ``test_balance_run.py`` for the same job, steps and batch.
- the window (``window=2``): the samples of global batches ``2w`` and ``2w+1`` are dealt into
  steps ``2w`` and ``2w+1``. The reference is a plain run (toggle off) fed, as its global
  batches, the sample sets that the window run's sidecars say each step trained: it splits
  each into contiguous halves (sizes differing by one when odd) and scales by its own counts.
  Both then take the mean gradient over the same samples per step: the same tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fsobs.analysis.comparison.ab import batch_check  # noqa: E402
from fsobs.runformat import read_run_json, read_sidecars  # noqa: E402
from fsobs.workload.config import JobConfig, ModelSpec, data_config_for, job_profiler  # noqa: E402
from fsobs.workload.data import SyntheticHistories, global_batches  # noqa: E402
from fsobs.workload.train import train  # noqa: E402
from optim.config import FreeScaleConfig  # noqa: E402
from optim.plan import BalanceConfig, batch_digest  # noqa: E402
from tests.support.dist import run_ranks  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
STEPS, BATCH, WORLD, WINDOW = 6, 8, 2, 2
ATOL = 1e-6
"""Largest difference allowed between two runs' parameters (module docstring)."""
VARIANTS = {
    "baseline": BalanceConfig(),
    "kk_unequal": BalanceConfig(enabled=True, counts="unequal"),
    "lpt": BalanceConfig(enabled=True, method="lpt"),
    "window": BalanceConfig(enabled=True, counts="unequal", window=WINDOW),
}


def _job(balance: BalanceConfig) -> JobConfig:
    model = ModelSpec(size="tiny")
    return JobConfig(
        steps=STEPS,
        batch_size=BATCH,
        model=model,
        data=data_config_for(model.config()),
        profiler=job_profiler(STEPS, enabled=False),
        freescale=FreeScaleConfig(balance=balance),
        optimizer="sgd",
        save_params=True,
    )


def _step_sets(run: Path) -> list[np.ndarray]:
    """Per step, the samples that the run's sidecars say its ranks trained (ascending)."""
    frame = read_sidecars(run)
    return [
        np.sort(np.concatenate(frame[frame["step"] == s]["sample_ids"].tolist()))
        for s in range(STEPS)
    ]


def _train_all(rank: int, world_size: int, root: Path) -> None:
    device = torch.device("cpu")
    for name, balance in VARIANTS.items():
        train(_job(balance), root / name, device)
    train(_job(BalanceConfig()), root / "reference", device, batches=_step_sets(root / "window"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("unequal")
    run_ranks(_train_all, WORLD, root)
    return root


def _sidecar(run: Path):
    return read_sidecars(run).sort_values(["step", "rank"]).reset_index(drop=True)


def _global_loss(frame) -> np.ndarray:
    weighted = frame.assign(w=frame["loss"] * frame["num_samples"]).groupby("step")
    return (weighted["w"].sum() / weighted["num_samples"].sum()).to_numpy()


def _assert_same_training(a: Path, b: Path) -> None:
    np.testing.assert_allclose(_global_loss(_sidecar(b)), _global_loss(_sidecar(a)), rtol=1e-5)
    for rank in range(WORLD):
        pa = torch.load(a / f"params.rank{rank}.pt")
        pb = torch.load(b / f"params.rank{rank}.pt")
        assert pa.keys() == pb.keys()
        for name in pa:
            torch.testing.assert_close(pb[name], pa[name], rtol=0, atol=ATOL, msg=name)


def _batches() -> list[np.ndarray]:
    """The job's global batches, drawn here from the data's own seed (not from the runs)."""
    data = SyntheticHistories(_job(BalanceConfig()).data)
    return global_batches(len(data), WORLD * BATCH, STEPS, 0)


@pytest.mark.parametrize("variant", ["kk_unequal", "lpt"])
def test_unequal_counts_train_each_global_batch_once_like_the_baseline(runs, variant):
    frame = _sidecar(runs / variant)
    for step, batch in enumerate(_batches()):
        assert _step_sets(runs / variant)[step].tolist() == sorted(batch.tolist())
        assert set(frame[frame["step"] == step]["batch_digest"]) == {batch_digest(batch)}
    assert set(frame["num_samples"]) != {BATCH}  # unequal counts: loss scales other than 1
    _assert_same_training(runs / "baseline", runs / variant)


def test_the_window_trains_every_sample_once_within_its_window(runs):
    frame = _sidecar(runs / "window")
    batches, sets = _batches(), _step_sets(runs / "window")
    for first in range(0, STEPS, WINDOW):
        dealt = np.concatenate(sets[first : first + WINDOW])
        assert sorted(dealt.tolist()) == sorted(
            np.concatenate(batches[first : first + WINDOW]).tolist()
        )
    sizes = frame.groupby("step")["num_samples"].sum()
    assert set(sizes) != {WORLD * BATCH}  # steps of other sizes than the global batch's
    for step, rows in frame.groupby("step"):  # the digest of what the step trained
        assert set(rows["batch_digest"]) == {batch_digest(sets[step])}


def test_the_window_trains_like_a_plain_run_on_its_step_sets(runs):
    ref = _sidecar(runs / "reference")
    assert ref.groupby("step")["num_samples"].sum().tolist() == [
        len(s) for s in _step_sets(runs / "window")
    ]
    _assert_same_training(runs / "reference", runs / "window")


def test_run_json_records_the_counts_and_the_window_and_compare_knows_it(runs):
    workload = json.loads((runs / "window" / "run.json").read_text())["workload"]
    balance = workload["freescale"]["balance"]
    assert (balance["method"], balance["counts"], balance["window"]) == ("kk", "unequal", WINDOW)
    base = json.loads((runs / "baseline" / "run.json").read_text())["workload"]
    assert (base["freescale"]["balance"]["counts"], base["freescale"]["balance"]["window"]) == (
        "equal",
        1,
    )

    def loaded(name: str) -> SimpleNamespace:  # what fsobs compare reads of a loaded run
        run = runs / name
        return SimpleNamespace(
            sidecar=read_sidecars(run), world_size=WORLD, meta=read_run_json(run)
        )

    window = batch_check(loaded("baseline"), loaded("window"))
    assert (window.same, window.warnings) == (True, [])
    assert batch_check(loaded("baseline"), loaded("reference")).same is False
