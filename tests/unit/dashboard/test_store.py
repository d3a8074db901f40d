"""The run store and the upload rules, without Streamlit."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from dashboard.store import list_runs, resolve_store, toggles_summary, toggles_table
from dashboard.upload import (
    MAX_UPLOAD_BYTES,
    UploadError,
    sanitize_name,
    store_upload,
)
from tests.support.stores import (
    RUN_IDS,
    MiB,
    listing,
    run_files,
    tar_gz_bytes,
    tar_gz_declaring,
    zeros_zip,
    zip_bytes,
)

GLOO = "reference/gloo_straggler_4rank"


def _streams(files: dict[str, bytes]) -> list[tuple[str, io.BytesIO]]:
    return [(name, io.BytesIO(data)) for name, data in files.items()]


def test_list_runs_finds_every_run_with_its_id(shared_store):
    entries = list_runs(shared_store)
    assert tuple(e.run_id for e in entries) == RUN_IDS
    control = next(e for e in entries if e.run_id == "sim/control")
    assert control.trace_files == tuple(f"rank{r}.trace.json.gz" for r in range(4))
    assert control.meta is not None and control.meta.simulated is True
    assert control.trace_bytes == sum(
        (control.path / f).stat().st_size for f in control.trace_files
    )


def test_list_runs_skips_hidden_symlinked_and_deep_folders(store, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "rank0.json").write_text("{}")
    (store / "link").symlink_to(outside, target_is_directory=True)
    (store / "uploads" / ".upload-123").mkdir(parents=True)
    (store / "uploads" / ".upload-123" / "rank0.json").write_text("{}")
    deep = store / "a" / "b" / "c" / "d"
    deep.mkdir(parents=True)
    (deep / "rank0.json").write_text("{}")
    (store / "a" / "b" / "c" / "rank0.json").write_text("{}")
    ids = [e.run_id for e in list_runs(store)]
    assert ids == ["a/b/c", *RUN_IDS]


def test_signature_changes_when_a_file_changes(store):
    before = {e.run_id: e.signature for e in list_runs(store)}
    trace = store / "sim" / "test" / "rank0.trace.json.gz"
    os.utime(trace, ns=(1, 1))
    after = {e.run_id: e.signature for e in list_runs(store)}
    assert after["sim/test"] != before["sim/test"]
    assert after["sim/control"] == before["sim/control"]


def test_store_flag_beats_environment_beats_default(tmp_path):
    env = {"FSOBS_STORE": str(tmp_path / "env")}
    assert resolve_store(["--store", str(tmp_path / "flag")], env) == tmp_path / "flag"
    assert resolve_store(["-q", "x.py"], env) == tmp_path / "env"
    assert resolve_store(["--st", "abbrev"], {}) == Path("traces").resolve()


def test_toggles_show_requested_and_applied_with_reason(shared_store):
    meta = next(e.meta for e in list_runs(shared_store) if e.run_id == "sim/control")
    rows = {r["toggle"]: r for r in toggles_table(meta)}
    assert rows["sm_free"] == {
        "toggle": "sm_free",
        "requested": True,
        "applied": False,
        "reason": "no GPU: copy-engine transport unavailable",
    }
    assert toggles_summary(meta) == "sm_free (requested, not applied)"
    assert toggles_summary(None) == "none"


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("my run", "my-run"),
        ("../../etc/passwd", "etc-passwd"),
        ("run.tar.gz", "run"),
        ("...", "upload"),
        ("a" * 100, "a" * 64),
        ("ünïcode:run?*", "n-code-run"),
    ],
)
def test_sanitize_name(raw, clean):
    assert sanitize_name(raw) == clean


def _good_payloads(store: Path) -> dict[str, list[tuple[str, io.BytesIO]]]:
    files = run_files(store / GLOO)
    nested = {f"exp/run1/{n}": d for n, d in files.items()}
    junk = {"exp/README.md": b"notes", "__MACOSX/._rank0.json.gz": b"x"}
    return {
        "files": _streams(files),
        "zip": [("gloo.zip", io.BytesIO(zip_bytes(nested | junk)))],
        "tar.gz": [("gloo.tar.gz", io.BytesIO(tar_gz_bytes(nested | junk)))],
    }


@pytest.mark.parametrize("kind", ["files", "zip", "tar.gz"])
def test_good_upload_is_stored_flat_and_listed(store, kind):
    payload = _good_payloads(store)[kind]
    stored = store_upload(store, payload, name="my gloo")
    assert stored.run_id == "uploads/my-gloo"
    assert sorted(p.name for p in stored.path.iterdir()) == sorted(run_files(store / GLOO))
    assert stored.files == tuple(sorted(run_files(store / GLOO)))
    if kind != "files":
        assert sorted(stored.skipped) == ["__MACOSX/._rank0.json.gz", "exp/README.md"]
    assert "uploads/my-gloo" in [e.run_id for e in list_runs(store)]


def test_upload_never_overwrites_a_stored_run(store):
    first = store_upload(store, _good_payloads(store)["files"], name="same")
    before = listing(first.path)
    second = store_upload(store, _good_payloads(store)["zip"], name="same")
    third = store_upload(store, _good_payloads(store)["zip"], name="same")
    assert (first.run_id, second.run_id, third.run_id) == (
        "uploads/same",
        "uploads/same-2",
        "uploads/same-3",
    )
    assert listing(first.path) == before


def _bad_payloads(store: Path) -> dict[str, tuple[list[tuple[str, io.BytesIO]], str]]:
    gloo = run_files(store / GLOO)
    one = {"rank0.json.gz": gloo["rank0.json.gz"]}
    return {
        "malformed json": (_streams({"rank0.json": b'{"traceEvents": [{"ph": '}), "not valid JSON"),
        "zip traversal": ([("t.zip", io.BytesIO(zip_bytes({"../x.json": b"{}"})))], "'..'"),
        "tar traversal": ([("t.tgz", io.BytesIO(tar_gz_bytes({"a/../../x.json": b"{}"})))], ".."),
        "absolute path": ([("t.zip", io.BytesIO(zip_bytes({"/etc/x.json": b"{}"})))], "absolute"),
        "zip symlink": (
            [("s.zip", io.BytesIO(zip_bytes(one, symlinks={"rank1.json": "/etc/passwd"})))],
            "links are not allowed",
        ),
        "tar symlink": (
            [("s.tar.gz", io.BytesIO(tar_gz_bytes(one, symlinks={"rank1.json": "/etc/passwd"})))],
            "links are not allowed",
        ),
        "tar hardlink": (
            [
                (
                    "h.tar.gz",
                    io.BytesIO(tar_gz_bytes(one, hardlinks={"rank1.json": "rank0.json.gz"})),
                )
            ],
            "links are not allowed",
        ),
        "tar device": (
            [("d.tar.gz", io.BytesIO(tar_gz_bytes(one, devices=("rank1.json",))))],
            "device files",
        ),
        "declared bomb": (
            [("b.tar.gz", io.BytesIO(tar_gz_declaring("rank0.json", MAX_UPLOAD_BYTES + 1)))],
            "larger than 512 MiB",
        ),
        "duplicate rank": (
            _streams(
                {"rank0.json.gz": gloo["rank0.json.gz"], "copy.json.gz": gloo["rank0.json.gz"]}
            ),
            "claim this rank",
        ),
        "same name twice": (
            [("n.zip", io.BytesIO(zip_bytes({"a/rank0.json.gz": b"1", "b/rank0.json.gz": b"2"})))],
            "two files of the upload have this name",
        ),
        "archive and files": (
            [("a.zip", io.BytesIO(zip_bytes(one))), *_streams(one)],
            "not both",
        ),
        "not a run file": (_streams({"notes.txt": b"hello"}), "not a run file"),
        "not a zip": ([("x.zip", io.BytesIO(b"garbage"))], "not a valid .zip"),
        "no trace": ([("x.zip", io.BytesIO(zip_bytes({"README.md": b"x"})))], "no trace file"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "malformed json",
        "zip traversal",
        "tar traversal",
        "absolute path",
        "zip symlink",
        "tar symlink",
        "tar hardlink",
        "tar device",
        "declared bomb",
        "duplicate rank",
        "same name twice",
        "archive and files",
        "not a run file",
        "not a zip",
        "no trace",
    ],
)
def test_bad_upload_is_refused_and_leaves_the_store_unchanged(store, case):
    payload, phrase = _bad_payloads(store)[case]
    before = listing(store)
    with pytest.raises(UploadError, match=None) as info:
        store_upload(store, payload)
    assert phrase in str(info.value)
    assert "\n" not in str(info.value)
    assert ".upload-" not in str(info.value)  # the staging folder is not the user's business
    assert listing(store) == before


def test_bombs_stop_at_the_limit_while_streaming(store):
    before = listing(store)
    bomb = zeros_zip("rank0.json", 3 * MiB)
    with pytest.raises(UploadError, match="larger than 1 MiB"):
        store_upload(store, [("bomb.zip", io.BytesIO(bomb))], limit=MiB)
    with pytest.raises(UploadError, match="larger than 1 MiB"):  # no declared size: counted
        store_upload(store, _streams({"rank0.json": bytes(2 * MiB)}), limit=MiB)
    assert listing(store) == before
