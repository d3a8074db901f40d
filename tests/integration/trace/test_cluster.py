"""fsobs on a Dask cluster, and runs read straight from fsspec URLs.

- a 2-worker ``LocalCluster`` (one per module) gives the same JSON as the local pool;
- a run served over HTTP on 127.0.0.1, or put in fsspec's memory filesystem, analyzes the same;
- a worker killed while it parses a rank: the task runs again, or the error names the file.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from fsobs import LoadConfig, analyze_path
from fsobs.analysis import analyze_summary, summarize_rank, whatif
from fsobs.cli import main
from fsobs.errors import ClusterError, EmptyRunError, ExportError, FsobsError, TraceReadError
from fsobs.export import export_run
from fsobs.report import to_json, whatif_json
from fsobs.storage import RemotePath, as_location
from fsobs.trace import cluster, loader
from fsobs.trace.cluster import scheduler_address
from fsobs.trace.loader import map_run
from fsobs.trace.schema import RankTrace

dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")
fsspec = pytest.importorskip("fsspec")

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = ROOT / "traces" / "reference"
SETS = ("synthetic_gloo_a2a_straggler_4rank", "hta_recsys_a2a_2rank")
WITH_SIDECARS = ROOT / "traces" / "ab_balance_2rank" / "control"  # run.json + steps.rank*.jsonl


def _json(source: Any, config: LoadConfig | None = None) -> dict[str, Any]:
    """``fsobs analyze --json`` of ``source``, without the run's path (it names the source)."""
    out = to_json(analyze_path(source, config))
    out["run"].pop("path")
    return out


@functools.cache
def _local(name: str) -> dict[str, Any]:
    return _json(REFERENCE / name if name in SETS else Path(name), LoadConfig(scheduler="local"))


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    """A 2-process LocalCluster on loopback; a task may kill its worker once and be re-run
    (``allowed-failures`` 1), and each worker runs one task at a time (a death is charged to
    the task that caused it only)."""
    settings = {
        "distributed.scheduler.allowed-failures": 1,
        "distributed.scheduler.worker-saturation": 1.0,
    }
    with (
        dask.config.set(settings),
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",  # no fixed port: 8787 may be taken
            worker_dashboard_address=None,
        ) as local_cluster,
    ):
        yield local_cluster.scheduler_address


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        pass


@pytest.fixture(scope="module")
def http_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """(folder, its URL): a copy of the reference sets and of a run with sidecars, served by
    ``http.server`` on 127.0.0.1 (loopback only) from a thread."""
    folder = tmp_path_factory.mktemp("served")
    for name in SETS:
        shutil.copytree(REFERENCE / name, folder / name)
    shutil.copytree(WITH_SIDECARS, folder / "with_sidecars")
    handler = partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield folder, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def memory_run() -> Iterator[str]:
    """A fresh ``memory://`` folder, removed afterwards."""
    fs = fsspec.filesystem("memory")
    root = f"/fsobs-test-{uuid.uuid4().hex[:8]}"
    yield f"memory:/{root}"
    if fs.exists(root):
        fs.rm(root, recursive=True)


def _put(fs: Any, source: Path, root: str) -> None:
    for path in source.iterdir():
        fs.pipe(f"{root}/{path.name}", path.read_bytes())


# ----------------------------------------------------------------------------- storage


def test_remote_path_is_a_pure_url() -> None:
    path = RemotePath("s3://bucket/runs/a/")
    assert str(path) == "s3://bucket/runs/a"
    assert (path.name, str(path.parent), str(path / "rank0.json.gz")) == (
        "a",
        "s3://bucket/runs",
        "s3://bucket/runs/a/rank0.json.gz",
    )
    assert RemotePath("http://host:8000/x%20y.json").name == "x y.json"
    assert RemotePath("s3://bucket").parent == RemotePath("s3://bucket")
    assert as_location("file:///tmp/run") == Path("/tmp/run")
    assert as_location("traces/x") == Path("traces/x")
    assert as_location("gs://b/r") == RemotePath("gs://b/r")


def test_scheduler_address_from_config_then_environment() -> None:
    env = {"FSOBS_DASK_SCHEDULER": "tcp://10.0.0.1:8786"}
    assert scheduler_address(None, {}) is None
    assert scheduler_address(None, env) == "tcp://10.0.0.1:8786"
    assert scheduler_address("tcp://h:1", env) == "tcp://h:1"
    assert scheduler_address("local", env) is None
    with pytest.raises(ValueError, match="scheduler"):
        LoadConfig(scheduler=" ")


# ----------------------------------------------------------------------------- URLs, local pool


@pytest.mark.parametrize("name", SETS)
def test_memory_filesystem_run_analyzes_the_same(name: str, memory_run: str) -> None:
    _put(fsspec.filesystem("memory"), REFERENCE / name, memory_run.removeprefix("memory:/"))
    assert _json(memory_run, LoadConfig(scheduler="local")) == _local(name)


