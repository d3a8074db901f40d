"""``make demo``'s driver at its smallest (2 pairs of 4 steps, 2 ranks, 2 arms): the runs made
as interleaved pairs (checked against the runs' own clocks), the final table's structure, and
its numbers matched with the pairs they come from."""

from __future__ import annotations

import json
import math
import re

import pytest

from fsobs.analysis import analyze_path, compare
from fsobs.runformat import read_run_meta
from fsobs.workload.demo import DemoConfig, run_demo
from fsobs.workload.pairs import interleaved, pair_order

ARMS = ("baseline", "freescale")  # two arms: the pairs' order shows with two


def test_pair_order_puts_the_control_first_then_last():
    assert pair_order("cab", 0) == ["c", "a", "b"]
    assert pair_order("cab", 1) == ["a", "b", "c"]
    assert list(interleaved("ca", 3)) == [
        (0, "c"),
        (0, "a"),
        (1, "a"),
        (1, "c"),
        (2, "c"),
        (2, "a"),
    ]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"pairs": 1}, "pairs: must be an int >= 2"),
        ({"steps": 2}, "steps: must be an int >= 4"),
        ({"arms": ("baseline",)}, "arms: two or more distinct names"),
        ({"arms": ("baseline", "turbo")}, "arms: two or more distinct names"),
    ],
)
def test_bad_config_names_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        DemoConfig(**fields)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_smallest_demo_runs_interleaved_pairs_and_prints_the_table(tmp_path, capsys):
    out = tmp_path / "demo"
    config = DemoConfig(
        out=out, pairs=2, steps=4, arms=ARMS, common=("--model-size=tiny",), draws=5
    )
    result = run_demo(config)
    # pair 0 control first, pair 1 control last (by the rule, written out)
    expected = ["baseline-0", "freescale-0", "freescale-1", "baseline-1"]
    assert result.order == expected
    spans = []  # the runs' own clocks: rank 0's first step's start, last step's end
    for name in expected:
        lines = (out / name / "steps.rank0.jsonl").read_text().splitlines()
        spans.append((json.loads(lines[0])["wall_start_ns"], json.loads(lines[-1])["wall_end_ns"]))
        assert read_run_meta(out / name / "run.json").status == "complete"
    # each run began after the one before it ended: one after another, in that order
    assert all(end < start for (_, end), (start, _) in zip(spans, spans[1:], strict=False))
    assert (out.with_name("demo-export")).is_dir()  # the first baseline's traces exported

    lines = result.table.splitlines()
    assert lines[0].startswith("| arm | bubble reduction (mean of 2 pairs, 95% CI) |")
    assert lines[1] == "|---|---|---|---|---|"
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert [r[0] for r in rows] == ["freescale"] and all(len(r) == 5 for r in rows)
    for row, arm in zip(rows, ARMS[1:], strict=True):
        pairs = [compare(analyze_path(out / f"baseline-{i}"), analyze_path(out / f"{arm}-{i}"))
                 for i in range(2)]  # fmt: skip
        mean = (pairs[0].bubble_reduction + pairs[1].bubble_reduction) / 2
        assert row[1] == f"{mean:.1%} (no CI: < 3 pairs)"  # 2 pairs: no interval
        ratio = (pairs[0].step_time_ratio + pairs[1].step_time_ratio) / 2
        assert row[3] == f"{ratio:.3f} (no CI: < 3 pairs)"
    # what-if: balance + priority_overlap for "freescale" (sm_free not applied on CPU, sync_gc
    # not modelled); one prediction per baseline
    assert re.fullmatch(r"-?\d+\.\d% \(-?\d+%, -?\d+%; balance\+priority_overlap\)", rows[0][4]), (
        rows[0][4]
    )
    for arm_row in result.rows:
        assert len(arm_row.predicted) == 2
        assert all(v is not None and not math.isnan(v) for v in arm_row.predicted)
    printed = capsys.readouterr().out
    assert result.table in printed and "run order: " + ", ".join(expected) in printed
