"""The roles of PEC's collectives (torchrec's ranges around their launch), on hand-built traces
with the expected by_role values derived by hand (legend of tests/unit/analysis/test_bubbles.py:
``~``
straggler wait, ``x`` exposed, ``=`` compute)."""

from __future__ import annotations

import json

import pytest

from fsobs.analysis import analyze, compare
from fsobs.analysis.pipeline import kpis_by_role
from fsobs.report import compare_json, to_json
from tests.support.bubble_rows import checked_table, expect_row, load_docs
from tests.support.kineto import (
    GLOO_PG1_TID,
    cpu_doc,
    cpu_op,
    gemm,
    gloo,
    kernel,
    launch,
    step,
    trace,
    x,
)

MARK = "## fsobs:comm:embedding:0 ##"
"""FreeScale's marker around torchrec's embedding collectives (optim.comm), group "0"."""


def _a2a(enqueue: float, start: float, end: float, *, tid: int | None = None) -> list[dict]:
    """One all_to_all: FreeScale's marker and the enqueue (1 µs) on the main thread, the
    transfer ``[start, end)`` on a gloo worker thread."""
    transfer = gloo("all_to_all", start, end - start, **({"tid": tid} if tid else {}))
    return [
        x(MARK, "user_annotation", enqueue, 1),
        cpu_op("c10d::alltoall_base_", enqueue, 1),
        transfer,
    ]


def _range(name: str, ts: float, dur: float, pec: bool) -> list[dict]:
    return [x(f"## {name} ##", "user_annotation", ts, dur)] if pec else []


def _mm(ts: float, end: float, name: str = "aten::mm") -> list[dict]:
    return [cpu_op(name, ts, end - ts)] if end > ts else []


def gloo_pec_rank(rank: int, *, pec: bool = True) -> dict:
    """One PEC step of 200 µs on a gloo rank: seven all_to_alls, each under the range torchrec's
    TrainPipelinePEC puts around it (``pec=False``: the same trace without PEC's ranges).

    ::

        t (µs)  0   10 15   25  40 45 50  58 65  78 80   95 100  110 125 130 136 145 150 155 160 170
        r0 main |===|~~~~xxxx|==|xx|==|~~~~xxx|==|xx|=====|xx|xxxxx|===|=|~|====|xx|~|====|xxxx|===
        r1 main |======|xxxxx|==|xx|=======|xx|==|xx|=====|xx|xxxxx|=====|x|===|xx|==|x|===|xxxx|===
                 OL fwd       X    mask       splits+deferred       ahead      OL grad

    - OL forward (pec_ol_compute > All2All_Seq_fwd): enqueues 10 (r0), 15 (r1), transfer to
      25. r0: wait [10, 15) = 5, exposed [15, 25) = 10; r1: exposed [15, 25) = 10.
    - X (pec_overlap_dist, not under all2all_data:ids: not the mask, the marker's embedding):
      enqueues 40, transfer to 45: exposed 5 on each rank.
    - mask (pec_overlap_dist > all2all_data:ids): enqueues 50 (r0), 58 (r1), transfer to 65.
      r0: wait [50, 58) = 8, exposed 7; r1: exposed 7.
    - splits (embedding, no PEC range) enqueued at 78, transfer [79, 100) on one worker; the
      deferred NOL gradient (pec_nol_grad_a2a) enqueued at 79, transfer [80, 110) on the other;
      forward compute [80, 95). Blocked [78, 80) and [95, 100) with the splits in flight:
      embedding 2 + 5 = 7 (embedding before the deferred gradient where both are in flight);
      blocked [100, 110): deferred gradient 10. The same on both ranks.
    - ahead NOL lookup (pec_nol_compute): enqueues 130 (r0), 136 (r1), transfer to 150, backward
      compute from the enqueue's end to 145. r0: blocked [130, 131) (the enqueue) and
      [145, 150): wait 1 (the wait set is [130, 136)), exposed 5; r1: exposed 1 + 5 = 6.
    - OL gradient (pec_ol_grad_a2a): enqueues 150 (r0), 155 (r1), transfer to 170, optimizer
      compute to 160. r0: wait 1, exposed [160, 170) = 10; r1: exposed 1 + 10 = 11.

    r0: wait 5 + 8 + 1 + 1 = 15, exposed 10 + 5 + 7 + 7 + 10 + 5 + 10 = 54, busy 200 - 69 = 131.
    r1: wait 0, exposed 10 + 5 + 7 + 7 + 10 + 6 + 11 = 56, busy 144.
    """
    ol, mask, ahead, ol_grad = (10, 50, 130, 150) if rank == 0 else (15, 58, 136, 155)
    events = [
        *_range("pec_ol_compute", 0, 30, pec),
        *_range("All2All_Seq_fwd", ol, 1, pec),
        *_mm(0, ol),
        *_a2a(ol, ol + 1, 25),
        *_mm(25, 40),
        *_range("pec_overlap_dist", 40, 37, pec),
        *_a2a(40, 41, 45),
        *_mm(45, mask),
        *_range("all2all_data:ids", mask, 1, pec),
        *_a2a(mask, mask + 1, 65),
        *_mm(65, 78),
        *_a2a(78, 79, 100),
        *_range("pec_nol_grad_a2a", 79, 1, pec),
        *_a2a(79, 80, 110, tid=GLOO_PG1_TID),
        *_mm(80, 95, "aten::bmm"),  # compute overlapping comm: ops of their own
        *_range("pec_nol_grad_apply", 100, 12, pec),
        *_mm(110, ahead),
        *_range("pec_nol_compute", 125, 15, pec),
        *_a2a(ahead, ahead + 1, 150),
        *_mm(ahead + 1, 145, "aten::addmm"),  # (no contention)
        *_mm(150, ol_grad),
        *_range("pec_ol_grad_a2a", ol_grad, 2, pec),
        *_a2a(ol_grad, ol_grad + 1, 170),
        cpu_op("aten::add_", ol_grad + 1, 160 - ol_grad - 1),
        *_range("pec_ol_grad_apply", 160, 10, pec),
        *_mm(170, 200),
    ]
    return cpu_doc(rank, events, steps=((1, 0, 200),))


