"""The gzip reader (:func:`fsobs.trace._decode.text_pieces`): ISA-L when installed, else zlib.

Both decompressors must give the text ``gzip.decompress`` gives, piece for piece joined, and a
damaged file the same error, worded by zlib either way.
"""

from __future__ import annotations

import gzip
import sys
import zlib
from pathlib import Path

import pytest

from fsobs.errors import TraceReadError
from fsobs.trace._decode import PIECE, _inflaters, text_pieces

REFERENCE = Path(__file__).resolve().parents[3] / "traces" / "reference"
TRACES = [
    REFERENCE / "hta_recsys_a2a_2rank" / "sampled_rank-0.json.gz",
    REFERENCE / "hta_ns_resolution" / "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    REFERENCE / "hta_recsys_a2a_rs_16rank_rank0" / "rank0.json.gz",
]
LIMIT = 2**30


@pytest.fixture(params=["isal", "zlib"])
def decompressor(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test twice: with ISA-L, and with ``isal`` made unimportable (the zlib fallback)."""
    if request.param == "isal":
        pytest.importorskip("isal.isal_zlib")
    else:
        monkeypatch.setitem(sys.modules, "isal", None)  # `import isal` raises ImportError
        monkeypatch.setitem(sys.modules, "isal.isal_zlib", None)
    return str(request.param)


def _read(path: Path) -> bytes:
    pieces = list(text_pieces(path, LIMIT))
    assert all(0 < len(piece) <= PIECE for piece in pieces)
    return b"".join(pieces)


def test_decompressor_in_use(decompressor: str) -> None:
    """ISA-L's inflater catches its own error besides zlib's (for the reread that words it)."""
    errors = _inflaters()[1]
    assert errors == ((zlib.error,) if decompressor == "zlib" else (errors[0], zlib.error))
    assert errors[0].__module__ == ("zlib" if decompressor == "zlib" else "igzip_lib")


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.parent.name)
def test_reference_trace_same_bytes_as_gzip(decompressor: str, trace: Path) -> None:
    assert _read(trace) == gzip.decompress(trace.read_bytes())


def test_multi_member_gzip_with_padding(decompressor: str, tmp_path: Path) -> None:
    """Members one after the other, zero bytes between them (as some writers pad)."""
    first = b'{"traceEvents": [' + b'{"ph": "X"},' * 400_000  # several pieces
    second = b'{"ph": "i"}]}'
    path = tmp_path / "multi.json.gz"
    path.write_bytes(gzip.compress(first) + b"\x00" * 8 + gzip.compress(second))
    text = _read(path)
    assert len(text) == len(first) + len(second) > PIECE
    assert text == first + second


def test_truncated_gzip_error(decompressor: str, tmp_path: Path) -> None:
    data = gzip.compress(b'{"traceEvents": []}' * 1000)
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceReadError) as err:
        _read(path)
    assert str(err.value) == f"{path}: truncated gzip file (ends before the end of stream)"


def test_corrupt_gzip_error_in_zlib_words(decompressor: str, tmp_path: Path) -> None:
    data = bytearray(gzip.compress(b'{"traceEvents": []}' * 1000))
    for i in range(12, 20):  # inside the deflate stream, after the 10-byte header
        data[i] ^= 0x5A
    path = tmp_path / "bad.json.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(zlib.error) as zlib_err:
        zlib.decompress(bytes(data), wbits=31)
    reason = str(zlib_err.value).rpartition(": ")[2].lower()  # "invalid ..." as zlib says it
    with pytest.raises(TraceReadError) as err:
        _read(path)
    assert str(err.value) == f"{path}: corrupt gzip data ({reason})"


def test_wrong_length_trailer_error(decompressor: str, tmp_path: Path) -> None:
    """A whole deflate stream whose trailer's ISIZE is wrong: zlib's "incorrect length check"."""
    data = gzip.compress(b"{}" * 100)
    path = tmp_path / "length.json.gz"
    path.write_bytes(data[:-4] + (7).to_bytes(4, "little"))
    with pytest.raises(TraceReadError) as err:
        _read(path)
    assert str(err.value) == f"{path}: corrupt gzip data (incorrect length check)"
