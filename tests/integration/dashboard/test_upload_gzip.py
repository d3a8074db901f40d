"""Every decompressed byte of an upload counts against its limit, the trace file's own gzip too.

The issue's case: a 1 MB ``.json.gz`` that inflates to 1 GiB (a valid trace holding one huge
string) was accepted after 27 s at 5.25 GiB, because only the archive layer was counted. Here it
is refused once its text passes 512 MiB, uploaded as it is or inside a zip, with one line naming
the file, the store unchanged, in a fresh process whose peak RSS grows by less than 64 MiB.
"""

from __future__ import annotations

import gzip
import io
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from dashboard.upload import MAX_UPLOAD_BYTES, UploadError, analyze_upload, store_upload
from fsobs.errors import TraceReadError
from tests.support.stores import ROOT, listing

MiB, GiB = 2**20, 2**30
REFUSED = "rank0.json.gz: the upload is larger than 512 MiB uncompressed"


def write_bomb(path: Path, text_bytes: int) -> Path:
    """A valid trace whose one event holds a string of ``text_bytes`` bytes, gzipped as it is
    written, a MiB at a time (never in memory)."""
    chunk = b"a" * MiB
    with gzip.open(path, "wb", compresslevel=9) as out:
        out.write(b'{"traceEvents": [{"ph": "X", "name": "')
        for _ in range(text_bytes // MiB):
            out.write(chunk)
        out.write(b'", "ts": 0, "dur": 1, "pid": 0, "tid": 0}]}')
    return path


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = write_bomb(tmp_path_factory.mktemp("bomb") / "rank0.json.gz", GiB)
    assert path.stat().st_size < 2 * MiB
    return path


def _refused(store: Path, files: list[tuple[str, io.BytesIO]]) -> tuple[str, float]:
    before = listing(store)
    start = time.monotonic()
    with pytest.raises(UploadError) as info:
        store_upload(store, files)
    elapsed = time.monotonic() - start
    assert listing(store) == before
    return str(info.value), elapsed


def test_a_gzip_trace_uploaded_as_it_is_counts_its_text(store: Path, bomb: Path):
    message, elapsed = _refused(store, [("rank0.json.gz", io.BytesIO(bomb.read_bytes()))])
    assert message == REFUSED
    assert elapsed < 60  # generous: inflating 512 MiB takes a second or two


def test_a_gzip_trace_inside_a_zip_counts_its_text(store: Path, bomb: Path):
    payload = io.BytesIO()
    with zipfile.ZipFile(payload, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.write(bomb, "run/rank0.json.gz")
    message, elapsed = _refused(store, [("run.zip", payload)])
    assert message == REFUSED
    assert elapsed < 60


def test_every_gzip_member_counts(store: Path, tmp_path: Path):
    """Two members of 600 KiB of text each under a 1 MiB limit: the second one passes it."""
    member = gzip.compress(b" " * (600 * 2**10))
    before = listing(store)
    with pytest.raises(UploadError, match=r"^rank0\.json\.gz: the upload is larger than 1 MiB"):
        store_upload(store, [("rank0.json.gz", io.BytesIO(member + member))], limit=MiB)
    assert listing(store) == before


def test_validation_reads_no_more_than_the_limit(tmp_path: Path):
    """A trace of 2 MiB of text (whitespace first) is refused by the loader under a 1 MiB
    limit: what validation reads is capped by the upload's limit, not the loader's 4 GiB."""
    (tmp_path / "rank0.trace.json").write_bytes(b" " * (2 * MiB) + b'{"traceEvents": []}')
    with pytest.raises(TraceReadError, match="file is 2.0 MiB, over the 1.0 MiB limit per trace"):
        analyze_upload(tmp_path, limit=MiB)
    assert MAX_UPLOAD_BYTES == 512 * MiB


_PEAK_SCRIPT = """
import io, resource, sys
from pathlib import Path
from dashboard.upload import UploadError, store_upload
payload = io.BytesIO(Path(sys.argv[2]).read_bytes())
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    store_upload(Path(sys.argv[1]), [("rank0.json.gz", payload)])
except UploadError as exc:
    print("refused:", exc)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


def test_refusing_the_bomb_takes_bounded_memory(tmp_path: Path, bomb: Path):
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, str(tmp_path / "store"), str(bomb)],
        capture_output=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
        check=True,
        timeout=120,
    )
    lines = done.stdout.decode().splitlines()
    assert lines[0] == f"refused: {REFUSED}", done.stderr
    assert int(lines[1]) < 64 * MiB