def _gloo_run(tmp_path, *, pec: bool = True):
    return load_docs(tmp_path, [gloo_pec_rank(0, pec=pec), gloo_pec_rank(1, pec=pec)])


def _ms(wait_us: float, exposed_us: float) -> dict[str, float]:
    return {
        "straggler_wait_ms_per_step": pytest.approx(wait_us / 1000),
        "exposed_comm_ms_per_step": pytest.approx(exposed_us / 1000),
    }


def test_gloo_collectives_take_the_role_of_the_pec_range_around_their_enqueue(tmp_path):
    """by_role, means over the 2 ranks of one step, in µs (see :func:`gloo_pec_rank`):
    pec_overlapped wait (5 + 0) / 2, exposed (10 + 10) / 2; embedding (X and the splits)
    exposed (5 + 7 + 5 + 7) / 2; pec_mask wait 8 / 2, exposed 7; pec_ahead wait 1 / 2, exposed
    (5 + 6) / 2; pec_overlapped_grad wait 1 / 2, exposed (10 + 11) / 2; pec_deferred_grad
    exposed 10; embedding_total the sum of embedding and PEC's roles: wait 7.5, exposed 55, the
    whole of the run's wait (15 / 2) and exposed time ((54 + 56) / 2)."""
    run = _gloo_run(tmp_path)
    result = analyze(run)
    assert result.collectives.problems.empty
    first = result.collectives.instances.drop_duplicates("instance").sort_values("instance")
    assert first["role"].tolist() == [
        "pec_overlapped",
        "embedding",
        "pec_mask",
        "embedding",
        "pec_deferred_grad",
        "pec_ahead",
        "pec_overlapped_grad",
    ]
    assert set(first["group"]) == {"0"}  # the marker still names the group
    table = checked_table(run)
    expect_row(table, 0, 1, window=200, busy=131, straggler_wait=15, exposed_comm=54)
    expect_row(table, 1, 1, window=200, busy=144, exposed_comm=56)
    roles = kpis_by_role(result.roles)
    assert list(roles) == [
        "embedding",
        "dense",
        "other",
        "pec_overlapped",
        "pec_ahead",
        "pec_mask",
        "pec_overlapped_grad",
        "pec_deferred_grad",
        "embedding_total",
    ]
    assert roles["embedding"] == _ms(0, (5 + 7 + 5 + 7) / 2)
    assert roles["dense"] == roles["other"] == _ms(0, 0)
    assert roles["pec_overlapped"] == _ms((5 + 0) / 2, (10 + 10) / 2)
    assert roles["pec_ahead"] == _ms(1 / 2, (5 + 6) / 2)
    assert roles["pec_mask"] == _ms(8 / 2, 7)
    assert roles["pec_overlapped_grad"] == _ms(1 / 2, (10 + 11) / 2)
    assert roles["pec_deferred_grad"] == _ms(0, 10)
    assert roles["embedding_total"] == _ms(15 / 2, (54 + 56) / 2)
    out = json.loads(json.dumps(to_json(result)))
    assert out["by_role"]["pec_mask"] == {
        "straggler_wait_ms_per_step": pytest.approx(0.004),
        "exposed_comm_ms_per_step": pytest.approx(0.007),
    }


