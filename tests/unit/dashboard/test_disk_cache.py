"""The persistent analysis cache (``dashboard.disk_cache``): round trip, staleness, safety."""

from __future__ import annotations

import dataclasses
import io
import math
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dashboard import disk_cache
from dashboard.store import folder_signature, list_runs
from dashboard.upload import store_upload
from fsobs import Analysis, analyze_path
from fsobs.analysis.bubbles.store import BubbleStore
from tests.support.stores import RUN_IDS, run_files, zip_bytes

GOOD = ("reference/gloo_straggler_4rank", "sim/control")


def assert_same(a: object, b: object, where: str = "analysis") -> None:
    """Deep equality: DataFrames and arrays with their dtypes, dataclasses field by field."""
    assert type(a) is type(b), where
    if isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b, check_exact=True, obj=where)
        assert a.attrs == b.attrs, where
    elif isinstance(a, pd.Series):
        pd.testing.assert_series_equal(a, b, check_exact=True, obj=where)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype, where
        np.testing.assert_array_equal(a, b, err_msg=where)
    elif dataclasses.is_dataclass(a):
        for field in dataclasses.fields(a):
            assert_same(getattr(a, field.name), getattr(b, field.name), f"{where}.{field.name}")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for number, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{number}]")
    elif isinstance(a, BubbleStore):
        assert a.ranks == b.ranks and len(a) == len(b), where
        assert_same(list(a), list(b), where)
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, where


@pytest.fixture
def store(store: Path) -> Path:
    """The conftest's private store copy, without the cache the app tests may have left."""
    shutil.rmtree(store / disk_cache.CACHE_DIR, ignore_errors=True)
    return store


@pytest.fixture(scope="module")
def analyses(shared_store: Path) -> dict[str, Analysis]:
    return {run_id: analyze_path(shared_store / run_id) for run_id in GOOD}


@pytest.mark.parametrize("run_id", GOOD)
def test_an_analysis_pickles_to_equal_frames(analyses, run_id):
    analysis = analyses[run_id]
    again = pickle.loads(pickle.dumps(analysis, protocol=pickle.HIGHEST_PROTOCOL))
    assert_same(analysis, again)
    assert again.run.steps == analysis.run.steps and again.summary == analysis.summary


def _entry(store: Path, run_id: str):
    return next(e for e in list_runs(store) if e.run_id == run_id)


def test_round_trip_and_paths_into_the_store(store, analyses, tmp_path):
    run_id = "sim/control"
    entry = _entry(store, run_id)
    assert disk_cache.read(store, run_id, entry.signature) is None
    assert disk_cache.write(store, run_id, entry.signature, analyses[run_id])
    assert disk_cache.is_fresh(store, run_id, entry.signature)
    back = disk_cache.read(store, run_id, entry.signature)
    assert back is not None
    assert_same(back.steps, analyses[run_id].steps)
    assert_same(back.bubbles, analyses[run_id].bubbles)
    assert back.run.path == store / run_id
    assert {Path(s.path).parent for s in back.run.ranks.values()} == {store / run_id}
    folder = disk_cache.entry_path(store, run_id).parent
    assert folder.name == ".fsobs-cache" and (folder / ".gitignore").read_text() == "*\n"
    assert oct(folder.stat().st_mode & 0o777) == oct(0o700)
    assert oct(disk_cache.entry_path(store, run_id).stat().st_mode & 0o777) == oct(0o600)
    moved = tmp_path / "moved"
    os.replace(store, moved)  # the store moved: the paths follow it
    back = disk_cache.read(moved, run_id, _entry(moved, run_id).signature)
    assert back is not None and back.run.path == moved / run_id


def test_the_store_scan_never_lists_the_cache(store, analyses):
    entry = _entry(store, "sim/control")
    disk_cache.write(store, entry.run_id, entry.signature, analyses["sim/control"])
    (store / ".fsobs-cache" / "rank0.json").write_text("{}")  # looks like a run: still hidden
    assert tuple(e.run_id for e in list_runs(store)) == RUN_IDS


