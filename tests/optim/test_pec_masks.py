"""optim.pec_masks and the CPU mask exchange of ExactTrainPipelinePEC, on gloo ranks.

- :class:`FusedMasks` delivers each mask as its own all-to-all would: checked against the rule
  (what rank p sends rank r) on hand-made masks and splits, with one all-to-all issued.
- In a real 2-rank PEC run (tests/optim/test_pec.py's model), counted from its profiler trace,
  against torchrec's schedule (``torchrec_schedule=True``): one mask all-to-all per step
  where torchrec has two, every other all-to-all unchanged; the masks waited after the
  forward instead of inside ``## pec_overlap_dist ##``; step N's overlapped gradient applied
  in step N+1's overlapped lookup; the losses bit for bit torchrec's (test_pec.py compares
  with plain torchrec).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec.distributed.train_pipeline.pec_train_pipeline")

from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402
from torchrec.distributed.sharding.sequence_sharding import SequenceShardingContext  # noqa: E402

from optim.pec import ExactTrainPipelinePEC  # noqa: E402
from optim.pec_masks import FusedMasks  # noqa: E402
from tests.dist import run_ranks  # noqa: E402
from tests.optim.test_pec import CPU, build, make_batch  # noqa: E402

# ------------------------------------------------------------------ FusedMasks, by the rule

SENT = {"fwd": [[2, 3], [1, 0]], "bwd": [[0, 4], [5, 2]]}
"""IDs rank r sent rank p in each batch's input dist: SENT[mask][r][p]."""


def _bits(mask: str, owner: int, source: int, n: int) -> torch.Tensor:
    """The mask values the shard owner ``owner`` sends back to ``source``, for the ``n`` IDs it
    got from it: a fixed pseudo-random 0/1 pattern per (mask, owner, source)."""
    g = torch.Generator().manual_seed(100 * list(SENT).index(mask) + 10 * owner + source)
    return torch.randint(0, 2, (n,), generator=g, dtype=torch.int32)


def _fused_rank(rank: int, world: int, out: Path) -> None:
    masks, expected = [], {}
    for name, sent in SENT.items():
        ctx = SequenceShardingContext(
            input_splits=[sent[rank][p] for p in range(world)],  # what I sent each peer
            output_splits=[sent[p][rank] for p in range(world)],  # what each peer sent me
        )
        mask = torch.cat([_bits(name, rank, p, sent[p][rank]) for p in range(world)])
        masks.append((mask, ctx))
        # back from each owner p: p's bits for my IDs, in rank order
        expected[name] = torch.cat([_bits(name, p, rank, sent[rank][p]) for p in range(world)])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        both = [part.wait() for part in FusedMasks(torch.distributed.group.WORLD, masks).parts()]
    one = FusedMasks(torch.distributed.group.WORLD, masks[1:]).parts()[0].wait()
    launches = sum(e.count for e in prof.key_averages() if e.key == "c10d::alltoall_base_")
    record = {"both": both, "one": one, "sent": [m for m, _ in masks], "expected": expected}
    torch.save(record | {"launches": launches}, out / f"rank{rank}.pt")


@pytest.mark.multiprocess
def test_fused_masks_deliver_each_mask_as_its_own_all_to_all_would(tmp_path):
    run_ranks(_fused_rank, 2, tmp_path)
    for rank in range(2):
        r = torch.load(tmp_path / f"rank{rank}.pt")
        assert r["launches"] == 1
        (fwd_post, fwd_pre), (bwd_post, bwd_pre) = r["both"]
        assert fwd_post.dtype == torch.bool
        assert torch.equal(fwd_post, r["expected"]["fwd"].bool())
        assert torch.equal(bwd_post, r["expected"]["bwd"].bool())
        assert len(fwd_post) == sum(SENT["fwd"][rank]) and len(bwd_post) == sum(SENT["bwd"][rank])
        assert torch.equal(fwd_pre, r["sent"][0]) and torch.equal(bwd_pre, r["sent"][1])
        one_post, one_pre = r["one"]  # one mask alone (the first and the last batch)
        assert torch.equal(one_post, r["expected"]["bwd"].bool())
        assert torch.equal(one_pre, r["sent"][1])


def test_fused_masks_need_a_mask():
    with pytest.raises(ValueError, match="masks"):
        FusedMasks(None, [])  # type: ignore[arg-type]


# ------------------------------------------------------------------ a real run's trace

STEPS = 5
STEP = "test step "
IDS = "## all2all_data:ids ##"
OVERLAP = "## pec_overlap_dist ##"
MASK_WAIT = "## MaskDistAwaitable wait() ##"
OL_APPLY = "## pec_ol_grad_apply ##"
GRAD_WAIT = "## PECGradUpdateAwaitable wait() ##"


def _traced_rank(rank: int, world: int, out: Path) -> None:
    """STEPS steps of test_pec's PEC model, profiled, with each mask exchange."""
    losses = {}
    for fused in (True, False):  # this module's CPU schedule, torchrec's
        dmp, opt = build(True, "sgd")
        pipeline = ExactTrainPipelinePEC(dmp, opt, CPU, torchrec_schedule=not fused)
        batches = iter([make_batch(rank, i) for i in range(STEPS)])
        losses[fused] = []
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(STEPS):
                with record_function(f"{STEP}{i}"):
                    losses[fused].append(pipeline.progress(batches)[0].item())
        prof.export_chrome_trace(str(out / f"rank{rank}.{'fused' if fused else 'torchrec'}.json"))
    torch.save(losses, out / f"rank{rank}.losses.pt")