def test_without_pec_ranges_the_same_trace_has_only_the_three_roles(tmp_path):
    """Every collective is marked embedding: the whole wait (15 / 2) and exposed time
    ((54 + 56) / 2) are embedding's, and no PEC key appears."""
    roles = kpis_by_role(analyze(_gloo_run(tmp_path, pec=False)).roles)
    assert list(roles) == ["embedding", "dense", "other"]
    assert roles["embedding"] == _ms(15 / 2, (54 + 56) / 2)


def test_compare_a_plain_run_with_a_pec_run_by_role(tmp_path):
    """Control: the trace without PEC's ranges (all embedding); test: with them. The PEC roles
    are 0 in the control; embedding_total is the same in both (the same collectives), while
    embedding alone drops from 55 to 12 µs exposed (1 - 12 / 55)."""
    control = analyze(_gloo_run(tmp_path / "plain", pec=False))
    test = analyze(_gloo_run(tmp_path / "pec"))
    comp = compare(control, test, n_boot=50)
    rows = comp.by_role.set_index(["role", "class"])
    assert rows.index.get_level_values("role").unique().tolist() == [
        "embedding",
        "dense",
        "other",
        "pec_overlapped",
        "pec_ahead",
        "pec_mask",
        "pec_overlapped_grad",
        "pec_deferred_grad",
        "embedding_total",
    ]
    exposed = rows.xs("exposed_comm", level="class")
    assert exposed.loc["embedding", ["control", "test"]].tolist() == pytest.approx([0.055, 0.012])
    assert exposed.loc["embedding", "reduction"] == pytest.approx(1 - 12 / 55)
    assert exposed.loc["pec_mask", ["control", "test"]].tolist() == pytest.approx([0, 0.007])
    assert exposed.loc["embedding_total", ["control", "test"]].tolist() == pytest.approx(
        [0.055, 0.055]
    )
    assert exposed.loc["embedding_total", "reduction"] == pytest.approx(0, abs=1e-12)
    wait = rows.xs("straggler_wait", level="class")
    assert wait.loc["embedding_total", ["control", "test"]].tolist() == pytest.approx(
        [0.0075, 0.0075]
    )
    out = compare_json(comp)
    assert {r["role"] for r in out["by_role"]} >= {"pec_mask", "embedding_total"}


def _nccl(ts: float, dur: float, corr: int, seq: int, **args: object) -> dict:
    return kernel(
        "ncclDevKernel_SendRecv",
        ts,
        dur,
        stream=20,
        corr=corr,
        Collective_name="all_to_allv",
        Process_Group_Name="0",
        Process_Group_Description="freescale_emb",
        Seq=seq,
        dtype="Float",
        **args,
    )