def test_a_changed_run_makes_its_entry_stale(store, analyses):
    run_id = "reference/gloo_straggler_4rank"
    entry = _entry(store, run_id)
    disk_cache.write(store, run_id, entry.signature, analyses[run_id])
    trace = store / run_id / "rank0.json.gz"
    os.utime(trace, ns=(trace.stat().st_atime_ns, trace.stat().st_mtime_ns + 10**9))
    changed = _entry(store, run_id).signature
    assert changed != entry.signature
    assert not disk_cache.is_fresh(store, run_id, changed)
    assert disk_cache.read(store, run_id, changed) is None
    assert disk_cache.read(store, "sim/control", entry.signature) is None  # other run id
    assert disk_cache.write(store, run_id, changed, analyses[run_id])  # replaced
    assert disk_cache.is_fresh(store, run_id, changed)
    assert not disk_cache.is_fresh(store, run_id, entry.signature)


@pytest.mark.parametrize("damage", ["truncated", "garbage header", "not an analysis", "empty"])
def test_a_corrupt_entry_is_ignored_then_replaced(store, analyses, damage, caplog):
    run_id = "sim/control"
    signature = _entry(store, run_id).signature
    disk_cache.write(store, run_id, signature, analyses[run_id])
    path = disk_cache.entry_path(store, run_id)
    data = path.read_bytes()
    header = data[: data.index(b"\n") + 1]
    path.write_bytes(
        {
            "truncated": data[: len(data) // 2],
            "garbage header": b"\x80\x05not json\n" + data,
            "not an analysis": header + pickle.dumps({"steps": 1}),
            "empty": b"",
        }[damage]
    )
    assert disk_cache.read(store, run_id, signature) is None
    assert disk_cache.write(store, run_id, signature, analyses[run_id])
    assert disk_cache.read(store, run_id, signature) is not None


def test_an_entry_others_could_write_is_never_unpickled(store, analyses, tmp_path):
    run_id = "sim/control"
    signature = _entry(store, run_id).signature
    disk_cache.write(store, run_id, signature, analyses[run_id])
    path = disk_cache.entry_path(store, run_id)
    path.chmod(0o666)
    assert disk_cache.read(store, run_id, signature) is None
    path.chmod(0o600)
    path.parent.chmod(0o777)
    assert disk_cache.read(store, run_id, signature) is None
    path.parent.chmod(0o700)
    assert disk_cache.read(store, run_id, signature) is not None
    elsewhere = tmp_path / "elsewhere.pkl"
    os.replace(path, elsewhere)
    path.symlink_to(elsewhere)  # a link, even to a good entry, is not followed
    assert disk_cache.read(store, run_id, signature) is None


def test_a_cache_that_cannot_be_written_is_skipped(store, analyses):
    (store / ".fsobs-cache").write_text("not a folder")
    entry = _entry(store, "sim/control")
    assert not disk_cache.write(store, entry.run_id, entry.signature, analyses["sim/control"])
    assert disk_cache.read(store, entry.run_id, entry.signature) is None
    assert list(store.glob(".fsobs-cache*")) == [store / ".fsobs-cache"]


def test_an_upload_cannot_write_into_the_cache(store):
    files = run_files(store / "reference" / "gloo_straggler_4rank")
    nested = {f".fsobs-cache/{name}": data for name, data in files.items()}
    nested[".fsobs-cache/" + disk_cache.entry_path(store, "x").name] = b"evil"
    stored = store_upload(store, [("r.zip", io.BytesIO(zip_bytes(nested | files)))], ".fsobs-cache")
    assert stored.run_id == "uploads/fsobs-cache"
    assert not (store / ".fsobs-cache").exists()
    assert not any(p.name == ".fsobs-cache" for p in store.rglob("*"))
    assert folder_signature(stored.path) == _entry(store, stored.run_id).signature


# ---- bounded: least recently used out; several servers on one store ----
def _fill(store: Path, analysis: Analysis, run_ids: list[str]) -> dict[str, int]:
    """Write ``analysis`` under each run id, the first one the least recently used; sizes."""
    sizes = {}
    for age, run_id in enumerate(reversed(run_ids), start=1):
        assert disk_cache.write(store, run_id, (), analysis)
        path = disk_cache.entry_path(store, run_id)
        os.utime(path, (path.stat().st_atime - 100 * age, path.stat().st_mtime - 100 * age))
        sizes[run_id] = path.stat().st_size
    return sizes


def _cached(store: Path, run_ids: list[str]) -> list[str]:
    return [r for r in run_ids if disk_cache.entry_path(store, r).exists()]


def test_the_least_recently_used_entries_go_first(store, analyses, monkeypatch):
    analysis = analyses["sim/control"]
    ids = ["a", "b", "c"]
    sizes = _fill(store, analysis, ids)  # a is the oldest, c the newest
    assert disk_cache.read(store, "a", ()) is not None  # a read makes "a" the most recent
    cap_mb = (sizes["a"] + sizes["b"] + sizes["c"] + 1) / 2**20
    monkeypatch.setenv(disk_cache.MAX_MB_ENV, str(cap_mb))  # room for three entries
    assert disk_cache.write(store, "d", (), analysis)
    assert _cached(store, [*ids, "d"]) == ["a", "c", "d"]  # "b" was used the longest ago
    monkeypatch.setenv(disk_cache.MAX_MB_ENV, str(sizes["a"] / 2**20 / 2))  # not even one
    assert disk_cache.write(store, "e", (), analysis)
    assert _cached(store, [*ids, "d", "e"]) == ["e"]  # the entry just written is kept


def test_the_cap_defaults_and_zero_turns_the_disk_cache_off(store, analyses, monkeypatch):
    monkeypatch.delenv(disk_cache.MAX_MB_ENV, raising=False)
    assert disk_cache.max_bytes() == disk_cache.DEFAULT_MAX_MB * 2**20
    monkeypatch.setenv(disk_cache.MAX_MB_ENV, "0")
    assert not disk_cache.write(store, "a", (), analyses["sim/control"])
    assert not disk_cache.entry_path(store, "a").exists()


def test_leftover_temporary_files_are_removed_after_an_hour(store, analyses):
    folder = disk_cache.entry_path(store, "a").parent
    disk_cache.write(store, "a", (), analyses["sim/control"])
    old, fresh = folder / ".tmp-old.pkl", folder / ".tmp-fresh.pkl"
    for path in (old, fresh):
        path.write_bytes(b"half an entry")
    stale = old.stat().st_mtime - disk_cache.STALE_TEMP_S - 1
    os.utime(old, (stale, stale))
    disk_cache.evict(folder, 2**40)
    assert not old.exists() and fresh.exists()  # another server may still be writing this one


def test_an_entry_deleted_by_another_server_is_a_miss(store, analyses, monkeypatch):
    analysis = analyses["sim/control"]
    disk_cache.write(store, "a", (), analysis)
    entry = disk_cache._open_entry(store, "a", ())
    assert entry is not None
    disk_cache.entry_path(store, "a").unlink()  # evicted meanwhile: the open file still reads
    with entry:
        assert_same(entry.load().steps, analysis.steps)
    assert disk_cache.read(store, "a", ()) is None
    real_lstat = Path.lstat

    def vanishing(path):  # listed by iterdir, gone before lstat
        if path.name == disk_cache.entry_path(store, "b").name:
            path.unlink(missing_ok=True)
        return real_lstat(path)

    disk_cache.write(store, "b", (), analysis)
    monkeypatch.setattr(Path, "lstat", vanishing)
    assert disk_cache.evict(disk_cache.entry_path(store, "a").parent, 0) == []


def _server(store: Path, analysis: Analysis, seed: int) -> None:
    """One server process: writes, reads and evicts entries of four runs, 25 times."""
    rng = np.random.default_rng(seed)
    for _ in range(25):
        run_id = f"run{rng.integers(4)}"
        if rng.random() < 0.5:
            assert disk_cache.write(store, run_id, (), analysis)
        else:
            back = disk_cache.read(store, run_id, ())
            assert back is None or back.steps.equals(analysis.steps)


def test_several_servers_share_one_bounded_cache(store, analyses, monkeypatch):
    """Four processes write and read the same entries under a cap of about two: every read is
    a miss or a whole analysis, nothing raises, and the cap holds at the end."""
    import multiprocessing

    analysis = analyses["sim/control"]
    size = _fill(store, analysis, ["run0"])["run0"]
    monkeypatch.setenv(disk_cache.MAX_MB_ENV, str(2.5 * size / 2**20))
    context = multiprocessing.get_context("fork")
    servers = [context.Process(target=_server, args=(store, analysis, s)) for s in range(4)]
    for server in servers:
        server.start()
    for server in servers:
        server.join(timeout=120)
    assert [s.exitcode for s in servers] == [0] * 4
    folder = disk_cache.entry_path(store, "run0").parent
    entries = list(folder.glob("*.pkl"))
    assert entries and sum(p.stat().st_size for p in entries) <= 2.5 * size
    assert not list(folder.glob(".tmp-*"))
