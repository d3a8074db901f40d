"""The what-if holds full garbage collections off while it runs (fsobs.analysis.whatif._gc):
young collections still run, and the threshold found is put back, after nested and
concurrent holds too."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from fsobs.analysis.whatif._gc import OLDEST_HELD, full_collections_held


@pytest.fixture
def threshold() -> Iterator[tuple[int, int, int]]:
    found = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield gc.get_threshold()
    gc.set_threshold(*found)


def test_full_collections_are_held_and_the_threshold_put_back(threshold) -> None:
    with full_collections_held():
        assert gc.get_threshold() == (700, 10, OLDEST_HELD)  # the young ones as they were
        with full_collections_held():
            assert gc.get_threshold() == (700, 10, OLDEST_HELD)
        assert gc.get_threshold() == (700, 10, OLDEST_HELD)  # the outer hold still holds
    assert gc.get_threshold() == threshold


def test_the_threshold_comes_back_after_an_error(threshold) -> None:
    with pytest.raises(RuntimeError), full_collections_held():
        raise RuntimeError("boom")
    assert gc.get_threshold() == threshold


def test_overlapping_holds_of_two_threads_put_back_what_the_first_found(threshold) -> None:
    # thread B enters while A holds, A leaves first: the hold stays until B leaves too
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, tuple[int, int, int]] = {}

    def a() -> None:
        with full_collections_held():
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def b() -> None:
        a_in.wait(5)
        with full_collections_held():
            b_in.set()
            a_out.wait(5)
            seen["after a left"] = gc.get_threshold()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen["after a left"] == (700, 10, OLDEST_HELD)
    assert gc.get_threshold() == threshold
