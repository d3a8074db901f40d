"""Communication inside a host and across hosts (issue 36, point 7; TraceLens #459): per
collective class, the rank-time and bytes of collectives whose ranks all ran on one host.

A hand-built 4-rank NCCL run on two hosts (ranks 0, 1 on ``host-a``; 2, 3 on ``host-b``), one
step; every rank runs an all_reduce of the whole world (group 0: 20 µs, 1024 floats) and then
one of its host's pair (groups 1 = {0, 1} and 2 = {2, 3}: 10 µs, 256 floats)::

    t (µs)     10        30        50   60
    every rank |=ar g0===|         |ar g1/g2|

By hand: inter-node, the world's all_reduce: 1 instance, 4 x 20 µs = 0.080 rank-ms, 4 x 4096
bytes; intra-node, the pairs': 2 instances, 4 x 10 µs = 0.040 rank-ms, 4 x 1024 bytes. Of the
time 0.040 / 0.120 = 1/3 stayed inside a host, of the bytes 4096 / 20480 = 1/5.
"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from fsobs.analysis import analyze_path
from fsobs.analysis.locality import comm_locality, intra_share
from fsobs.cli import main
from fsobs.report import render, to_json
from tests.support.kineto import allreduce, gpu_doc, write

HOSTS = ("host-a", "host-a", "host-b", "host-b")


def _run(tmp_path, hosts=HOSTS):
    groups = [
        {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": [0, 1, 2, 3]},
        {"pg_name": "1", "pg_desc": "host_a", "pg_size": 2, "ranks": [0, 1]},
        {"pg_name": "2", "pg_desc": "host_b", "pg_size": 2, "ranks": [2, 3]},
    ]
    for rank in range(4):
        pair = "1" if rank < 2 else "2"
        work = [
            (1, allreduce(10, 20, 1, pg="0", nelems=1024)),
            (1, allreduce(50, 10, 1, pg=pair, nelems=256)),
        ]
        doc = gpu_doc(rank, {1: (0, 100)}, work, world_size=4, host=hosts[rank])
        doc["distributedInfo"]["pg_config"] = groups
        write(tmp_path / f"rank{rank}.json", doc)
    return analyze_path(tmp_path)


def test_per_class_and_span_by_hand(tmp_path):
    table = comm_locality(_run(tmp_path))
    rows = {(r.coll, r.span): r for r in table.itertuples()}
    assert set(rows) == {("all_reduce", "inter-node"), ("all_reduce", "intra-node")}
    inter, intra = rows["all_reduce", "inter-node"], rows["all_reduce", "intra-node"]
    assert (inter.instances, intra.instances) == (1, 2)
    assert inter.rank_ms == pytest.approx(0.080) and intra.rank_ms == pytest.approx(0.040)
    assert (inter.bytes, intra.bytes) == (4 * 4096, 4 * 1024)
    assert inter.bytes_known and intra.bytes_known
    assert intra_share(table) == pytest.approx((1 / 3, 1 / 5))


def test_one_host_is_all_intra_and_a_rank_without_a_host_is_unknown(tmp_path):
    one = comm_locality(_run(tmp_path / "one", hosts=("h",) * 4))
    assert set(one["span"]) == {"intra-node"}
    assert intra_share(one) == pytest.approx((1.0, 1.0))
    unnamed = comm_locality(_run(tmp_path / "unnamed", hosts=("host-a", "", "host-b", "host-b")))
    spans = dict(zip(unnamed["span"], unnamed["instances"], strict=True))
    # the world's and the {0, 1} pair's include rank 1: unknown; the {2, 3} pair is intra-node
    assert spans == {"intra-node": 1, "unknown": 2}


def test_json_report_and_cli(tmp_path, capsys):
    analysis = _run(tmp_path)
    got = to_json(analysis)["collectives"]["locality"]
    assert got["intra_node_share"] == {"time": pytest.approx(1 / 3), "bytes": pytest.approx(0.2)}
    assert [(r["coll"], r["span"], r["instances"]) for r in got["by_class"]] == [
        ("all_reduce", "intra-node", 2),
        ("all_reduce", "inter-node", 1),
    ]
    json.dumps(got, allow_nan=False)
    out = io.StringIO()
    render(analysis, Console(file=out, force_terminal=False, width=250))
    line = (
        "communication inside a host: 33% of the collectives' rank-time, 20% of their bytes "
        "(2 hosts; the rest spans hosts)"
    )
    assert line in out.getvalue()
    assert main(["analyze", str(tmp_path)]) == 0
    assert line in capsys.readouterr().out


def test_the_dashboards_all_to_all_tab_shows_it(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tests.support.stores import APP

    _run(tmp_path / "store" / "hosts")
    monkeypatch.setenv("FSOBS_STORE", str(tmp_path / "store"))
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["run"] = "hosts"
    at.switch_page("app_pages/bubbles.py")
    at.run()
    at.session_state["bubbles_tab"] = "All-to-all"
    at.run()
    assert not at.exception, at.exception
    captions = [c.value for c in at.caption]
    assert "33.3% of the collectives' rank-time and 20.0% of the bytes stayed inside a host." in (
        captions
    )
    shown = next(t for t in at.dataframe if "span" in t.value.columns)
    assert shown.value["span"].tolist() == ["intra-node", "inter-node"]
    assert shown.value["instances"].tolist() == [2, 1]
