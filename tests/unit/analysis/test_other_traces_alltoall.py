"""all_to_allv imbalance (issue 24, point 7): per instance the send and receive imbalance
(max / mean) and the rank x rank volume matrix from the split sizes, tied to the step
sidecars' data, in the JSON and the report. Expected values derived by hand."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from rich.console import Console

import fsobs
from fsobs.analysis import analyze
from fsobs.analysis.collectives.alltoall import _splits
from fsobs.report import findings, render, to_json
from tests.support.kineto import kernel, launch, step, trace, write_ranks

SPLITS = ([1, 2, 3], [4, 4, 4], [1, 1, 0])
"""Rows rank r sends to ranks 0, 1, 2; a row is 2 float32 elements (8 bytes)::

    sent:      rank 0  6 rows = 48 bytes   ->  [8, 16, 24]
               rank 1 12 rows = 96 bytes   ->  [32, 32, 32]
               rank 2  2 rows = 16 bytes   ->  [8, 8, 0]
    received:  rank 0  8 + 32 + 8 = 48,  rank 1 16 + 32 + 8 = 56,  rank 2 24 + 32 + 0 = 56

Send imbalance 96 / (160 / 3) = 1.8, receive 56 / (160 / 3) = 1.05; the top sender is rank 1,
ranks 1 and 2 tie as top receivers (none named).
"""
RECEIVED = ([1, 4, 1], [2, 4, 1], [3, 4, 0])


def _rank(rank: int) -> dict:
    """One step; the all_to_allv (Seq 1) starts at 10 µs on every rank and ends at 30; then an
    equal all_to_all (Seq 2, no split sizes) of 64 bytes each, [40, 50)."""
    a2av = kernel(
        "ncclDevKernel_SendRecv",
        10,
        20,
        stream=20,
        corr=1,
        Collective_name="all_to_allv",
        Process_Group_Name="0",
        Seq=1,
        dtype="Float",
        In_msg_nelems=2 * sum(SPLITS[rank]),
        Out_msg_nelems=2 * sum(RECEIVED[rank]),
        In_split_size=str(SPLITS[rank]),
        Out_split_size=str(RECEIVED[rank]),
    )
    equal = kernel(
        "ncclDevKernel_SendRecv",
        40,
        10,
        stream=20,
        corr=2,
        Collective_name="all_to_all",
        Process_Group_Name="0",
        Seq=2,
        dtype="Float",
        In_msg_nelems=16,
        Out_msg_nelems=16,
        In_split_size="[]",
        Out_split_size="[]",
    )
    events = [step(1, 0, 100), launch(1, 1, dur=0.5), launch(2, 2, dur=0.5), a2av, equal]
    return trace(events, rank=rank, world_size=3)


@pytest.fixture
def a2a_run(tmp_path):
    """The run, with sidecars: rank 1 has the most ids in step 1 (len_sum 40 of 10, 40, 1)."""
    write_ranks(tmp_path, [_rank(r) for r in range(3)])
    for rank, lengths in enumerate(([5, 5], [20, 20], [1])):
        record = {"step": 1, "num_samples": len(lengths), "seq_lengths": lengths}
        (tmp_path / f"steps.rank{rank}.jsonl").write_text(json.dumps(record) + "\n")
    return tmp_path


def test_imbalance_and_matrix_per_instance(a2a_run):
    result = analyze(fsobs.load_run(a2a_run))
    rows = result.collectives.all_to_all.per_instance.set_index("instance")
    first, equal = rows.loc[0], rows.loc[1]
    assert first["send_imbalance"] == pytest.approx(1.8)
    assert first["recv_imbalance"] == pytest.approx(1.05)
    assert first["send_bytes_total"] == 160
    assert first["heaviest_sender"] == 1 and pd.isna(first["heaviest_receiver"])
    assert equal["send_imbalance"] == 1.0 and pd.isna(equal["heaviest_sender"])
    ranks, matrix = result.collectives.all_to_all.matrices[0]
    assert ranks == [0, 1, 2]
    assert matrix.tolist() == [[8, 16, 24], [32, 32, 32], [8, 8, 0]]
    assert 1 not in result.collectives.all_to_all.matrices  # no split sizes: no matrix


def test_the_json_ties_it_to_the_data(a2a_run):
    out = to_json(analyze(fsobs.load_run(a2a_run)))["collectives"]["all_to_all"]
    first, equal = out["per_instance"]
    assert first["most_ids_rank"] == 1 and first["heaviest_sender_has_most_ids"] is True
    assert equal["heaviest_sender"] is None and equal["heaviest_sender_has_most_ids"] is None
    assert out["matrices"] == [
        {"instance": 0, "ranks": [0, 1, 2], "bytes": [[8, 16, 24], [32, 32, 32], [8, 8, 0]]}
    ]


def test_the_report_names_the_most_uneven_instance(a2a_run):
    result = analyze(fsobs.load_run(a2a_run))
    assert (
        "all_to_all(v) sizes are uneven: up to 1.80x the mean sent and 1.05x the mean received "
        "(instance 0, step 1, top sender rank 1); median over 2 instance(s) 1.40x sent; the top "
        "sender had its step's most ids (step sidecars) in 1 of 1 instance(s)"
    ) in findings(result)
    console = Console(record=True, width=200)
    render(result, console)
    text = console.export_text()
    assert "all_to_all(v) instance 0: bytes sent (row) to (column)" in text


def test_the_received_sizes_come_from_the_matrix_when_not_recorded(tmp_path):
    """Without ``Out msg nelems``, the matrix's column sums are what each rank received."""
    docs = [_rank(r) for r in range(3)]
    for doc in docs:
        for event in doc["traceEvents"]:
            event.get("args", {}).pop("Out msg nelems", None)
    result = analyze(fsobs.load_run(write_ranks(tmp_path, docs)))
    rows = result.collectives.all_to_all.per_instance.set_index("instance")
    assert rows.loc[0, "recv_imbalance"] == pytest.approx(1.05)
    assert pd.isna(rows.loc[1, "recv_imbalance"])  # equal splits, nothing recorded


@pytest.mark.parametrize(
    ("text", "splits"),
    [("[3, 1]", [3, 1]), ("[]", None), ("[1, 2, ..., 9]", None), ("x", None), (None, None)],
)
def test_split_sizes_are_read_only_when_whole(text, splits):
    assert _splits(text) == splits
