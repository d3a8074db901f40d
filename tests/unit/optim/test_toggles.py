"""The optimizer API's parts that need no second process: configs, statuses, the sm_free
decision and its padding arithmetic, the markers, the dense gate."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from optim import FreeScaleConfig, PriorityConfig, SMFreeConfig, SyncGCConfig, ToggleStatus
from optim import sm_free as sm
from optim.ddp import DenseGate
from optim.markers import comm_marker, parse_comm_marker

# ------------------------------------------------------------------------ config and status


def test_configs_reject_bad_values_naming_the_field():
    with pytest.raises(ValueError, match="dense_order"):
        PriorityConfig(dense_order="sometimes")
    with pytest.raises(ValueError, match="fallback"):
        SMFreeConfig(fallback="max")
    with pytest.raises(ValueError, match="capacity"):
        SMFreeConfig(capacity=0)
    with pytest.raises(ValueError, match="applied"):
        ToggleStatus(requested=False, applied=True)
    with pytest.raises(ValueError, match="every"):
        SyncGCConfig(every=0)
    with pytest.raises(ValueError, match="generation"):
        SyncGCConfig(generation=3)


def test_every_toggle_is_off_by_default():
    assert FreeScaleConfig().requested() == {
        "balance": False,
        "priority_overlap": False,
        "sm_free": False,
        "sync_gc": False,
    }
    assert ToggleStatus(True, False, "why").to_json() == {
        "requested": True,
        "applied": False,
        "reason": "why",
    }


# --------------------------------------------------------------------- the sm_free decision


def _cap(**fields) -> sm.Capability:
    good = dict(
        backend="nccl",
        cuda=True,
        nccl_version=(2, 28, 9),
        has_cta_policy_zero=True,
        has_cta_policy_efficiency=True,
        has_symmetric_memory=True,
        num_nodes=1,
    )
    return sm.Capability(**(good | fields))


ON = SMFreeConfig(enabled=True)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"backend": "gloo"}, "backend gloo: collectives run on CPU worker threads"),
        ({"cuda": False}, "no CUDA device"),
        ({"nccl_version": (2, 27, 7)}, "NCCL 2.27.7 < 2.28: no copy-engine collectives"),
        ({"nccl_version": None}, "NCCL unknown < 2.28"),
        ({"has_cta_policy_zero": False}, "has no ProcessGroupNCCL.NCCL_CTA_POLICY_ZERO"),
        ({"has_symmetric_memory": False}, "has no NCCL symmetric memory"),
        ({"num_nodes": 2}, "2 nodes: the copy-engine all-to-all needs one NVLink domain"),
    ],
)
def test_every_reason_the_copy_engine_path_cannot_apply(fields, reason):
    status, mode = sm.decide(ON, _cap(**fields))
    assert (status.requested, status.applied, mode) == (True, False, None)
    assert reason in status.reason


def test_copy_engine_when_everything_holds_and_the_efficiency_fallback():
    assert sm.decide(ON, _cap()) == (ToggleStatus(True, True), "copy_engine")
    assert sm.decide(SMFreeConfig(), _cap()) == (ToggleStatus(False, False), None)
    fallback = SMFreeConfig(enabled=True, fallback="efficiency")
    status, mode = sm.decide(fallback, _cap(nccl_version=(2, 27, 3)))
    assert mode == "efficiency" and status.applied
    assert "NCCL 2.27.3 < 2.28" in status.reason and "EFFICIENCY" in status.reason
    status, mode = sm.decide(fallback, _cap(backend="gloo"))  # nothing to fall back to on gloo
    assert (mode, status.applied) == (None, False)


def test_probe_guards_the_apis_torch_versions_differ_on(monkeypatch):
    cap = sm.probe("gloo")
    assert cap.backend == "gloo" and not cap.cuda  # this machine has no GPU

    class OldNccl:  # a torch without the CTA policy constants
        pass

    class NewNccl:
        NCCL_CTA_POLICY_ZERO = 2
        NCCL_CTA_POLICY_EFFICIENCY = 1

    monkeypatch.setattr(dist, "ProcessGroupNCCL", OldNccl, raising=False)
    assert not sm.probe("nccl").has_cta_policy_zero
    monkeypatch.setattr(dist, "ProcessGroupNCCL", NewNccl, raising=False)
    new = sm.probe("nccl")
    assert new.has_cta_policy_zero and new.has_cta_policy_efficiency
    monkeypatch.delattr(dist, "ProcessGroupNCCL", raising=False)
    assert not sm.probe("nccl").has_cta_policy_zero


def test_nodes_from_the_launch_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert sm.probe("nccl").num_nodes == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    assert sm.probe("nccl").num_nodes == 1


# ------------------------------------------------------------------- padding arithmetic


def test_pad_and_unpad_round_trip_with_the_drawn_layout():
    """splits (3, 1, 2), C = 3 (module docstring of optim.sm_free)."""
    rows = torch.arange(6 * 2, dtype=torch.float32).reshape(6, 2) + 1
    padded = sm.pad_chunks(rows, [3, 1, 2], 3)
    assert padded.shape == (9, 2)
    assert padded[:3].tolist() == rows[:3].tolist()
    assert padded[3].tolist() == rows[3].tolist() and padded[4:6].abs().sum() == 0
    assert padded[6:8].tolist() == rows[4:6].tolist() and padded[8].abs().sum() == 0
    assert torch.equal(sm.unpad_chunks(padded, [3, 1, 2], 3), rows)
    out = torch.empty_like(rows)
    assert sm.unpad_chunks(padded, [3, 1, 2], 3, out) is out and torch.equal(out, rows)


def test_padding_checks_capacity_and_sizes():
    with pytest.raises(ValueError, match="capacity"):
        sm.pad_chunks(torch.zeros(5, 1), [4, 1], 3)
    with pytest.raises(ValueError, match="splits"):
        sm.pad_chunks(torch.zeros(5, 1), [1, 1], 3)
    assert sm.pad_chunks(torch.zeros(0, 4), [0, 0], 2).shape == (4, 4)


def test_offsets_and_overhead_by_hand():
    assert sm.chunk_offsets([3, 1, 2]).tolist() == [0, 3, 4, 6]
    # 6 useful rows of 16 bytes; 3 chunks of capacity 3 rows are sent: 9 rows, 50% more
    assert sm.padding_overhead([3, 1, 2], 3, 16) == (96, 144)
    stats = sm.PaddingStats(useful_bytes=96, sent_bytes=144)
    assert stats.overhead == pytest.approx(0.5)


# -------------------------------------------------------------------------------- markers


def test_markers_round_trip_and_reject_other_names():
    name = comm_marker("embedding", "3")
    assert name == "## fsobs:comm:embedding:3 ##"
    assert parse_comm_marker(name) == ("embedding", "3")
    for other in ("## fsobs:comm:weird:3 ##", "## fsobs:comm:dense: ##", "## forward ##"):
        assert parse_comm_marker(other) is None
    with pytest.raises(ValueError, match="role"):
        comm_marker("weird", "0")


# ----------------------------------------------------------------------------- dense gate


def _done(value: float) -> torch.futures.Future:
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(torch.tensor([value]))
    return future


class _Bucket(torch.autograd.Function):
    """In backward, hands one 'bucket' to the gate (as DDP's comm hook would)."""

    @staticmethod
    def forward(ctx, x, gate, log, name):
        ctx.gate, ctx.log, ctx.name = gate, log, name
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        def issue(name=ctx.name):
            ctx.log.append(f"issue {name}")
            return _done(1.0)

        ctx.log.append(f"ready {ctx.name}")
        _Bucket.futures.append(ctx.gate.submit(issue))
        return grad, None, None, None


class _EmbeddingA2A(torch.autograd.Function):
    """In backward, 'issues the embedding all-to-all': releases the gate."""

    @staticmethod
    def forward(ctx, x, gate, log):
        ctx.gate, ctx.log = gate, log
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.log.append("a2a")
        ctx.gate.release()
        return grad, None, None


def test_buckets_wait_for_the_embedding_all_to_all_then_go():
    """Backward runs the buckets first (they are nearer the loss), then the all-to-all."""
    gate, log = DenseGate(), []
    _Bucket.futures = []
    x = torch.ones(1, requires_grad=True)
    y = _Bucket.apply(
        _Bucket.apply(_EmbeddingA2A.apply(x, gate, log), gate, log, "b2"), gate, log, "b1"
    )
    y.sum().backward()
    assert log == ["ready b1", "ready b2", "a2a", "issue b1", "issue b2"]
    assert all(f.done() and f.value().item() == 1.0 for f in _Bucket.futures)


def test_a_backward_without_the_all_to_all_flushes_at_its_end():
    gate, log = DenseGate(), []
    _Bucket.futures = []
    x = torch.ones(1, requires_grad=True)
    _Bucket.apply(x, gate, log, "b1").sum().backward()
    assert log == ["ready b1", "issue b1"]  # flushed by the end-of-backward callback
    assert _Bucket.futures[0].done()
    # the next backward starts closed again: a bucket before the all-to-all waits for it
    log.clear()
    y = _Bucket.apply(_EmbeddingA2A.apply(x, gate, log), gate, log, "b2")
    y.sum().backward()
    assert log == ["ready b2", "a2a", "issue b2"]


def _embedding_first(gate: DenseGate, log: list[str]) -> None:
    """Two buckets nearer the loss than the embedding: their gradients come before its."""
    x = torch.ones(1, requires_grad=True)
    y = _Bucket.apply(
        _Bucket.apply(_EmbeddingA2A.apply(x, gate, log), gate, log, "b2"), gate, log, "b1"
    )
    y.sum().backward()


def _embedding_last(gate: DenseGate, log: list[str]) -> None:
    """The embedding nearer the loss: its all-to-all comes before the two buckets."""
    x = torch.ones(1, requires_grad=True)
    y = _EmbeddingA2A.apply(
        _Bucket.apply(_Bucket.apply(x, gate, log, "b2"), gate, log, "b1"), gate, log
    )
    y.sum().backward()


def test_auto_order_keeps_the_gate_where_the_backward_issues_the_all_to_all():
    for shape, held in ((_embedding_first, 2), (_embedding_last, 0)):
        gate, log = DenseGate(auto=True), []
        _Bucket.futures = []
        assert gate.describe().startswith("auto: not decided yet")
        shape(gate, log)
        assert gate.decision == "after_embedding" and gate.held == (held, 2)
        log.clear()
        shape(gate, log)  # still gated: a bucket ready before the all-to-all waits for it
        if held:
            assert log == ["ready b1", "ready b2", "a2a", "issue b1", "issue b2"]
            assert gate.describe() == (
                "auto: after_embedding (the backward's embedding all-to-all came after 2 of "
                "its 2 dense buckets: they wait for it)"
            )
        else:
            assert log == ["a2a", "ready b1", "issue b1", "ready b2", "issue b2"]
        assert all(f.done() for f in _Bucket.futures)


def test_auto_order_opens_the_gate_where_the_backward_has_no_all_to_all():
    """PEC sends its gradients after the backward: holding the buckets would only delay them."""
    gate, log = DenseGate(auto=True), []
    _Bucket.futures = []
    x = torch.ones(1, requires_grad=True)
    _Bucket.apply(_Bucket.apply(x, gate, log, "b2"), gate, log, "b1").sum().backward()
    assert log == ["ready b1", "ready b2", "issue b1", "issue b2"]  # flushed at the end
    assert gate.decision == "concurrent" and gate.held == (2, 2)
    assert gate.describe() == (
        "auto: concurrent (no embedding all-to-all in the backward: nothing to put before its "
        "2 dense buckets)"
    )
    log.clear()
    _Bucket.apply(_Bucket.apply(x, gate, log, "b2"), gate, log, "b1").sum().backward()
    assert log == ["ready b1", "issue b1", "ready b2", "issue b2"]  # torchrec's own order


def test_a_bucket_submitted_after_the_backward_goes_at_once():
    """DDP's static graph delays the first iteration's all-reduce to a callback at the end of
    the backward, which waits for every bucket: the gate must not park them there."""
    gate, log = DenseGate(auto=True), []
    _Bucket.futures = []
    x = torch.ones(1, requires_grad=True)

    def late_buckets() -> None:
        for name in ("b1", "b2"):
            _Bucket.futures.append(gate.submit(lambda name=name: _issued(log, name)))
        log.append(f"done {all(f.done() for f in _Bucket.futures)}")

    y = x * 2
    y.register_hook(
        lambda g: torch.autograd.Variable._execution_engine.queue_callback(late_buckets)
    )
    y.sum().backward()
    assert log == ["issue b1", "issue b2", "done True"]


def _issued(log: list[str], name: str) -> torch.futures.Future:
    log.append(f"issue {name}")
    return _done(1.0)


# -------------------------------------------------------------------------------- sync_gc


def test_sync_gc_collects_at_the_same_steps_and_restores_gc(monkeypatch):
    import gc

    from optim.sync_gc import SyncGC

    collected = []
    monkeypatch.setattr(gc, "collect", lambda generation=2: collected.append(generation))
    assert gc.isenabled()
    sync = SyncGC(SyncGCConfig(enabled=True, every=3, generation=1))
    sync.start()
    try:
        assert not gc.isenabled()
        for step in range(10):
            sync.after_step(step)
    finally:
        sync.stop()
    assert gc.isenabled()
    assert collected == [1, 1, 1]  # after steps 2, 5 and 8
    assert sync.collections == 3
    sync.after_step(11)  # stopped: Python's own collection again, nothing here
    unstarted = SyncGC(SyncGCConfig(enabled=True, every=1))
    unstarted.after_step(0)
    assert collected == [1, 1, 1] and unstarted.collections == 0
    off = SyncGC(SyncGCConfig())
    off.start()
    assert gc.isenabled()  # the toggle off leaves the collector alone
    off.after_step(9)
    off.stop()
    assert collected == [1, 1, 1]
