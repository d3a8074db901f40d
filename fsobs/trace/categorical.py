"""Reads of the categorical columns of a rank's tables (:mod:`fsobs.trace.schema`) from their
codes: a row mask or the decoded values cost one numpy lookup per row, where pandas'
comparisons, ``isin`` and ``astype`` cost tens of microseconds a call on these small tables.

Each works on the column's categories (a few dozen) and indexes the result by the codes, whose
-1 (NaN) picks the one extra entry at the end."""

from __future__ import annotations

from collections.abc import Callable, Collection
from functools import lru_cache
from typing import cast

import numpy as np
import pandas as pd

CACHED_CATEGORIES = 256
"""Sets of at most this many strings have their dtype kept (:func:`string_dtype`): the cache
holds 64 such sets at most, whatever the traces name."""


def string_dtype(categories: tuple[str, ...]) -> pd.CategoricalDtype:
    """``pd.CategoricalDtype(categories)``, made once per tuple of distinct strings of at most
    :data:`CACHED_CATEGORIES`: pandas checks the categories each time a dtype is made (a fifth
    of a millisecond for a few dozen), a dozen times per rank, and the ranks of a run share
    their collectives' and (in small traces) names' sets."""
    make = _made_once if len(categories) <= CACHED_CATEGORIES else _made_once.__wrapped__
    return make(categories)


@lru_cache(maxsize=64)
def _made_once(categories: tuple[str, ...]) -> pd.CategoricalDtype:
    return pd.CategoricalDtype(list(categories))


def _categorical(column: pd.Series) -> pd.Categorical:
    return cast(pd.Categorical, column.array)


def codes(column: pd.Series) -> np.ndarray:
    """The codes of a categorical column (-1 where NaN)."""
    return np.asarray(_categorical(column).codes)


def is_in(column: pd.Series, values: Collection[object]) -> np.ndarray:
    """Row mask of a categorical column: its value is one of ``values`` (never where NaN)."""
    categorical = _categorical(column)
    hit = [c in values for c in categorical.categories]
    return cast(np.ndarray, np.array([*hit, False])[codes(column)])


def decoded(
    column: pd.Series, missing: object = np.nan, convert: Callable[[object], object] | None = None
) -> np.ndarray:
    """The values of a categorical column as an object array (as ``astype(object)``),
    ``missing`` where NaN, each category passed through ``convert`` when given."""
    categorical = _categorical(column)
    categories = categorical.categories.to_numpy(object)
    table = np.empty(len(categories) + 1, object)
    table[:-1] = categories if convert is None else [convert(c) for c in categories]
    table[-1] = missing
    return cast(np.ndarray, table[codes(column)])