def _per_step(path: Path) -> list[dict[str, Any]]:
    """Per step (``STEP``, around each ``progress``) of the training thread: the all-to-all
    launches, those under ``IDS`` (anywhere, and inside ``OVERLAP``), and where each
    ``MASK_WAIT`` lies; the ``OL_APPLY`` ranges that apply a gradient, inside the step's
    overlapped lookup or not."""
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e for e in events if e["name"].startswith(STEP)), key=lambda e: e["ts"])
    main = [e for e in events if e["tid"] == steps[0]["tid"]]

    def inside(e: dict[str, Any], r: dict[str, Any]) -> bool:
        return r["ts"] <= e["ts"] and e["ts"] + e["dur"] <= r["ts"] + r["dur"]

    def under(e: dict[str, Any], name: str, among: list[dict[str, Any]]) -> bool:
        return any(r["name"] == name and inside(e, r) for r in among)

    out = []
    for step in steps:
        mine = [e for e in main if inside(e, step)]
        launches = [e for e in mine if e["name"] == "c10d::alltoall_base_"]
        masks = [e for e in launches if under(e, IDS, mine)]
        forward_end = max(e["ts"] + e["dur"] for e in mine if e["name"] == "## forward ##")
        waits = [e for e in mine if e["name"] == MASK_WAIT]
        grads = [e for e in mine if e["name"] == GRAD_WAIT]
        applies = [e for e in mine if e["name"] == OL_APPLY and any(inside(g, e) for g in grads)]
        in_lookup = sum(under(e, "## pec_ol_compute ##", mine) for e in applies)
        out.append(
            {
                "launches": len(launches),
                "masks": len(masks),
                "masks_in_overlap": sum(under(e, OVERLAP, mine) for e in masks),
                "waits_in_overlap": sum(under(e, OVERLAP, mine) for e in waits),
                "waits_after_forward": sum(e["ts"] >= forward_end for e in waits),
                "ol_applies_in_lookup": in_lookup,
                "ol_applies_at_end": len(applies) - in_lookup,
            }
        )
    return out


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    out = tmp_path_factory.mktemp("pec_masks_traced")
    run_ranks(_traced_rank, 2, out)
    return out


@pytest.mark.multiprocess
@pytest.mark.slow
def test_one_mask_all_to_all_per_step_and_nothing_else_changes(traced):
    """Step 0 also fills the pipeline (batch 0's forward mask alone, outside
    ``## pec_overlap_dist ##``); steps 0-3 exchange batch N+1's forward and batch N's
    backward mask (torchrec: two all-to-alls, here one); the last step only batch N's backward
    mask (one either way)."""
    for rank in range(2):
        fused = _per_step(traced / f"rank{rank}.fused.json")
        torchrec = _per_step(traced / f"rank{rank}.torchrec.json")
        assert [s["masks"] for s in torchrec] == [1 + 2, 2, 2, 2, 1]
        assert [s["masks"] for s in fused] == [1 + 1, 1, 1, 1, 1]
        assert [s["masks_in_overlap"] for s in torchrec] == [2, 2, 2, 2, 1]
        assert [s["masks_in_overlap"] for s in fused] == [1] * STEPS
        saved = [1, 1, 1, 1, 0]
        assert [
            t["launches"] - f["launches"] for t, f in zip(torchrec, fused, strict=True)
        ] == saved


@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_masks_are_waited_after_the_forward(traced):
    """torchrec waits each mask inside ``## pec_overlap_dist ##``, before the forward; here
    each step waits its one exchange after the forward (step 0's pipeline fill waits batch 0's
    mask at once, before the step's own exchange)."""
    for rank in range(2):
        fused = _per_step(traced / f"rank{rank}.fused.json")
        torchrec = _per_step(traced / f"rank{rank}.torchrec.json")
        assert [s["waits_in_overlap"] for s in torchrec] == [2, 2, 2, 2, 1]
        assert [s["waits_after_forward"] for s in torchrec] == [0] * STEPS
        assert [s["waits_in_overlap"] for s in fused] == [0] * STEPS
        assert [s["waits_after_forward"] for s in fused] == [1] * STEPS


@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_overlapped_gradient_is_applied_at_the_next_lookup(traced):
    """torchrec applies step N's OL gradient at the end of step N; here at the start of step
    N+1's OL lookup (``## pec_ol_compute ##``), and the last step applies its own at its end."""
    for rank in range(2):
        fused = _per_step(traced / f"rank{rank}.fused.json")
        torchrec = _per_step(traced / f"rank{rank}.torchrec.json")
        assert [s["ol_applies_at_end"] for s in torchrec] == [1] * STEPS
        assert [s["ol_applies_in_lookup"] for s in torchrec] == [0] * STEPS
        assert [s["ol_applies_in_lookup"] for s in fused] == [0, 1, 1, 1, 1]
        assert [s["ol_applies_at_end"] for s in fused] == [0, 0, 0, 0, 1]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_cpu_schedule_trains_like_torchrecs(traced):
    for rank in range(2):
        losses = torch.load(traced / f"rank{rank}.losses.pt")
        assert len(losses[True]) == STEPS
        assert losses[True] == losses[False]
