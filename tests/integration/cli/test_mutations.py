"""Hostile input: seeded mutations of a small valid run, read by every command that reads one.

Every mutation must end in exit 0 with a sane result or exit 2 with one line on stderr that
names the mutated file; never a traceback. ``fsobs analyze`` reads each mutated run, and so do
``fsobs compare`` (the mutated run against a clean copy, as control or as test), ``fsobs
fit-cost`` and ``fsobs whatif``. A mutation changes one file of a run, drawn from a seed: one
of two runs (a 2-rank GPU run built here with its step sidecars and ``run.json``, or the
committed 4-rank gloo run with step sidecars written here), its traces gzipped for odd seeds;
a trace gets one to three of these changes, any other file one:

- traces: an event deleted, duplicated or moved, the events shuffled, a key of an event (or
  of its ``args``, of ``distributedInfo``, of the document) deleted or set to a bad value of
  another type, out of range, absurd (a ProfilerStep of 31 years, a step number of 20 digits,
  a stream id of 1e23, args nested 1200 deep, ``Infinity``, ``1e400``), an event renamed;
- sidecars: a line replaced by one that is not an object, ``Infinity`` or ``1e400``, a field
  deleted or set to a bad value, ``num_samples`` that does not match the lengths, a line
  deleted, duplicated or moved;
- ``run.json``: a field deleted or set to a bad value (``toggles`` that is not an object, ...);
- any file: truncated, or some bytes flipped (in the gzip stream when the trace is gzipped).

The default is a fast subset of 60 mutations per command (:data:`NUM_MUTATIONS`);
``FSOBS_MUTATIONS=400`` (or more) runs the full set. Hypothesis drives the trace decoder alone
with arbitrary bytes and arbitrary JSON in a Kineto-like shape: a
:class:`~fsobs.trace.schema.RankTrace` or an :class:`~fsobs.errors.FsobsError`, nothing else;
and the readers of a sidecar line and of ``run.json`` with arbitrary JSON: a record (a
metadata) or an :class:`~fsobs.errors.FsobsError`.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import io
import json
import math
import os
import random
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsobs.cli import main
from fsobs.errors import FsobsError
from fsobs.runformat import (
    RunMeta,
    StepRecord,
    ToggleStatus,
    read_run_json,
    read_sidecars,
    write_run_json,
    write_sidecar,
)
from fsobs.trace import load_rank
from optim.balance import CostModel
from tests.support.kineto import REFERENCE, write_allreduce_run

NUM_MUTATIONS = int(os.environ.get("FSOBS_MUTATIONS", "60"))
DAY_MS = 86_400_000.0
_DEEP, _INF, _HUGE = "@deep@", "@inf@", "@huge@"
"""Placeholders for what ``json.dumps`` cannot write: args nested 1200 deep, the tokens
``Infinity`` and ``1e400``."""
BAD = [
    None, True, 0, -1, 1.5, -1e-9, 3.6e9, 1e15, 1e23, 1e300, 10**20, -(10**20), 2**63,
    "", "x", "12345678901234567890", "1e23", "NaN", [], [1e300], [1, "a"], {}, {"a": 1},
    _DEEP, _INF, _HUGE,
]  # fmt: skip
"""Bad values of every kind; 3.6e9 µs is an hour, 1e15 µs 31 years."""
EVENT_KEYS = ("ph", "name", "cat", "pid", "tid", "ts", "dur", "args")
ARG_KEYS = (
    "stream", "correlation", "Collective name", "Seq", "In msg nelems", "Out msg nelems",
    "Group size", "dtype", "In split size", "Out split size", "Process Group Name",
    "Process Group Ranks", "Comms Id", "Input Dims", "grid", "name",
)  # fmt: skip
NAMES = (
    "ProfilerStep#12345678901234567890", "ProfilerStep#-1", "ProfilerStep#", "ProfilerStep#2",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "gloo:all_reduce", "record_param_comms",
    "nccl:all_to_all", "",
)  # fmt: skip
SPECIAL = ("ProfilerStep", "gloo:", "nccl", "record_param_comms", "c10d::", "## ")
"""Names of the events the analysis leans on: mutated more often than the rest."""
INFO_KEYS = ("rank", "world_size", "backend", "pg_config")
DOC_KEYS = ("traceEvents", "distributedInfo", "baseTimeNanoseconds", "deviceProperties")
RECORD_KEYS = (
    "step", "num_samples", "seq_lengths", "est_cost", "wall_start_ns", "wall_end_ns", "loss",
    "imbalance_before", "imbalance_after", "batch_digest", "id_overlap", "gc_count", "gc_ms",
)  # fmt: skip
META_KEYS = ("world_size", "status", "reason", "ranks_present", "toggles", "hosts", "workload")
NOT_OBJECTS = ("[1]", '"x"', "3", "null", "Infinity", "1e400", "[1e300]", "{")
GLOO = REFERENCE / "synthetic_gloo_a2a_straggler_4rank"
Doc = dict[str, Any]


# -- the valid run --------------------------------------------------------------------------


def write_base(root: Path, kind: str) -> None:
    """The run of ``kind``: ``gpu``, :func:`tests.support.kineto.write_allreduce_run`'s two ranks
    and
    three steps, with sidecars whose records have every field and ``run.json``; ``gloo``, the
    committed 4-rank gloo run (torch's own traces, plain JSON here)."""
    if kind == "gloo":
        for path in sorted(GLOO.glob("rank*.json.gz")):
            (root / path.name.removesuffix(".gz")).write_bytes(gzip.decompress(path.read_bytes()))
        ranks, steps = range(4), (2, 3, 4, 5)
    else:
        write_allreduce_run(root, [(100, 60), (80, 120), (90, 90)])
        ranks, steps = range(2), (1, 2, 3)
    for rank in ranks:
        records = [
            StepRecord.of(
                n,
                [3 + n, 5 + rank, 2 * n + rank],
                est_cost=10.0 * n,
                wall_start_ns=1_000 * n,
                wall_end_ns=1_000 * n + 500,
                loss=0.5,
                imbalance_before=1.5,
                imbalance_after=1.1,
                batch_digest=f"d{n}",
                id_overlap={"t": 0.25},
                gc_count=0,
                gc_ms=0.0,
            )
            for n in steps
        ]
        write_sidecar(root, rank, records)
    if kind == "gloo":
        return
    toggle = ToggleStatus(requested=True, applied=False, reason="no GPU")
    meta = RunMeta(world_size=2, backend="nccl", toggles={"sm_free": toggle}, hosts=("host-a",))
    write_run_json(root, meta)


def base_kind(seed: int) -> str:
    return "gloo" if seed % 3 == 2 else "gpu"


def is_trace(name: str) -> bool:
    return name.endswith((".json", ".json.gz")) and name != "run.json"


# -- mutations ------------------------------------------------------------------------------


def dumps(value: object) -> str:
    """JSON text with the placeholders of :data:`BAD` turned into what they stand for."""
    text = json.dumps(value)
    text = text.replace(f'"{_DEEP}"', "[" * 1200 + "1" + "]" * 1200)
    return text.replace(f'"{_INF}"', "Infinity").replace(f'"{_HUGE}"', "1e400")


def mutate_trace(doc: Doc, rng: random.Random) -> str:
    """Change ``doc`` in place; what was done."""
    events = doc["traceEvents"]
    special = [j for j, e in enumerate(events) if str(e.get("name")).startswith(SPECIAL)]
    i = rng.choice(special) if special and rng.random() < 0.4 else rng.randrange(len(events))
    event = events[i]
    op = rng.choice(
        ["delete", "duplicate", "move", "shuffle", "drop_key", "bad_key", "bad_arg", "rename"]
        + ["bad_info", "drop_info", "bad_doc", "drop_doc", "shift"]
    )
    bad = rng.choice(BAD)
    if op == "delete":
        del events[i]
    elif op == "duplicate":
        events.insert(rng.randrange(len(events) + 1), copy.deepcopy(event))
    elif op == "move":
        events.insert(rng.randrange(len(events)), events.pop(i))
    elif op == "shuffle":
        rng.shuffle(events)
    elif op == "drop_key":
        key = rng.choice(EVENT_KEYS)
        event.pop(key, None)
        return f"{op} traceEvents[{i}].{key}"
    elif op == "bad_key":
        key = rng.choice(EVENT_KEYS)
        event[key] = bad
        return f"{op} traceEvents[{i}].{key} = {bad!r}"
    elif op == "bad_arg":
        key = rng.choice(ARG_KEYS)
        if not isinstance(event.get("args"), dict):
            event["args"] = {}
        event["args"][key] = bad
        return f"{op} traceEvents[{i}].args.{key} = {bad!r}"
    elif op == "rename":
        event["name"] = rng.choice(NAMES)
        return f"{op} traceEvents[{i}] {event['name']!r}"
    elif op in ("bad_info", "drop_info"):
        key = rng.choice(INFO_KEYS)
        if op == "drop_info":
            doc["distributedInfo"].pop(key, None)
        else:
            doc["distributedInfo"][key] = bad
        return f"{op} distributedInfo.{key} = {bad!r}"
    elif op in ("bad_doc", "drop_doc"):
        key = rng.choice(DOC_KEYS)
        if op == "drop_doc":
            doc.pop(key, None)
        else:
            doc[key] = bad
        return f"{op} {key} = {bad!r}"
    else:  # shift: far before or after the others
        key = rng.choice(("ts", "dur"))
        event[key] = event.get(key, 0) + rng.choice((1e15, -1e15, 3.6e9, 1e12))
        return f"{op} traceEvents[{i}].{key} to {event[key]!r}"
    return f"{op} traceEvents[{i}]"


def mutable(doc: Doc) -> bool:
    """Whether :func:`mutate_trace` can change ``doc`` again."""
    events = doc.get("traceEvents")
    return (
        isinstance(events, list)
        and bool(events)
        and all(isinstance(e, dict) for e in events)
        and isinstance(doc.get("distributedInfo"), dict)
    )


def mutate_lines(lines: list[str], rng: random.Random) -> str:
    """Change the lines of a sidecar in place; what was done."""
    i = rng.randrange(len(lines))
    op = rng.choice(["not_object", "bad_field", "drop_field", "count", "delete", "dup", "move"])
    record = json.loads(lines[i])
    if op == "not_object":
        lines[i] = rng.choice(NOT_OBJECTS)
    elif op == "bad_field":
        key, bad = rng.choice(RECORD_KEYS), rng.choice(BAD)
        record[key] = bad
        lines[i] = dumps(record)
        return f"{op} line {i + 1}: {key} = {bad!r}"
    elif op == "drop_field":
        key = rng.choice(RECORD_KEYS)
        record.pop(key, None)
        lines[i] = dumps(record)
        return f"{op} line {i + 1}: {key}"
    elif op == "count":
        record["num_samples"] = record["num_samples"] + rng.choice((-1, 1, 10**6))
        lines[i] = dumps(record)
    elif op == "delete":
        del lines[i]
    elif op == "dup":
        lines.insert(rng.randrange(len(lines) + 1), lines[i])
    else:
        lines.insert(rng.randrange(len(lines)), lines.pop(i))
    return f"{op} line {i + 1}"


def mutate_meta(meta: Doc, rng: random.Random) -> str:
    key, bad = rng.choice(META_KEYS), rng.choice(BAD)
    if rng.random() < 0.3:
        meta.pop(key, None)
        return f"drop {key}"
    meta[key] = bad
    return f"{key} = {bad!r}"


def mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    if rng.random() < 0.5:
        cut = rng.randrange(len(data))
        return data[:cut], f"truncated at byte {cut} of {len(data)}"
    out = bytearray(data)
    where = sorted(rng.randrange(len(out)) for _ in range(rng.randint(1, 8)))
    for pos in where:
        out[pos] ^= 1 << rng.randrange(8)
    return bytes(out), f"bits flipped at bytes {where}"


def mutate(root: Path, seed: int) -> tuple[str, str]:
    """Apply mutation ``seed`` to the run in ``root``: (the file's name, what was done).
    Odd seeds gzip the traces first (their byte mutations then hit the gzip stream)."""
    rng = random.Random(seed)
    if seed % 2:
        for path in sorted(root.iterdir()):
            if is_trace(path.name):
                path.with_name(f"{path.name}.gz").write_bytes(gzip.compress(path.read_bytes()))
                path.unlink()
    names = sorted(p.name for p in root.iterdir())
    name = rng.choice(names)
    path = root / name
    if rng.random() < 0.25:
        data, what = mutate_bytes(path.read_bytes(), rng)
        path.write_bytes(data)
        return name, what
    if name.startswith("steps."):
        lines = path.read_text().splitlines()
        what = mutate_lines(lines, rng)
        path.write_text("".join(line + "\n" for line in lines))
    elif name == "run.json":
        meta = json.loads(path.read_text())
        what = mutate_meta(meta, rng)
        path.write_text(dumps(meta))
    else:  # a trace
        raw = path.read_bytes()
        doc = json.loads(gzip.decompress(raw) if name.endswith(".gz") else raw)
        done = []
        for _ in range(rng.choice((1, 1, 2, 3))):
            if done and not mutable(doc):  # the previous change took the structure away
                break
            done.append(mutate_trace(doc, rng))
        what = "; ".join(done)
        text = dumps(doc).encode()
        path.write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    return name, what


# -- the check ------------------------------------------------------------------------------


def fsobs(*argv: str) -> tuple[int, str, str]:
    """``fsobs ARGV`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def analyze(root: Path, as_json: bool) -> tuple[int, str, str]:
    return fsobs("analyze", *(["--json"] if as_json else []), str(root))


def check_one_line(name: str, out: str, err: str, context: str) -> None:
    """Exit 2's output: nothing on stdout, one line on stderr naming the mutated file."""
    assert out == "", context
    assert err.startswith("fsobs: error: ") and err.count("\n") == 1, context
    assert name.removesuffix(".gz") in err, context


def check_sane(report: Doc) -> None:
    """Ratios within [0, 1], no window or step longer than a day (the base run's are 0.2 ms:
    a longer one would be an implausible event counted as a fact)."""
    ratio = report["summary"]["bubble_ratio"]
    assert ratio is None or 0.0 <= ratio <= 1.0, ratio
    for key in ("step_time_ms_p50", "step_time_ms_p90"):
        value = report["summary"][key]
        assert value is None or 0.0 <= value < DAY_MS, (key, value)
    for window in report["windows"]:
        for key in ("window_ms_mean", "cpu_step_ms_mean"):
            value = window[key]
            assert value is None or 0.0 <= value < DAY_MS, (key, value)


@pytest.mark.parametrize("seed", range(NUM_MUTATIONS))
def test_a_mutation_ends_in_a_report_or_one_line(seed: int, tmp_path: Path) -> None:
    write_base(tmp_path, base_kind(seed))
    name, what = mutate(tmp_path, seed)
    as_json = seed % 4 < 2
    code, out, err = analyze(tmp_path, as_json)
    context = f"seed {seed}: {name}: {what}: exit {code}: {err}"
    assert code in (0, 2), context
    if code == 2:
        check_one_line(name, out, err, context)
    elif as_json:
        check_sane(json.loads(out))


COMMANDS = ("compare", "fit-cost", "whatif")
"""The commands beside ``analyze`` that read a whole run (``export`` writes what analyze reads)."""


def command_argv(command: str, mutated: Path, clean: Path, seed: int) -> list[str]:
    """``command`` on the mutated run; ``compare`` takes the clean copy as the other side, the
    control for even ``seed // 4`` (the mutated run is the test), the test for odd."""
    if command == "compare":
        runs = [clean, mutated] if seed // 4 % 2 == 0 else [mutated, clean]
        return ["compare", "--json", *map(str, runs)]
    if command == "fit-cost":
        return ["fit-cost", str(mutated), "--out", str(clean.parent / "cost.json")]
    return ["whatif", "--json", "--draws", "3", str(mutated)]


def check_output(command: str, out: str, cost: Path) -> None:
    """Exit 0's output: strict JSON (compare, whatif), a cost model that reads back (fit-cost)."""
    if command == "fit-cost":
        model = CostModel.from_json(cost)
        assert all(math.isfinite(v) and v >= 0 for v in (model.c0, model.a, model.b)), model
        assert out.splitlines()[-2:] == [
            f"use it with: fsobs run --balance --cost-model {cost}  (the reference job)",
            f"  or in your own loop: optim.CostModel.from_json('{cost}'), passed as cost_model= "
            "to optim.FreeScale and fsobs.collect.RunRecorder",
        ]
    else:
        json.loads(out, parse_constant=lambda token: pytest.fail(f"{token} in the output"))


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("seed", range(NUM_MUTATIONS))
def test_every_command_ends_in_a_result_or_one_line(
    command: str, seed: int, tmp_path: Path
) -> None:
    """The mutations of :func:`test_a_mutation_ends_in_a_report_or_one_line`, read by the
    other commands (sidecars and ``run.json`` matter more there: the cost fit and the what-if
    read them)."""
    mutated, clean = tmp_path / "mutated", tmp_path / "clean"
    for root in (mutated, clean):
        root.mkdir()
        write_base(root, base_kind(seed))
    name, what = mutate(mutated, seed)
    code, out, err = fsobs(*command_argv(command, mutated, clean, seed))
    context = f"seed {seed}: {command}: {name}: {what}: exit {code}: {err}"
    assert code in (0, 2), context
    if code == 2:
        check_one_line(name, out, err, context)
    else:
        check_output(command, out, tmp_path / "cost.json")


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("kind", ["gpu", "gloo"])
def test_the_base_runs_are_clean_for_every_command(kind: str, command: str, tmp_path: Path) -> None:
    """Unmutated, every command succeeds on both runs: an exit 2 above is the mutation's."""
    for root in (tmp_path / "mutated", tmp_path / "clean"):
        root.mkdir()
        write_base(root, kind)
    code, out, err = fsobs(*command_argv(command, tmp_path / "mutated", tmp_path / "clean", 0))
    assert (code, err) == (0, "")
    check_output(command, out, tmp_path / "cost.json")


@pytest.mark.parametrize("kind", ["gpu", "gloo"])
def test_the_base_runs_are_clean(kind: str, tmp_path: Path) -> None:
    write_base(tmp_path, kind)
    code, out, err = analyze(tmp_path, as_json=True)
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert report["run"]["warnings"] == []
    if kind == "gpu":
        assert report["run"]["steps"] == [1, 2, 3]
        # every step's window: the slower rank's compute + 50 µs (allreduce, host idle)
        assert report["summary"]["step_time_ms_p50"] == pytest.approx((100 + 50) / 1000)
    check_sane(report)


def test_the_mutations_hit_every_kind_of_file(tmp_path: Path) -> None:
    """The default subset hits traces of both runs, plain and gzipped, their sidecars and
    ``run.json`` (the gloo run has none)."""
    hit = set()
    for seed in range(NUM_MUTATIONS):
        root = tmp_path / str(seed)
        root.mkdir()
        write_base(root, base_kind(seed))
        name = mutate(root, seed)[0]
        form = "trace.gz" if name.endswith(".gz") else "trace" if is_trace(name) else name[:5]
        hit.add((base_kind(seed), form))
    gpu = {("gpu", f) for f in ("trace", "trace.gz", "steps", "run.j")}
    assert hit == gpu | {("gloo", "trace"), ("gloo", "trace.gz"), ("gloo", "steps")}


# -- hypothesis on the decoder --------------------------------------------------------------

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
_KEYS = st.sampled_from((*EVENT_KEYS, *ARG_KEYS, *INFO_KEYS, *DOC_KEYS)) | st.text(max_size=4)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=5),
    max_leaves=20,
)
_EVENT = st.fixed_dictionaries(
    {},
    optional={
        "ph": st.sampled_from(("X", "M", "i", "f")) | _SCALARS,
        "name": st.sampled_from(NAMES) | _SCALARS,
        "cat": st.sampled_from(("kernel", "cpu_op", "user_annotation", "Trace")) | _SCALARS,
        "pid": _SCALARS,
        "tid": _SCALARS,
        "ts": _SCALARS,
        "dur": _SCALARS,
        "args": st.dictionaries(st.sampled_from(ARG_KEYS), _JSON, max_size=4) | _JSON,
    },
)
_DOC = st.fixed_dictionaries(
    {"traceEvents": st.lists(_EVENT, max_size=8) | _JSON},
    optional={
        "distributedInfo": st.dictionaries(st.sampled_from(INFO_KEYS), _JSON, max_size=4) | _JSON,
        "baseTimeNanoseconds": _SCALARS,
        "deviceProperties": _JSON,
    },
)


