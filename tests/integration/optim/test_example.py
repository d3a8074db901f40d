"""examples/dlrm_freescale.py on 2 gloo ranks (torchrun), with each toggle on and off.

The example's loop is plain torchrec with ``--plain``; every other run goes through
``optim.FreeScale``. Every run trains the same global batches (same seeds), and rank 0 writes
the global mean loss of each step and ``FreeScale.status()``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from fsobs import load_run
from tests.support.procs import torchrun_example

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "dlrm_freescale.py"
STEPS = 6


def _run(tmp_path: Path, name: str, *flags: str) -> dict:
    out = tmp_path / f"{name}.json"
    torchrun_example(EXAMPLE, f"--steps={STEPS}", f"--losses-out={out}", *flags, timeout=300)
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> list[float]:
    """The global mean loss per step of plain torchrec (FreeScale not attached)."""
    losses = _run(tmp_path_factory.mktemp("plain"), "plain", "--plain")["losses"]
    assert len(losses) == STEPS and len(set(losses)) > 1  # it trains
    return losses


def test_every_toggle_off_equals_plain_torchrec_and_priority_changes_no_number(tmp_path, plain):
    off = _run(tmp_path, "off")
    assert off["losses"] == plain  # bit for bit
    assert all(not t["requested"] and not t["applied"] for t in off["toggles"].values())
    # separate groups, the dense buckets gated behind the embedding all-to-all, and a last step
    # without any embedding gradient (the gate must not hang it); the loss of the last step is
    # computed before its update, so every loss equals plain torchrec's, bit for bit
    gated = _run(
        tmp_path,
        "gated",
        "--priority-overlap",
        "--dense-order=after_embedding",
        f"--freeze-embeddings-at={STEPS - 1}",
    )
    assert gated["losses"] == plain
    priority = gated["toggles"]["priority_overlap"]
    # PEC takes EmbeddingCollections only: this model's lookups are an EmbeddingBagCollection,
    # so the toggle is not applied; the dense order and the groups are said as what they are
    assert priority["requested"] and not priority["applied"]
    assert priority["reason"].startswith(
        "PEC took no table (not on ebc: an EmbeddingBagCollection (PEC takes "
        "EmbeddingCollections only)); dense order: after_embedding; process groups: gloo: "
        "embedding and dense collectives on groups"
    )


def test_balance_and_sync_gc_train_the_same_batches_and_sm_free_says_why_not(tmp_path, plain):
    run_dir = tmp_path / "run"
    both = _run(tmp_path, "balanced", "--balance", "--sm-free", "--sync-gc", f"--run-dir={run_dir}")
    # kk moves samples between ranks but keeps equal counts: the same global mean loss up to
    # float reordering of the parameter updates
    assert both["losses"] == pytest.approx(plain, abs=1e-6)
    assert both["toggles"]["balance"] == {"requested": True, "applied": True, "reason": None}
    assert both["toggles"]["sync_gc"] == {
        "requested": True,
        "applied": True,
        "reason": "automatic collection off; no synchronized collection yet "
        "(fs.after_step(step) collects after every 10th step)",  # 6 steps < 10
    }
    sm_free = both["toggles"]["sm_free"]
    assert sm_free["requested"] and not sm_free["applied"]
    assert sm_free["reason"].startswith("backend gloo: collectives run on CPU worker threads")

    # the run it wrote through fsobs.runformat alone: what fsobs analyze reads
    run = load_run(run_dir)
    assert run.rank_ids == [0, 1] and run.meta is not None and run.meta.status == "complete"
    assert {k: t.to_json() for k, t in run.meta.toggles.items()} == both["toggles"]
    side = run.sidecar
    assert side is not None and sorted(set(side["step"])) == list(range(STEPS))
    per_step = side.groupby("step")["num_samples"].sum().tolist()
    assert per_step == [2 * 32] * STEPS  # every sample of each global batch, once
    # the cost the example logs is its cost model's, c(L) = 20 + L, summed over the samples
    expected = 20.0 * side["num_samples"] + side["len_sum"]
    assert side["est_cost"].tolist() == expected.tolist()


def _global_lengths(batch_size: int = 32) -> list[list[int]]:
    """The sorted lengths of each step's global batch, from the example's own dataset and
    order (its ``dataset``; the order is ``default_rng(1).permutation``, cut into batches)."""
    spec = importlib.util.spec_from_file_location("dlrm_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lengths = module.dataset(100_000, seed=0)["lengths"]
    order = np.random.default_rng(1).permutation(len(lengths))
    size = 2 * batch_size
    return [sorted(lengths[order[s * size : (s + 1) * size]].tolist()) for s in range(STEPS)]


def _trained_lengths(run_dir: Path) -> list[list[int]]:
    """Per step, the sorted lengths that both ranks trained (the recorder's sidecars)."""
    side = load_run(run_dir).sidecar
    assert side is not None
    return [
        sorted(n for lengths in rows["seq_lengths"] for n in lengths)
        for _, rows in side.sort_values("step").groupby("step")
    ]


def test_unequal_counts_train_each_global_batch_once_like_plain_torchrec(tmp_path, plain):
    """kk with unequal counts: each rank's loss scaled by W·n_r/N, so the same training as
    plain torchrec up to float reordering; a window of 2 (lpt) trains every sample of each
    pair of global batches once, in steps of other sizes."""
    run_dir = tmp_path / "unequal"
    out = _run(tmp_path, "unequal", "--balance", "--balance-counts=unequal", f"--run-dir={run_dir}")
    assert out["losses"] == pytest.approx(plain, abs=1e-6)
    side = load_run(run_dir).sidecar
    assert side is not None and set(side["num_samples"]) != {32}  # unequal counts
    assert _trained_lengths(run_dir) == _global_lengths()

    window_dir = tmp_path / "window"
    flags = ("--balance", "--balance-method=lpt", "--balance-window=2", f"--run-dir={window_dir}")
    assert _run(tmp_path, "window", *flags)["toggles"]["balance"]["applied"]
    trained, batches = _trained_lengths(window_dir), _global_lengths()
    for first in range(0, STEPS, 2):
        assert sorted(trained[first] + trained[first + 1]) == sorted(
            batches[first] + batches[first + 1]
        )
    assert {len(t) for t in trained} != {64}  # steps of other sizes than the global batch
