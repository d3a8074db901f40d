"""Reads of categorical columns from their codes (fsobs.trace.categorical) give what the
pandas operations they replace give, NaN rows included."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fsobs.trace.categorical import codes, decoded, is_in


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
