"""What-if's scale study, simulated in a process of its own while the page predicts.

At 256 ranks the study (the run's calibration, a scale curve for two jobs, the toggles at
:data:`STUDY_WORLD_SIZE` ranks) takes about as long as the predictions themselves; run in the
server's process it came after them and held the page as long again. :func:`in_process` runs
it in a fresh ``python -m dashboard.scale_study`` (the analysis in, pickled, on its stdin; the
study out on its stdout), so a thread of the server only waits for it. Not multiprocessing:
its ``spawn`` runs the parent's ``__main__`` again, which under Streamlit is the app script.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

from fsobs import Analysis, FsobsError
from fsobs.simulate import WORLD_SIZES, SimConfig, calibrate, scale_curve, toggle_study

STUDY_WORLD_SIZE = 256
STUDY_STEPS = 10

Study = tuple[pd.DataFrame, pd.DataFrame, str]
"""The scale curves (column ``job`` names each), the toggles at :data:`STUDY_WORLD_SIZE` ranks,
and where the first job comes from."""


def study(analysis: Analysis) -> Study:
    """The scale curve (this run's calibration and the GPU-like default) and the toggles at
    :data:`STUDY_WORLD_SIZE` ranks, simulated with :data:`STUDY_STEPS` steps per point."""
    try:
        jobs = {"calibrated from this run": calibrate(analysis)}
        source = jobs["calibrated from this run"].source
    except FsobsError as exc:
        jobs, source = {}, f"not calibrated ({exc}); the GPU-like default job only"
    jobs["GPU-like default job"] = SimConfig()
    jobs = {name: replace(cfg, steps=STUDY_STEPS) for name, cfg in jobs.items()}
    curves = [
        scale_curve(cfg, WORLD_SIZES, seeds=(0,)).assign(job=name) for name, cfg in jobs.items()
    ]
    first = next(iter(jobs.values()))
    at_scale = toggle_study(first, STUDY_WORLD_SIZE, seeds=(0,))
    return pd.concat(curves, ignore_index=True), at_scale, source


ROOT = Path(__file__).resolve().parents[1]
"""Where ``python -m dashboard.scale_study`` finds this very package."""


def in_process(analysis: Analysis) -> Study:
    """:func:`study` of ``analysis`` in a child process; the child's last line of error output
    as a RuntimeError if it fails."""
    child = subprocess.run(
        [sys.executable, "-m", "dashboard.scale_study"],
        input=pickle.dumps(analysis, protocol=pickle.HIGHEST_PROTOCOL),
        capture_output=True,
        cwd=ROOT,
        check=False,
    )
    if child.returncode != 0:
        lines = child.stderr.decode(errors="replace").strip().splitlines() or ["no output"]
        raise RuntimeError(f"the scale study's process failed: {lines[-1]}")
    result: Study = pickle.loads(child.stdout)
    return result


if __name__ == "__main__":
    sys.stdout.buffer.write(pickle.dumps(study(pickle.load(sys.stdin.buffer))))
