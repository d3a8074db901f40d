"""The analysis's disk spill: blobs appended to one anonymous file, and the per-rank store of
the class interval sets built on it (what an analysis keeps instead of every rank's sets);
the text the ranks' collectives share, held once."""

from __future__ import annotations

import gc
import os
import pickle
import weakref
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from fsobs.analysis.bubbles.classify import StepBubbles
from fsobs.analysis.bubbles.parts import CLASSES
from fsobs.analysis.bubbles.store import BubbleStore
from fsobs.analysis.collectives.matching import (
    _INTERN_RANKS,
    _all_ranks,
    _shared_strings,
    concat_columns,
    pack_collectives,
    unpack_collectives,
)
from fsobs.analysis.spill import SpillFile
from fsobs.trace.schema import Run


def test_blobs_come_back_whole_from_their_offsets():
    spill = SpillFile()
    blobs = [b"first", b"", os.urandom(3 * 2**20 + 7), b"last"]
    pieces = [spill.put(b) for b in blobs]
    assert [(p.offset, p.size) for p in pieces] == [
        (0, 5),
        (5, 0),
        (5, 3 * 2**20 + 7),
        (3 * 2**20 + 12, 4),
    ]
    assert spill.size == sum(len(b) for b in blobs)
    assert [p.read() for p in reversed(pieces)] == blobs[::-1]
    assert pieces[0].file is spill


def test_a_blob_past_the_end_is_an_error():
    spill = SpillFile()
    spill.put(b"abc")
    with pytest.raises(EOFError, match="before byte 5"):
        spill.read(1, 4)


def _steps(rank: int, steps: list[int]) -> list[StepBubbles]:
    """Steps of 100 ns windows; class k of step s holds one interval of s + k ns."""
    out = []
    for s in steps:
        lo = s * 100
        classes = {
            name: (np.array([lo], np.int64), np.array([lo + s + k], np.int64))
            for k, name in enumerate(CLASSES)
        }
        out.append(StepBubbles(rank, s, (lo, lo + 100), classes, s, {rank + 1: s}, {}))
    return out


def _same(a: list[StepBubbles], b: list[StepBubbles]) -> None:
    assert [(x.rank, x.step, x.window, x.contention_ns, x.caused_ns) for x in a] == [
        (x.rank, x.step, x.window, x.contention_ns, x.caused_ns) for x in b
    ]
    for x, y in zip(a, b, strict=True):
        for name in CLASSES:
            np.testing.assert_array_equal(x.classes[name][0], y.classes[name][0])
            np.testing.assert_array_equal(x.classes[name][1], y.classes[name][1])


def test_the_store_gives_each_rank_its_steps_and_iterates_in_rank_order():
    store = BubbleStore()
    assert not store and store.ranks == [] and list(store) == []
    store.put(3, _steps(3, [0, 1]))
    store.put(1, _steps(1, [0, 1, 2]))
    assert store.ranks == [1, 3] and len(store) == 5
    _same(store.of_rank(3), _steps(3, [0, 1]))
    assert store.of_rank(2) == []
    _same(list(store), _steps(1, [0, 1, 2]) + _steps(3, [0, 1]))
    _same(store.of_ranks([3, 1]), _steps(3, [0, 1]) + _steps(1, [0, 1, 2]))
    assert store.of_rank(1)[2].total_ns("straggler_wait") == 2 + 1  # step 2, class 1
    with pytest.raises(ValueError, match="rank 3 is already stored"):
        store.put(3, [])


def test_a_pickled_store_carries_its_steps_and_no_file():
    store = BubbleStore()
    store.put(0, _steps(0, [4, 5]))
    spill = weakref.ref(store._file)  # type: ignore[arg-type]
    again = pickle.loads(pickle.dumps(store))
    assert again.ranks == [0] and len(again) == 2 and again.nbytes == store.nbytes > 0
    _same(list(again), list(store))
    del store
    gc.collect()
    assert spill() is None  # the original's file is closed; the copy does not need it
    _same(list(again), _steps(0, [4, 5]))
    assert again._file is None


