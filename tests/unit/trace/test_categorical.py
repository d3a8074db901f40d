"""Reads of categorical columns from their codes (fsobs.trace.categorical) give what the
pandas operations they replace give, NaN rows included."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fsobs.trace.categorical import CACHED_CATEGORIES, codes, decoded, is_in, string_dtype


def _column() -> pd.Series:
    # categories in their own order, one unused, a NaN row
    values = pd.Categorical(["b", None, "a", "b"], categories=["b", "c", "a"])
    return pd.Series(values)


def test_codes_are_the_positions_in_the_categories_and_minus_one_for_nan():
    assert codes(_column()).tolist() == [0, -1, 2, 0]


def test_is_in_never_holds_for_nan():
    assert is_in(_column(), ("a", "c")).tolist() == [False, False, True, False]
    assert is_in(_column(), ()).tolist() == [False] * 4
    assert is_in(_column(), frozenset({"b"})).tolist() == [True, False, False, True]


def test_decoded_is_astype_object_with_the_missing_value_chosen():
    plain = decoded(_column())
    assert plain.dtype == object
    assert plain[0] == "b" and np.isnan(plain[1]) and plain[2] == "a"
    assert decoded(_column(), "default").tolist() == ["b", "default", "a", "b"]
    assert decoded(_column(), -1, len).tolist() == [1, -1, 1, 1]


def test_a_string_dtype_is_made_once_per_set_of_categories():
    """The ranks of a run share their categories: the dtype is pandas' own, made once."""
    first = string_dtype(("all_reduce", "barrier"))
    assert first == pd.CategoricalDtype(["all_reduce", "barrier"]) and not first.ordered
    assert string_dtype(("all_reduce", "barrier")) is first
    assert string_dtype(("barrier", "all_reduce")) is not first  # the order is the codes'
    values = pd.Categorical.from_codes(np.array([1, 0, -1]), dtype=first)
    assert values.tolist()[:2] == ["barrier", "all_reduce"] and pd.isna(values[2])
    many = tuple(f"op{i}" for i in range(CACHED_CATEGORIES + 1))  # a big trace's names: not kept
    assert string_dtype(many) == pd.CategoricalDtype(list(many))
    assert string_dtype(many) is not string_dtype(many)
