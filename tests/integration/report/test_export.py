"""`fsobs export`: the traces with bubble tracks, as valid Chrome trace JSON."""

from __future__ import annotations

import gzip
import json
import shutil
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import msgspec
import pytest

from fsobs import load_run
from fsobs.analysis import analyze_path
from fsobs.analysis.bubbles.store import BubbleStore
from fsobs.analysis.bubbles.tables import bubble_table
from fsobs.cli import main
from fsobs.errors import ExportError
from fsobs.export import CATEGORY, PID, export_run
from fsobs.runformat import RunMeta
from fsobs.trace._decode import read_trace_bytes
from tests.support import kineto as k
from tests.support.kineto import REFERENCE

GLOO = REFERENCE / "synthetic_gloo_a2a_straggler_4rank"
RECSYS = REFERENCE / "hta_recsys_a2a_2rank"
OVERLAPPING = REFERENCE / "hta_recsys_a2a_rs_16rank_rank0"  # GPU step windows overlap
TRACKS = {"straggler_wait", "exposed_comm", "unattributed_comm", "host_idle", "other"}


def _reject_constant(name: str) -> None:
    raise ValueError(f"not strict JSON: {name}")


def _strict(data: bytes) -> dict:
    """Strict JSON (no NaN / Infinity), decimals kept exact."""
    return json.loads(data, parse_constant=_reject_constant, parse_float=Decimal)


def _export(source: Path, out: Path):
    analysis = analyze_path(source)
    written = export_run(analysis.run, analysis.bubbles, out)
    return analysis.run, analysis.bubbles, written


def _abs_ns(trace, ts: Decimal) -> int:
    ns = ts * 1000
    assert ns == ns.to_integral_value()  # written with ns precision exactly
    base = trace.base_time_ns if trace.time_format == "relative-us" else 0
    return (base or 0) + int(ns)


@pytest.fixture(scope="module", params=[GLOO, RECSYS], ids=["gloo", "recsys"])
def exported(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "out"
    run, steps, written = _export(request.param, out)
    return run, steps, written, out


def test_writes_one_gzip_trace_per_rank(exported):
    run, _, written, out = exported
    assert [p.name for p in written] == [f"rank{r}.trace.json.gz" for r in run.rank_ids]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in written)
    for path in written:
        assert path.read_bytes()[:2] == b"\x1f\x8b"
        _strict(gzip.decompress(path.read_bytes()))


def test_original_content_is_kept_byte_for_byte(exported):
    run, _, _, out = exported
    for rank in run.rank_ids:
        before = read_trace_bytes(run[rank].path)
        after = gzip.decompress((out / f"rank{rank}.trace.json.gz").read_bytes())
        raw_before = msgspec.json.decode(before, type=dict[str, msgspec.Raw])
        raw_after = msgspec.json.decode(after, type=dict[str, msgspec.Raw])
        assert list(raw_after) == list(raw_before)
        for key, value in raw_before.items():
            if key == "traceEvents":
                assert bytes(raw_after[key]).startswith(bytes(value)[:-1])
            else:
                assert bytes(raw_after[key]) == bytes(value)
        # and as parsed JSON: every original event, same count, same content, same order
        doc_before, doc_after = _strict(before), _strict(after)
        n = len(doc_before["traceEvents"])
        assert doc_after["traceEvents"][:n] == doc_before["traceEvents"]
        assert all(e.get("pid") == PID for e in doc_after["traceEvents"][n:])
        assert {k: v for k, v in doc_after.items() if k != "traceEvents"} == {
            k: v for k, v in doc_before.items() if k != "traceEvents"
        }


def _added(out: Path, rank: int) -> list[dict]:
    doc = _strict(gzip.decompress((out / f"rank{rank}.trace.json.gz").read_bytes()))
    return [e for e in doc["traceEvents"] if e.get("pid") == PID]


