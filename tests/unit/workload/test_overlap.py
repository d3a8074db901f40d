"""The embedding-ID overlap of consecutive global batches (the sidecar's ``id_overlap``), on
hand-made batches with the shares counted by hand."""

from __future__ import annotations

import numpy as np
import pytest

from fsobs.collect.id_overlap import id_overlaps, overlap_share
from fsobs.workload.batch import POOLED_KEYS, SEQ_KEYS, collate
from fsobs.workload.data import DataConfig, Sample, SyntheticHistories, global_batches
from fsobs.workload.model import EBC_TABLES, EC_TABLES
from fsobs.workload.overlap import FEATURE_IDS, global_batch_overlaps, table_ids

TABLES = {**EBC_TABLES, **EC_TABLES}


def _sample(index: int, user: int, ctx: list[int], items: list[int], cats: list[int], target: int):
    return Sample(
        index=index,
        user_id=user,
        ctx_ids=np.array(ctx),
        item_seq=np.array(items),
        cat_seq=np.array(cats),
        target_item=target,
        label=1.0,
    )


STEP0 = [_sample(0, 1, [2], [3, 3], [0, 0], 8), _sample(1, 4, [2, 5], [8], [1], 3)]
STEP1 = [_sample(2, 1, [6], [3, 5], [0, 2], 8), _sample(3, 4, [2], [8, 8], [1, 1], 9)]


def test_shares_counted_by_hand():
    """Step 0 has user {1, 4}, ctx {2, 5}, item {3, 8} (histories 3 3 8, targets 8 3), cat
    {0, 1}. Step 1, per occurrence: users 1 4, both seen: 2 / 2; ctx 6 2: 1 / 2; items 3 5 8 8
    then targets 8 9 (the item table looks up both features): 3, 8, 8, 8 seen, 4 / 6; cats
    0 2 1 1: 3 / 4. Step 0 has no previous batch."""
    shares = id_overlaps([table_ids(STEP0, TABLES), table_ids(STEP1, TABLES)])
    assert shares[0] is None
    assert shares[1] == pytest.approx(
        {"t_user": 2 / 2, "t_ctx": 1 / 2, "t_item": 4 / 6, "t_cat": 3 / 4}
    )
    assert list(shares[1]) == list(TABLES)


def test_share_of_occurrences_not_of_distinct_ids():
    """3 and 8 were in the previous batch, 5 and 9 not: 3 of the 5 occurrences (3 8 8), while
    only 2 of the 4 distinct IDs."""
    assert overlap_share(np.array([3, 5, 8, 8, 9]), np.array([3, 3, 8])) == 3 / 5
    assert overlap_share(np.array([1]), np.array([], dtype=np.int64)) == 0.0
    with pytest.raises(ValueError, match="no ids"):
        overlap_share(np.array([], dtype=np.int64), np.array([1]))


def test_a_table_without_ids_in_the_batch_has_no_share():
    tables = {"t_user": ("user_id",), "t_none": ()}
    shares = id_overlaps([table_ids(STEP0, tables), table_ids(STEP1, tables)])
    assert shares == [None, {"t_user": 1.0}]
    assert id_overlaps([table_ids(STEP0, {"t_none": ()})] * 2) == [None, None]


def test_feature_ids_are_the_ids_collate_gives_each_feature():
    batch = collate(STEP0 + STEP1)
    assert set(FEATURE_IDS) == {*POOLED_KEYS, *SEQ_KEYS}
    for kjt in (batch.sparse_pooled, batch.sparse_seq):
        for key, jagged in kjt.to_dict().items():
            expected = np.concatenate([FEATURE_IDS[key](s) for s in STEP0 + STEP1])
            np.testing.assert_array_equal(jagged.values().numpy(), expected)


def test_global_batch_overlaps_compares_each_global_batch_with_the_one_before():
    """Against sets built sample by sample, on a small dataset."""
    data = SyntheticHistories(DataConfig(num_samples=60, num_items=40, seed=3))
    batches = global_batches(len(data), 12, 4, seed=3)
    shares = global_batch_overlaps(data, batches, TABLES)
    assert shares[0] is None
    for step in range(1, 4):
        seen = {t: set() for t in TABLES}
        for i in batches[step - 1]:
            s = data.sample(int(i))
            for table, features in TABLES.items():
                seen[table] |= {int(v) for f in features for v in FEATURE_IDS[f](s)}
        hits = dict.fromkeys(TABLES, 0)
        total = dict.fromkeys(TABLES, 0)
        for i in batches[step]:
            s = data.sample(int(i))
            for table, features in TABLES.items():
                ids = [int(v) for f in features for v in FEATURE_IDS[f](s)]
                hits[table] += sum(v in seen[table] for v in ids)
                total[table] += len(ids)
        assert shares[step] == pytest.approx({t: hits[t] / total[t] for t in TABLES})
