"""``make screenshots`` (``dashboard/screenshots/take.py``): which pair of the demo it shows.

The pictures themselves are taken in a real browser by the script (and looked at); here, the
rule that keeps them honest: Compare, What-if and Arms show the pair whose balanced-vs-baseline
reduction is the median of the pairs', not the best one.
"""

from __future__ import annotations

from pathlib import Path

from dashboard.screenshots.take import demo_shots, median_pair
from fsobs.cli import main

SIM = ("simulate", "--world-size", "4", "--steps", "4", "--workers", "1")


def _run(path: Path, factor: str) -> None:
    shift = ("--shift-rank", "2", "--shift-from", "0", "--shift-factor", factor)
    assert main([*SIM, *shift, "--out", str(path)]) == 0


def test_the_pair_shown_is_the_median_one(tmp_path):
    """Every baseline has rank 2's samples 3x longer; the 'balanced' arm of pair 0 has them 2x,
    of pair 1 1.2x, of pair 2 2.6x: the shorter rank 2's data, the less the others wait, so the
    reductions rank pair 1 > pair 0 > pair 2, and the median is pair 0's."""
    for pair, factor in enumerate(("2", "1.2", "2.6")):
        _run(tmp_path / f"baseline-{pair}", "3")
        _run(tmp_path / f"balanced-{pair}", factor)
    assert median_pair(tmp_path) == 0
    shots = {shot.name: shot for shot in demo_shots(0)}
    assert shots["compare"].query == {"control": "baseline-0", "test": "balanced-0"}
    assert shots["arms"].query["runs"] == "baseline-0,balanced-0,pec-0,freescale-0"
    assert shots["whatif"].query == {"run": "baseline-0"}