def test_added_events_are_chrome_trace_events(exported):
    run, steps, _, out = exported
    for rank in run.rank_ids:
        added = _added(out, rank)
        meta = [e for e in added if e["ph"] == "M"]
        slices = [e for e in added if e["ph"] == "X"]
        assert len(meta) + len(slices) == len(added)
        names = {e["name"]: e["args"] for e in meta if e["name"].startswith("process")}
        assert names["process_name"] == {"name": f"fsobs bubbles (rank {rank})"}
        assert names["process_sort_index"]["sort_index"] < 0
        threads = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
        assert {"straggler_wait", "exposed_comm", "host_idle"} <= set(threads)
        assert all(name == tid for tid, name in threads.items())
        for name in ("unattributed_comm", "other"):
            assert (name in threads) == any(sb.total_ns(name) > 0 for sb in steps)
        assert slices
        for e in slices:
            assert {"ph", "ts", "dur", "pid", "tid", "name", "cat", "args"} <= set(e)
            assert e["cat"] == CATEGORY and e["name"] in TRACKS
            assert e["tid"] in threads and e["tid"].split(" #")[0] == e["name"]
            assert e["dur"] > 0
            assert e["args"]["class"] == e["name"]
            assert float(e["args"]["dur_ms"]) == pytest.approx(float(e["dur"]) / 1000, abs=1e-6)


def test_slices_add_up_to_the_bubble_table_inside_the_step_windows(exported):
    run, steps, _, out = exported
    table = bubble_table(steps).set_index(["rank", "step"])
    for rank in run.rank_ids:
        windows = {sb.step: sb.window for sb in steps if sb.rank == rank}
        totals: dict[tuple[int, str], int] = defaultdict(int)
        for e in _added(out, rank):
            if e["ph"] != "X":
                continue
            start = _abs_ns(run[rank], e["ts"])
            end = start + int(e["dur"] * 1000)
            lo, hi = windows[e["args"]["step"]]
            assert lo <= start < end <= hi
            totals[e["args"]["step"], e["name"]] += end - start
        for sb in steps:
            if sb.rank != rank:
                continue
            for name in TRACKS:
                got = totals.get((sb.step, name), 0)
                assert got == sb.total_ns(name)
                expected_ms = table.loc[(rank, sb.step), f"{name}_ms"]
                assert abs(got / 1e6 - expected_ms) < 1e-3  # within 1 µs


def test_each_track_holds_disjoint_slices(exported):
    run, _, _, out = exported
    for rank in run.rank_ids:
        _assert_disjoint_per_track(_added(out, rank))


def _assert_disjoint_per_track(added: list[dict]) -> None:
    by_tid: dict[str, list[tuple[Decimal, Decimal]]] = defaultdict(list)
    for e in added:
        if e["ph"] == "X":
            by_tid[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_tid.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


def test_output_is_a_run_that_loads_again_with_the_same_bubbles(exported):
    run, steps, _, out = exported
    again = load_run(out)
    assert again.rank_ids == run.rank_ids and again.world_size == run.world_size
    assert again.warnings == run.warnings
    assert again.steps == run.steps
    for rank in run.rank_ids:
        assert again[rank].time_format == run[rank].time_format
        assert again[rank].base_time_ns == run[rank].base_time_ns
    steps_again = analyze_path(again.path).bubbles
    assert bubble_table(steps_again).equals(bubble_table(steps))


def test_gloo_straggler_has_no_wait_and_the_others_wait_for_it(tmp_path):
    run, _, _ = _export(GLOO, tmp_path / "out")
    wait: dict[tuple[int, int], float] = defaultdict(float)
    for rank in run.rank_ids:
        for e in _added(tmp_path / "out", rank):
            if e["ph"] == "X" and e["name"] == "straggler_wait":
                if rank == 2:
                    assert e["dur"] < 1000, e
                wait[rank, e["args"]["step"]] += float(e["dur"]) / 1000
    for rank in (0, 1, 3):
        for step in run.steps:
            assert wait[rank, step] >= 14, (rank, step)


def test_pipelined_gpu_steps_tile_and_stay_one_track_per_class(tmp_path):
    """In this trace step s+1's GPU work starts before step s's ends; windows still tile."""
    run, steps, _ = _export(OVERLAPPING, tmp_path / "out")
    windows = sorted(sb.window for sb in steps)
    assert all(a[1] == b[0] for a, b in zip(windows, windows[1:], strict=False))
    added = _added(tmp_path / "out", 0)
    _assert_disjoint_per_track(added)
    assert {e["tid"] for e in added if e["ph"] == "X"} <= TRACKS
    slices = [e for e in added if e["ph"] == "X" and e["name"] == "host_idle"]
    assert sum(int(e["dur"] * 1000) for e in slices) == sum(
        sb.total_ns("host_idle") for sb in steps
    )


def test_exact_timestamps_in_both_time_bases(tmp_path):
    events = [
        k.step(1, 1000.0, 1000.0),
        k.x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "cpu_op", 1100.5, 200),
        k.x("aten::mm", "cpu_op", 1400, 500),
    ]
    for name, base_ns, offset in (("rel", k.BASE_NS, 0), ("abs", None, 1_700_000_000_000_000)):
        shifted = [e | {"ts": e["ts"] + offset} for e in events]
        k.write(tmp_path / name / "t.json", k.trace(shifted, base_ns=base_ns))
        run, steps, _ = _export(tmp_path / name, tmp_path / f"{name}_out")
        assert [sb.total_ns("host_idle") for sb in steps] == [200_000]
        text = gzip.decompress((tmp_path / f"{name}_out" / "rank0.trace.json.gz").read_bytes())
        ts = f"{1100 + offset}.500"
        assert f'"tid": "host_idle", "ts": {ts}, "dur": 200.000,'.encode() in text


