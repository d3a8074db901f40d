"""main_thread: the thread of the step marks (the most of them), else the one with the most
CPU ops; among threads with as many marks, the first in the column's category order, as
pandas' ``mode()`` picks."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fsobs.analysis.bubbles.parts import main_thread


def _events(tids: list[str], categories: list[str]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "tid": pd.Categorical(tids, categories=categories),
            "cat": pd.Categorical(["cpu_op"] * len(tids)),
            "device": pd.Categorical(["cpu"] * len(tids)),
        }
    )


def test_the_thread_with_most_step_marks():
    ev = _events(["7", "9", "9", "7", "9"], ["7", "9"])
    assert main_thread(ev, np.array([0, 1, 2])) == "9"  # marks on 7 once, on 9 twice


def test_equal_marks_go_to_the_first_category_as_mode_does():
    ev = _events(["b", "a", "b", "a"], ["b", "a"])  # category order b, a
    marks = np.array([0, 1, 2, 3])
    assert main_thread(ev, marks) == "b"
    assert main_thread(ev, marks) == ev["tid"].iloc[marks].mode().iloc[0]


def test_without_marks_the_thread_with_most_cpu_ops():
    ev = _events(["1", "2", "2"], ["1", "2"])
    assert main_thread(ev, np.zeros(0, np.int64)) == "2"