def test_the_collectives_text_of_every_rank_is_held_once():
    """Each rank names the same member lists; once interned, the run holds each text once. The
    columns stay object columns (an all-NaN one too), their NaN the very objects they were."""
    a, b = "".join(["[0, 1", ", 2]"]), "".join(["[0, 1, ", "2]"])
    assert a == b and a is not b
    frame = pd.DataFrame(
        {"pg_ranks": [a, b, np.nan], "pg_desc": [np.nan] * 3, "n": [1, 2, 3]}
    ).astype({"pg_ranks": object, "pg_desc": object})
    nan = frame["pg_ranks"].iloc[2]
    out = _shared_strings(frame)
    assert out["pg_ranks"].iloc[0] is out["pg_ranks"].iloc[1]
    assert out["pg_ranks"].iloc[2] is nan
    assert out["pg_ranks"].dtype == object and out["pg_desc"].dtype == object
    assert out["n"].tolist() == [1, 2, 3]


def test_every_rank_holds_the_one_text_when_read_group_by_group():
    """_all_ranks reads the ranks' collectives _INTERN_RANKS at a time: across the groups too,
    every rank's member list is the one object, and the rows stay in rank order."""
    num_ranks = 2 * _INTERN_RANKS + 3
    members = ", ".join(str(r) for r in range(num_ranks))

    def frame(rank: int) -> bytes:
        text = "".join(["[", members, "]"])  # a new object on every rank, as unpickled
        rows = {"rank": np.array([rank, rank]), "pg_ranks": np.array([text, text], dtype=object)}
        return pack_collectives(rows)

    ranks = {r: SimpleNamespace(sync_collectives=frame(r)) for r in reversed(range(num_ranks))}
    out = _all_ranks(Run(path=Path("run"), world_size=num_ranks, ranks=ranks, meta=None))
    assert out["rank"].tolist() == [r for r in range(num_ranks) for _ in range(2)]
    assert len({id(v) for v in out["pg_ranks"]}) == 1
    assert out["pg_ranks"].iloc[0] == f"[{members}]"


def test_the_ranks_columns_concatenate_as_pandas_does():
    """concat_columns is pd.concat(ignore_index=True): array by array where the parts
    agree on columns and dtypes, pandas' own concatenation where they do not (an empty part of
    object columns makes them all object, int beside float makes float)."""
    ranks = [
        pd.DataFrame({"rank": [0, 0], "coll": ["all_reduce", "barrier"], "pg": [np.nan, "[0]"]}),
        pd.DataFrame({"rank": [2], "coll": ["all_to_all"], "pg": [np.nan]}).astype({"pg": object}),
    ]
    out = concat_columns([pack_and_unpack(f) for f in ranks])
    assert out["rank"].tolist() == [0, 0, 2] and out["rank"].dtype == np.int64
    assert out["coll"].tolist() == ["all_reduce", "barrier", "all_to_all"]
    assert out["pg"].dtype == object and out["pg"].iloc[1] == "[0]" and out["pg"].isna().sum() == 2
    pd.testing.assert_frame_equal(out, pd.concat(ranks, ignore_index=True))
    empty = pd.DataFrame({"rank": np.zeros(0, np.int64), "coll": [], "pg": []}).astype(object)
    out = concat_columns([pack_and_unpack(f) for f in [*ranks, empty]])
    assert out["rank"].dtype == object and out["rank"].tolist() == [0, 0, 2]
    mixed = [pd.DataFrame({"x": [1, 2]}), pd.DataFrame({"x": [0.5]})]
    assert concat_columns([pack_and_unpack(f) for f in mixed])["x"].tolist() == [1.0, 2.0, 0.5]


def pack_and_unpack(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    return unpack_collectives(pack_collectives({c: frame[c].to_numpy() for c in frame.columns}))