def test_empty_event_list_and_plain_json_input(tmp_path):
    k.write(tmp_path / "run" / "t.json", k.trace([]))
    run = load_run(tmp_path / "run")
    export_run(run, BubbleStore(), tmp_path / "out")
    doc = _strict(gzip.decompress((tmp_path / "out" / "rank0.trace.json.gz").read_bytes()))
    assert {e["ph"] for e in doc["traceEvents"]} == {"M"}
    again = load_run(tmp_path / "out").warnings
    assert again == [w.replace("t.json", "rank0.trace.json.gz") for w in run.warnings]


def test_run_metadata_and_step_files_are_copied(tmp_path):
    src = tmp_path / "run"
    shutil.copytree(GLOO, src)
    (src / "run.json").write_text(json.dumps({"world_size": 4, "name": "demo"}))
    (src / "steps.rank0.jsonl").write_text('{"step": 2, "num_samples": 2, "seq_lengths": [3, 4]}\n')
    (src / "job.json").write_text('{"steps": 20}')
    run, _, written = _export(src, tmp_path / "out")
    names = {p.name for p in written}
    assert {"run.json", "job.json", "steps.rank0.jsonl"} <= names
    for name in ("run.json", "job.json", "steps.rank0.jsonl"):
        assert (tmp_path / "out" / name).read_bytes() == (src / name).read_bytes()
    assert load_run(tmp_path / "out").meta == run.meta == RunMeta(world_size=4, name="demo")


# ---------------------------------------------------------------- the command and its refusals


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fsobs: error: ")
    return err


def test_cli_exports_and_says_how_to_open(tmp_path, capsys):
    assert main(["export", str(GLOO), str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    assert "rank2.trace.json.gz" in text and "perfetto" in text.lower()
    assert "chrome://tracing" in text
    assert len(list((tmp_path / "out").glob("rank*.trace.json.gz"))) == 4


def test_cli_refuses_to_write_into_the_run_directory(tmp_path, capsys):
    src = tmp_path / "run"
    shutil.copytree(GLOO, src)
    before = sorted(p.name for p in src.iterdir())
    for args in ([str(src), str(src)], [str(src), str(src), "--overwrite"]):
        assert main(["export", *args]) == 2
        assert "run's own directory" in _one_error_line(capsys)
    assert sorted(p.name for p in src.iterdir()) == before


def test_cli_refuses_to_overwrite_without_the_flag(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["export", str(GLOO), str(out)]) == 0
    capsys.readouterr()
    stamp = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert main(["export", str(GLOO), str(out)]) == 2
    assert "--overwrite" in _one_error_line(capsys)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamp
    assert main(["export", str(GLOO), str(out), "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(stamp)  # no temporary files left


def test_refuses_to_mix_with_another_runs_files(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "rank0.json.gz").write_bytes(b"")
    assert main(["export", str(GLOO), str(out), "--overwrite"]) == 2
    assert "rank0.json.gz" in _one_error_line(capsys)
    run = load_run(GLOO)
    with pytest.raises(ExportError):
        export_run(run, BubbleStore(), out)
    assert sorted(p.name for p in out.iterdir()) == ["rank0.json.gz"]


def test_refuses_a_file_as_output(tmp_path, capsys):
    (tmp_path / "out").write_text("x")
    assert main(["export", str(GLOO), str(tmp_path / "out")]) == 2
    assert "not a directory" in _one_error_line(capsys)
