"""``run_files``: what a run folder holds, sorted once for every reader (local and file://)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fsobs.runformat import is_run_file, run_files
from fsobs.storage import RemotePath


def _folder(root: Path) -> Path:
    """A run folder with one of each kind of entry (the table of fsobs.runformat.files)."""
    run = root / "run"
    run.mkdir()
    for name in (
        "rank0.trace.json.gz",
        "worker.pt.trace.json",
        "steps.rank0.jsonl",
        "steps.rank01.jsonl",
        "steps.rank1.jsonl.partial",
        "run.json",
        "cost_model.json",
        "notes.txt",
    ):
        (run / name).write_bytes(b"x" * len(name))
    (run / "windows").mkdir()
    outside = root / "outside"
    outside.mkdir()
    (outside / "rank1.trace.json.gz").write_bytes(b"y")
    (run / "rank1.trace.json.gz").symlink_to(outside / "rank1.trace.json.gz")
    (run / "linked_folder.json").symlink_to(outside, target_is_directory=True)
    (run / "dangling").symlink_to(root / "nothing")
    os.mkfifo(run / "steps.rank2.jsonl")
    return run


def test_a_local_folder_is_sorted_by_kind_and_name(tmp_path):
    run = _folder(tmp_path)
    files = run_files(run)
    assert files.names == (
        "cost_model.json",
        "notes.txt",
        "rank0.trace.json.gz",
        "run.json",
        "steps.rank0.jsonl",
        "steps.rank01.jsonl",
        "steps.rank1.jsonl.partial",
        "worker.pt.trace.json",
    )
    assert [f.size for f in files.files] == [len(n) for n in files.names]
    assert [f.location.name for f in files.traces] == [
        "rank0.trace.json.gz",
        "worker.pt.trace.json",
    ]
    assert files.sidecars == ((run / "steps.rank0.jsonl", 0), (run / "steps.rank01.jsonl", 1))
    assert files.run_json == run / "run.json"
    assert (files.folders, files.windows) == (("windows",), run / "windows")
    assert files.links == ("dangling", "linked_folder.json", "rank1.trace.json.gz")
    assert files.file_links == ("dangling", "rank1.trace.json.gz")
    assert files.linked_run_files == ("linked_folder.json", "rank1.trace.json.gz")
    assert files.special == (run / "steps.rank2.jsonl",)
    assert files.is_run


def test_a_folder_without_trace_or_run_json_is_no_run(tmp_path):
    (tmp_path / "steps.rank0.jsonl").write_text("")
    (tmp_path / "run.json").mkdir()  # a folder of that name is no run.json
    files = run_files(tmp_path)
    assert files.run_json is None and files.traces == () and not files.is_run
    assert files.windows is None and files.folders == ("run.json",)


def test_a_missing_folder_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        run_files(tmp_path / "missing")


def test_a_url_folder_lists_files_and_folders_only(tmp_path):
    """Through fsspec (a file:// URL kept as a URL): no links or special files in a listing."""
    pytest.importorskip("fsspec")
    (tmp_path / "rank0.trace.json.gz").write_bytes(b"abc")
    (tmp_path / "steps.rank3.jsonl").write_text("")
    (tmp_path / "windows").mkdir()
    url = RemotePath(f"local://{tmp_path}")
    files = run_files(url)
    assert files.names == ("rank0.trace.json.gz", "steps.rank3.jsonl")
    assert files.traces[0].size == 3
    assert files.sidecars == ((url / "steps.rank3.jsonl", 3),)
    assert files.windows == url / "windows" and files.run_json is None
    assert (files.links, files.special) == ((), ())


@pytest.mark.parametrize(
    ("name", "taken"),
    [
        ("rank0.trace.json.gz", True),
        ("worker.json", True),
        ("run.json", True),
        ("steps.rank12.jsonl", True),
        ("steps.rank1.jsonl.partial", False),
        ("cost_model.json", False),
        ("window.rank0.json", False),
        ("notes.txt", False),
    ],
)
def test_run_files_are_traces_run_json_and_sidecars(name, taken):
    assert is_run_file(name) is taken


def test_partial_sidecars_are_listed_apart(tmp_path):
    run = _folder(tmp_path)
    assert run_files(run).partial_sidecars == ((run / "steps.rank1.jsonl.partial", 1),)
