"""``fsobs run --balance --balance-counts=unequal --cost-model FILE`` with a padded cost model
(torchrun, 2 gloo ranks, torchrec DMP): each rank trains its part of the padded split, and the
sidecar's ``est_cost`` is the rank's batch cost."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("torch")

from fsobs.cli import build_parser  # noqa: E402
from fsobs.cli.run import job_config  # noqa: E402
from fsobs.runformat import read_sidecars  # noqa: E402
from fsobs.workload.config import ModelConfig, data_config_for  # noqa: E402
from fsobs.workload.data import SyntheticHistories, global_batches  # noqa: E402
from fsobs.workload.launch import LaunchConfig, launch  # noqa: E402
from optim.balance import CostModel  # noqa: E402
from optim.padded import partition_padded  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
STEPS, BATCH, WORLD = 3, 8, 2
PAD = CostModel(c0=1000.0, a=20.0, b=0.0, batch=50_000.0, padded=3.0)


def test_a_padded_cost_model_file_plans_the_job(tmp_path):
    PAD.to_json(tmp_path / "cost.json")
    out = tmp_path / "run"
    argv = ["run", f"--world-size={WORLD}", f"--out={out}", f"--steps={STEPS}"]
    argv += ["--model-size=tiny", f"--batch-size={BATCH}", "--no-profile", "--balance"]
    argv += ["--balance-counts=unequal", f"--cost-model={tmp_path / 'cost.json'}"]
    job = dataclasses.replace(job_config(build_parser().parse_args(argv)), optimizer="sgd")
    assert launch(LaunchConfig(world_size=WORLD, out=out, job=job), progress=False) == 0
    data = SyntheticHistories(data_config_for(ModelConfig.preset("tiny"), num_samples=100_000))
    frame = read_sidecars(out).sort_values(["step", "rank"])
    for step, batch in enumerate(global_batches(len(data), WORLD * BATCH, STEPS, 0)):
        rows = frame[frame["step"] == step]
        parts = partition_padded(data.lengths[batch], WORLD, PAD, equal_size=False)
        assert [list(ids) for ids in rows["sample_ids"]] == [batch[p].tolist() for p in parts]
        want = [PAD.batch_cost(np.asarray(ls)) for ls in rows["seq_lengths"]]
        np.testing.assert_allclose(rows["est_cost"], want, rtol=1e-12)
