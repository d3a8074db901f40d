"""The global batch's IDs per table: every rank's own IDs all-gathered (uneven, empty ranks) on
the recorder's gloo group, the same concatenation in rank order on every rank; and a rank's IDs
per table from a torchrec KeyedJaggedTensor."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fsobs.collect import ProfilerConfig, RunRecorder, table_ids  # noqa: E402
from fsobs.runformat import read_sidecars  # noqa: E402
from tests.support.dist import run_ranks  # noqa: E402

# per step, per rank, per table: uneven sizes, a rank with none in a table, a rank with none
LOCAL = [
    [{"item": [1, 2, 3], "cat": []}, {"item": [7], "cat": [4, 5]}],
    [{"item": [3, 9], "cat": [4]}, {"item": [], "cat": []}],  # rank 1 has nothing
    [{"item": [], "cat": []}, {"item": [], "cat": []}],  # nobody has anything
]
GLOBAL = [  # rank 0's then rank 1's, by hand
    {"item": [1, 2, 3, 7], "cat": [4, 5]},
    {"item": [3, 9], "cat": [4]},
    {"item": [], "cat": []},
]


def _gather_main(rank: int, world_size: int, out: str) -> None:
    rec = RunRecorder(Path(out) / "run", profiler=ProfilerConfig(enabled=False))
    got = []
    for step, per_rank in enumerate(LOCAL):
        mine = {t: torch.tensor(v, dtype=torch.int64) for t, v in per_rank[rank].items()}
        rec.begin_step(step, lengths=[1])
        ids = rec.global_ids(mine)
        rec.end_step(ids=ids)
        got.append({t: v.tolist() for t, v in ids.items()})
        assert all(v.dtype == np.int64 for v in ids.values())
    try:
        rec.global_ids({"item": [1]} if rank == 0 else {"other": [1]})
    except ValueError as error:
        got.append(str(error).split(" (")[0])
    rec.close()
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(got))


@pytest.mark.multiprocess
def test_every_rank_gets_the_same_concatenation_in_rank_order(tmp_path):
    run_ranks(_gather_main, 2, str(tmp_path))
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for got in results:
        assert got[:3] == GLOBAL
        assert got[3] == "local: the ranks name other tables"  # both raise, neither hangs
    side = read_sidecars(tmp_path / "run")
    assert side is not None
    # step 1's global IDs against step 0's: item 3 of {3, 9} seen (1/2), cat 4 of {4} (1/1);
    # step 2 has none: no share for a table with no ID
    for rank in (0, 1):
        overlap = side[side["rank"] == rank].set_index("step")["id_overlap"]
        assert overlap[1] == {"item": 0.5, "cat": 1.0}
        assert not isinstance(overlap[2], dict) or overlap[2] == {}


def test_alone_the_ids_are_the_rank_own(tmp_path):
    rec = RunRecorder(tmp_path / "run", profiler=ProfilerConfig(enabled=False))
    got = rec.global_ids({"item": torch.tensor([4, 2]), "cat": [1]})
    assert {t: v.tolist() for t, v in got.items()} == {"item": [4, 2], "cat": [1]}
    with pytest.raises(ValueError, match=r"local\['item'\]: must be a 1-D sequence"):
        rec.global_ids({"item": [[1]]})
    with pytest.raises(ValueError, match="local: must map"):
        rec.global_ids([1, 2])  # type: ignore[arg-type]
    rec.close()


def test_table_ids_from_a_keyed_jagged_tensor():
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    # 2 samples: history [10, 11] and [12]; category [3] and [4]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["history", "category"],
        values=torch.tensor([10, 11, 12, 3, 4]),
        lengths=torch.tensor([2, 1, 1, 1]),
    )
    got = table_ids(kjt, {"t_item": ["history"], "t_both": ["category", "history"]})
    assert {t: v.tolist() for t, v in got.items()} == {
        "t_item": [10, 11, 12],
        "t_both": [3, 4, 10, 11, 12],
    }
    with pytest.raises(ValueError, match=r"tables\['t'\]: features \['age'\] are not"):
        table_ids(kjt, {"t": ["history", "age"]})
    with pytest.raises(ValueError, match=r"tables\['t'\]: must be a non-empty list"):
        table_ids(kjt, {"t": "history"})