@pytest.mark.parametrize("name", SETS)
def test_http_run_analyzes_the_same(name: str, http_root: tuple[Path, str]) -> None:
    url = f"{http_root[1]}/{name}/"
    assert _json(url, LoadConfig(scheduler="local")) == _local(name)


def test_http_run_with_sidecars_and_run_json_in_the_fork_pool(
    http_root: tuple[Path, str],
) -> None:
    """Sizes are unknown over HTTP, so the fork pool parses (each child streams its file)."""
    got = _json(f"{http_root[1]}/with_sidecars", LoadConfig(scheduler="local", workers=2))
    assert got == _local(str(WITH_SIDECARS))
    assert got["data_attribution"] is not None


def test_http_single_files_and_missing_folders(http_root: tuple[Path, str]) -> None:
    base = f"{http_root[1]}/synthetic_gloo_a2a_straggler_4rank"
    one = analyze_path(f"{base}/rank2.json.gz", LoadConfig(scheduler="local"))
    assert (one.run.rank_ids, one.run.world_size) == ([2], 4)
    files = [f"{base}/rank{r}.json.gz" for r in range(4)]
    assert _json(files, LoadConfig(scheduler="local")) == _local(SETS[0])
    with pytest.raises(TraceReadError, match="no such file or directory"):
        analyze_path(f"{http_root[1]}/nope/", LoadConfig(scheduler="local"))
    with pytest.raises(TraceReadError, match="cannot read file"):
        analyze_path(f"{base}/rank9.json.gz", LoadConfig(scheduler="local"))


def test_empty_or_missing_memory_folder(memory_run: str) -> None:
    fsspec.filesystem("memory").pipe(f"{memory_run.removeprefix('memory:/')}/notes.txt", b"x")
    with pytest.raises(EmptyRunError):
        analyze_path(memory_run)
    with pytest.raises(TraceReadError, match="no such file or directory"):
        analyze_path(f"{memory_run}-missing")


