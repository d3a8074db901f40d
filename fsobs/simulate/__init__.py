"""Simulated runs that write the run format (no torch).

- :mod:`fsobs.simulate.simulator`: the N-rank job simulator (``fsobs simulate``):
  :class:`SimConfig` (or :func:`calibrate` from a measured run), :func:`simulate` (the schedule
  and the truth of every bubble class), :func:`write_run` (traces, sidecars, ``run.json`` with
  ``simulated: true``, ``truth.json``); :mod:`fsobs.simulate.study`: the scale study.
- :func:`write_gpu_run` writes realistic multi-rank NCCL GPU Kineto traces with many kernels
  per step (for benchmarks and tests of the loader and the analyses; from the command line:
  ``benchmarks/gen_synthetic.py``).
- :mod:`fsobs.simulate.kineto_writer`: the Kineto trace text both writers render through.

Names are imported lazily: importing the package loads neither writer.
"""

from __future__ import annotations

from optim.lazy import lazy_attributes

_SYNTHETIC = ("SyntheticRunConfig", "kernels_for_size", "write_gpu_run")
_SIMULATOR = (
    "SimConfig",
    "SimWindows",
    "calibrate",
    "simulate",
    "write_run",
    "truth_frame",
    "truth_error",
)
_STUDY = ("WORLD_SIZES", "scale_curve", "toggle_study")
__all__ = [*_SYNTHETIC, *_SIMULATOR, *_STUDY]

__getattr__, __dir__ = lazy_attributes(
    __name__,
    {
        **dict.fromkeys(_SYNTHETIC, ".synthetic_kineto"),
        **dict.fromkeys(_SIMULATOR, ".simulator"),
        **dict.fromkeys(_STUDY, ".study"),
    },
)