def _load(data: bytes, name: str = "t.json") -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(data)
        try:
            load_rank(path)
        except FsobsError as exc:
            message = str(exc)
            assert message == " ".join(message.split()) and str(path) in message


_QUICK = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_QUICK
@given(_DOC)
def test_decoder_on_kineto_shaped_json(doc: Doc) -> None:
    _load(json.dumps(doc).encode())


@_QUICK
@given(_DOC, st.data())
def test_decoder_on_damaged_gzip(doc: Doc, data: st.DataObject) -> None:
    raw = gzip.compress(json.dumps(doc).encode(), mtime=0)
    cut = data.draw(st.integers(0, len(raw)))
    flips = data.draw(st.lists(st.integers(0, len(raw) - 1), max_size=3))
    damaged = bytearray(raw[:cut] if data.draw(st.booleans()) else raw)
    for pos in flips:
        if pos < len(damaged):
            damaged[pos] ^= 0xFF
    _load(bytes(damaged), "t.json.gz")


@_QUICK
@given(st.binary(max_size=64))
def test_decoder_on_arbitrary_bytes(data: bytes) -> None:
    _load(data)


_RECORD = st.dictionaries(st.sampled_from(RECORD_KEYS) | st.text(max_size=4), _JSON, max_size=6)
_META = st.dictionaries(st.sampled_from(META_KEYS) | st.text(max_size=4), _JSON, max_size=5)


def _read(reader: Any, name: str, text: str) -> None:
    """``reader(folder)`` on a folder holding ``name`` with ``text``: a value or one
    FsobsError naming the file."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_text(text)
        try:
            reader(Path(folder))
        except FsobsError as exc:
            message = str(exc)
            assert message == " ".join(message.split()) and str(path) in message


@_QUICK
@given(st.lists(_RECORD | _JSON, min_size=1, max_size=3))
def test_sidecar_reader_on_arbitrary_json(lines: list[object]) -> None:
    _read(read_sidecars, "steps.rank0.jsonl", "".join(json.dumps(v) + "\n" for v in lines))


@_QUICK
@given(_META | _JSON)
def test_run_json_reader_on_arbitrary_json(value: object) -> None:
    _read(read_run_json, "run.json", json.dumps(value))