def test_analysis_imports_and_runs_without_dask_or_fsspec() -> None:
    code = (
        "import sys\n"
        "for name in ('dask', 'distributed', 'fsspec'):\n"
        "    sys.modules[name] = None\n"
        "import fsobs, fsobs.trace, fsobs.analysis\n"
        f"a = fsobs.analyze_path({str(REFERENCE / SETS[0])!r})\n"
        "assert len(a.run.ranks) == 4\n"
        "import fsobs.trace.cluster\n"
        "from fsobs.errors import ClusterError\n"
        "try:\n"
        f"    fsobs.analyze_path({str(REFERENCE / SETS[0])!r}, "
        "fsobs.LoadConfig(scheduler='tcp://127.0.0.1:1'))\n"
        "except ClusterError as exc:\n"
        "    assert 'pip install' in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('no error')\n"
        "try:\n"
        "    fsobs.analyze_path('s3://bucket/run/')\n"
        "except fsobs.TraceReadError as exc:\n"
        "    assert 'fsspec' in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('no error')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "FSOBS_DASK_SCHEDULER"}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=env, timeout=120)


# ----------------------------------------------------------------------------- on the cluster


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", SETS)
def test_local_cluster_gives_the_same_json(name: str, scheduler: str) -> None:
    source = REFERENCE / name
    got = to_json(analyze_path(source, LoadConfig(scheduler=scheduler)))
    want = to_json(analyze_path(source, LoadConfig(scheduler="local")))
    assert got == want


@pytest.mark.multiprocess
def test_http_run_on_the_cluster(scheduler: str, http_root: tuple[Path, str]) -> None:
    """Each worker opens its rank's URL itself."""
    got = _json(f"{http_root[1]}/with_sidecars/", LoadConfig(scheduler=scheduler))
    assert got == _local(str(WITH_SIDECARS))


@pytest.mark.multiprocess
def test_cli_scheduler_option_and_environment(
    scheduler: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = str(REFERENCE / SETS[0])
    assert main(["analyze", source, "--json", "--scheduler", scheduler]) == 0
    by_flag = json.loads(capsys.readouterr().out)
    monkeypatch.setenv("FSOBS_DASK_SCHEDULER", scheduler)
    assert main(["analyze", source, "--json"]) == 0
    by_env = json.loads(capsys.readouterr().out)
    assert by_flag == by_env == to_json(analyze_path(source, LoadConfig(scheduler="local")))


@pytest.mark.multiprocess
def test_progress_is_reported_from_the_cluster(scheduler: str) -> None:
    seen: list[tuple[int, int]] = []
    map_run(
        REFERENCE / SETS[0],
        summarize_rank,
        LoadConfig(scheduler=scheduler),
        progress=lambda done, total: seen.append((done, total)),
    )
    assert seen == [(i, 4) for i in range(5)]


def _keep_log(config: LoadConfig) -> list[tuple[str, int]]:
    """map_run with a ``keep`` that marks what it keeps: the events it saw, in order."""
    events: list[tuple[str, int]] = []

    def keep(summary: Any) -> Any:
        events.append(("keep", summary.rank))
        summary.kept_by = os.getpid()
        return summary

    run = map_run(
        REFERENCE / SETS[0],
        summarize_rank,
        config,
        progress=lambda done, total: events.append(("progress", done)),
        keep=keep,
    )
    assert [getattr(s, "kept_by", None) for s in run.ranks.values()] == [os.getpid()] * 4
    return events


def _arrival_order(events: list[tuple[str, int]]) -> None:
    """Each rank is kept the moment it arrives, before the next one is reported, once."""
    assert events[0] == ("progress", 0)
    kept = [rank for kind, rank in events if kind == "keep"]
    assert sorted(kept) == [0, 1, 2, 3]
    assert [kind for kind, _ in events[1:]] == ["keep", "progress"] * 4
    assert [n for kind, n in events if kind == "progress"] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("pool", [False, True], ids=["in-process", "fork-pool"])
def test_keep_runs_here_as_each_rank_arrives(pool: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if pool:
        monkeypatch.setattr(loader, "_PARALLEL_MIN_BYTES", 0)
    _arrival_order(_keep_log(LoadConfig(workers=2 if pool else 1, scheduler="local")))


@pytest.mark.multiprocess
def test_keep_runs_here_as_each_rank_arrives_from_the_cluster(scheduler: str) -> None:
    _arrival_order(_keep_log(LoadConfig(scheduler=scheduler)))


@pytest.mark.multiprocess
def test_bad_input_on_the_cluster_is_the_same_error(scheduler: str, tmp_path: Path) -> None:
    shutil.copytree(REFERENCE / SETS[0], tmp_path / "run")
    bad = tmp_path / "run" / "rank1.json.gz"
    bad.write_bytes(bad.read_bytes()[:-100])  # truncated gzip
    with pytest.raises(FsobsError) as local:
        analyze_path(tmp_path / "run", LoadConfig(scheduler="local"))
    with pytest.raises(FsobsError) as remote:
        analyze_path(tmp_path / "run", LoadConfig(scheduler=scheduler))
    assert type(remote.value) is type(local.value)
    assert (remote.value.rank, remote.value.detail) == (local.value.rank, local.value.detail)
    assert remote.value.path == str(bad)


def test_unreachable_scheduler_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT_S", 1)
    with pytest.raises(ClusterError, match="cannot connect to the Dask scheduler at tcp://"):
        analyze_path(REFERENCE / SETS[0], LoadConfig(scheduler="tcp://127.0.0.1:9"))


def _die_once(marker_dir: str, trace: RankTrace) -> Any:
    """Kill this worker process the first time rank 1 is reduced, then behave."""
    marker = Path(marker_dir) / f"died-rank{trace.rank}"
    if trace.rank == 1 and not marker.exists():
        marker.touch()
        os._exit(1)
    return summarize_rank(trace)


def _always_die(trace: RankTrace) -> Any:
    if trace.rank == 1:
        os._exit(1)
    return summarize_rank(trace)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_worker_killed_mid_analysis_is_retried(scheduler: str, tmp_path: Path) -> None:
    source = REFERENCE / SETS[0]
    run = map_run(source, partial(_die_once, str(tmp_path)), LoadConfig(scheduler=scheduler))
    assert (tmp_path / "died-rank1").exists(), "the worker was not killed"
    assert to_json(analyze_summary(run)) == to_json(analyze_path(source))


@pytest.mark.slow
@pytest.mark.multiprocess
def test_worker_that_keeps_dying_is_reported_with_its_file(scheduler: str) -> None:
    source = REFERENCE / SETS[0]
    with pytest.raises(ClusterError) as info:
        map_run(source, _always_die, LoadConfig(scheduler=scheduler))
    assert info.value.path == str(source / "rank1.json.gz")
    assert "kept dying" in str(info.value)


def test_whatif_and_export_of_a_url_run(memory_run: str, tmp_path: Path) -> None:
    """What-if reads the per-sample lengths from the run's sidecar frame (it reads no sidecar
    file of its own), so a URL run predicts as its local copy does; export writes local runs
    only and says so in one line."""
    source = WITH_SIDECARS
    _put(fsspec.filesystem("memory"), source, memory_run.removeprefix("memory:/"))
    config = LoadConfig(scheduler="local")
    remote, local = analyze_path(memory_run, config), analyze_path(source, config)
    pinned = {"draws": 20, "seed": 0, "planner_ns": 1000.0}
    got, want = whatif_json(whatif(remote, **pinned)), whatif_json(whatif(local, **pinned))
    assert got["run"].pop("path") == memory_run and want["run"].pop("path") == str(source)
    assert got == want and got["calibration"]["imbalance_after"] is not None  # balance predicted
    with pytest.raises(ExportError, match="export reads local runs only"):
        export_run(remote.run, remote.bubbles, tmp_path / "out")
    assert not (tmp_path / "out").exists()