def _gpu_rank(rank: int) -> dict:
    """One GPU step: gemm, the OL lookup all_to_all, the mask all_to_all and another
    all_to_all of overlap_dist, gemm. Each kernel's launch (cudaLaunchKernel, corr 1..5) lies
    in the CPU range torchrec records around it::

        CPU   -45 gemm | pec_ol_compute [-40, -35): -38 | pec_overlap_dist [-30, -20):
              all2all_data:ids [-29, -27): -28, then -25 | -15 gemm
        t (µs)   0        10  14          30        40   45           60
        r0 gpu   |==gemm==|~~~~|xxxxxxxxxxx|xxxxxxxxx|xxxx|====gemm====|
        r1 gpu   |===gemm=====|xxxxxxxxxxxx|xxxxxxxxx|xxxx|====gemm====|
                            OL (pec_overlapped)  mask   X

    The group's description says embedding (freescale_emb); the PEC range wins for the OL
    lookup and the mask, X keeps embedding. r0: OL wait [10, 14) = 4, exposed 16; mask 10;
    X 5; busy 10 + 15. r1: OL exposed 16, mask 10, X 5, busy 14 + 15."""
    ol = 10 if rank == 0 else 14
    cpu = [
        step(1, -50, 200),
        launch(-45, 1, dur=0.5),
        x("## pec_ol_compute ##", "user_annotation", -40, 5),
        launch(-38, 2, dur=0.5),
        x("## pec_overlap_dist ##", "user_annotation", -30, 10),
        x("## all2all_data:ids ##", "user_annotation", -29, 2),
        launch(-28, 3, dur=0.5),
        launch(-25, 4, dur=0.5),
        launch(-15, 5, dur=0.5),
    ]
    gpu = [
        gemm(0, ol, corr=1),
        _nccl(ol, 30 - ol, 2, 1),
        _nccl(30, 10, 3, 2),
        _nccl(40, 5, 4, 3),
        gemm(45, 15, corr=5),
    ]
    return trace(cpu + gpu, rank=rank, world_size=2)


def test_nccl_kernels_take_the_role_of_the_pec_range_around_their_launch(tmp_path):
    """by_role in µs, means over the 2 ranks: pec_overlapped wait (4 + 0) / 2, exposed 16;
    pec_mask exposed 10; embedding (X) exposed 5; embedding_total wait 2, exposed 31."""
    run = load_docs(tmp_path, [_gpu_rank(0), _gpu_rank(1)])
    result = analyze(run)
    table = checked_table(run)
    expect_row(table, 0, 1, window=60, busy=25, straggler_wait=4, exposed_comm=31)
    expect_row(table, 1, 1, window=60, busy=29, exposed_comm=31)
    roles = kpis_by_role(result.roles)
    assert list(roles) == [
        "embedding",
        "dense",
        "other",
        "pec_overlapped",
        "pec_mask",
        "embedding_total",
    ]
    assert roles["pec_overlapped"] == _ms((4 + 0) / 2, 16)
    assert roles["pec_mask"] == _ms(0, 10)
    assert roles["embedding"] == _ms(0, 5)
    assert roles["embedding_total"] == _ms(2, 31)


def test_the_reports_show_pec_roles_and_count_the_mask_exchange_as_pecs_cost(tmp_path):
    """analyze: a role table and a finding with embedding_total, wait 7.5 + exposed 55 µs =
    0.0625 ms, of which the mask's 4 + 7 µs = 0.011 ms; compare: the same note under the roles.
    A run without PEC's ranges shows neither."""
    from rich.console import Console

    from fsobs.report import findings, render, render_comparison
    from fsobs.report.analysis import EMBEDDING_TOTAL_NOTE

    pec = analyze(_gloo_run(tmp_path / "pec"))
    plain = analyze(_gloo_run(tmp_path / "plain", pec=False))
    lines = findings(pec)
    assert any(
        "embedding communication blocks 0.06 ms per rank and step" in line
        and "0.01 ms in PEC's mask exchange (pec_mask)" in line
        for line in lines
    )
    console = Console(record=True, width=400)
    render(pec, console)
    text = console.export_text()
    assert "Communication by role" in text and "pec_deferred_grad" in text
    assert EMBEDDING_TOTAL_NOTE in text
    console = Console(record=True, width=400)
    render(plain, console)
    assert "Communication by role" not in console.export_text()
    assert not any("PEC" in line for line in findings(plain))
    console = Console(record=True, width=400)
    render_comparison(compare(plain, pec, n_boot=20), console)
    text = console.export_text()
    assert "pec_mask exposed comm: 0.00 -> 0.01 ms" in text
    assert EMBEDDING_TOTAL_NOTE in text
