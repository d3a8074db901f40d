"""Per-rank ``torch.profiler`` wrapper that writes ``rank<R>.trace.json.gz`` (DESIGN §3).

Usage in a training loop (the ``ProfilerStep#N`` ranges come from torch.profiler itself)::

    with StepProfiler(run_dir, rank, ProfilerConfig(wait=1, warmup=1, active=3)) as prof:
        for batch in batches:
            train_step(batch)
            prof.step()

Schedule, per cycle (repeated ``repeat`` times)::

    step:    0 .. wait-1 | wait .. wait+warmup-1 | ... active steps ...
    action:  idle        | warm up (discarded)   | recorded -> trace exported at the cycle's end

The trace is exported when a cycle's last active step ends, or when the ``with`` block is left
(also on an exception) while steps are being recorded. Export is atomic: Chrome JSON to a
temporary name in the run directory, gzip to a second temporary name, then ``os.replace`` to the
final name; a failing export leaves no file under the final name. Its exception is not raised
into ``step()`` (torch's profiler breaks if its callback raises) but kept and re-raised when the
``with`` block is left, so training is never disturbed by profiling. With ``repeat > 1``
each cycle's export replaces the previous one, so the file always holds the latest whole cycle
(one trace per rank is the run format). ``distributedInfo`` is added by torch when
``torch.distributed`` is initialized; without it the trace still loads (as rank 0 when alone).

Profiling only observes: it adds no synchronization, no randomness and no change to tensors, so
the trained parameters are the same with the profiler on or off (tested bit for bit).

:class:`ProfilerConfig` imports without torch (a launcher builds it before any rank starts);
torch is imported when a :class:`StepProfiler` starts.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from fsobs.runformat.atomic import publish, temp_path
from fsobs.runformat.names import trace_file_name

if TYPE_CHECKING:
    import torch
    from torch.profiler import ProfilerActivity

logger = logging.getLogger(__name__)

__all__ = ["ProfilerConfig", "StepProfiler", "export_trace"]


@dataclass(kw_only=True, frozen=True)
class ProfilerConfig:
    """What to profile and when (the ``torch.profiler.schedule`` of each rank)."""

    enabled: bool = True
    """Profile at all; False: :class:`StepProfiler` does nothing (and writes nothing)."""
    wait: int = 1
    """Steps skipped at the start of each cycle."""
    warmup: int = 1
    """Steps traced but discarded before recording (torch warns that 0 skews the results)."""
    active: int = 3
    """Steps recorded in each cycle."""
    repeat: int = 1
    """Number of cycles; each exported cycle replaces the previous trace file."""
    record_shapes: bool = True
    """Record input shapes (gloo collectives carry their sizes only in ``Input Dims``)."""
    with_stack: bool = False
    """Record Python stacks (about 2-3x larger traces)."""
    profile_memory: bool = False
    """Record tensor allocations."""

    def __post_init__(self) -> None:
        for name, low in (("wait", 0), ("warmup", 1), ("active", 1), ("repeat", 1)):
            value = getattr(self, name)
            if type(value) is not int or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        for name in ("enabled", "record_shapes", "with_stack", "profile_memory"):
            if type(getattr(self, name)) is not bool:
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")

    @classmethod
    def every_step(cls, steps: int, **fields: Any) -> ProfilerConfig:
        """One cycle that records every step of a ``steps``-step loop after its ``wait`` and
        ``warmup`` steps (default one each); ``fields`` set the others, not ``active`` and
        ``repeat``."""
        wait, warmup = fields.pop("wait", 1), fields.pop("warmup", 1)
        if steps <= wait + warmup:
            raise ValueError(
                f"steps: must be > wait + warmup ({wait + warmup}) so that a step is recorded, "
                f"got {steps}"
            )
        return cls(wait=wait, warmup=warmup, active=steps - wait - warmup, **fields)

    @property
    def cycle_steps(self) -> int:
        """Steps in one cycle (wait + warmup + active)."""
        return self.wait + self.warmup + self.active

    @property
    def num_steps(self) -> int:
        """Steps needed to complete every cycle; later steps are not profiled."""
        return self.cycle_steps * self.repeat


class StepProfiler:
    """Context manager profiling one rank's training loop into ``run_dir``.

    With ``config.enabled`` False it is a true no-op: no profiler is created, nothing is
    written (not even the directory), and ``step()`` does nothing, so the call sites stay the same.
    """

    def __init__(self, run_dir: str | Path, rank: int, config: ProfilerConfig) -> None:
        if type(rank) is not int or rank < 0:
            raise ValueError(f"rank must be a non-negative integer, got {rank!r}")
        if not isinstance(config, ProfilerConfig):
            raise ValueError(f"config must be a ProfilerConfig, got {type(config).__name__}")
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.config = config
        self.enabled = config.enabled
        self.trace_path = self.run_dir / trace_file_name(rank)
        """Where the trace is written."""
        self.num_exports = 0
        """Traces exported so far (one per completed or interrupted recording cycle)."""
        self.export_error: Exception | None = None
        """The first failed export; re-raised when the ``with`` block is left without error."""
        self._prof: torch.profiler.profile | None = None
        self._keep_previous = False

    def __enter__(self) -> StepProfiler:
        if not self.enabled:
            return self
        if self._prof is not None:
            raise RuntimeError("StepProfiler is already active; it cannot be nested")
        _check_rank(self.rank)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.trace_path.exists():
            raise FileExistsError(f"{self.trace_path}: a trace of this rank is already there")
        import torch

        cfg = self.config
        prof = torch.profiler.profile(
            activities=_activities(),
            schedule=torch.profiler.schedule(
                wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=cfg.repeat
            ),
            on_trace_ready=self._export,
            record_shapes=cfg.record_shapes,
            with_stack=cfg.with_stack,
            profile_memory=cfg.profile_memory,
        )
        prof.__enter__()  # type: ignore[no-untyped-call]  # torch: unannotated
        self._prof = prof
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        prof, self._prof = self._prof, None
        if prof is None:
            return
        # Leaving on an error mid-cycle: keep a complete earlier cycle rather than replace it
        # with a partial one, so that the ranks' traces still cover the same steps.
        self._keep_previous = exc_type is not None and self.trace_path.exists()
        with self._quiet():
            prof.__exit__(exc_type, exc, tb)  # type: ignore[no-untyped-call]  # torch: unannotated
        if self.export_error is not None and exc_type is None:
            raise self.export_error

    def step(self) -> None:
        """Mark the end of a training step (call once per step, after the optimizer step)."""
        if not self.enabled:
            return
        if self._prof is None:
            raise RuntimeError("StepProfiler.step() called outside its with block")
        with self._quiet():
            self._prof.step()

    def _export(self, prof: torch.profiler.profile) -> None:
        # torch calls this in the middle of a state transition: an exception escaping here leaves
        # its profiler half-stopped (a later step segfaults, torch 2.13), so keep it for __exit__.
        if self._keep_previous:
            return
        try:
            export_trace(prof, self.trace_path)
        except Exception as error:
            logger.error(
                "rank %d: trace export to %s failed: %s", self.rank, self.trace_path, error
            )
            if self.export_error is None:
                self.export_error = error
            return
        self.num_exports += 1
        logger.debug("rank %d: trace written to %s", self.rank, self.trace_path)

    @contextlib.contextmanager
    def _quiet(self) -> Iterator[None]:
        """Silence torch's warning that each cycle starts afresh (intended, see the module doc)."""
        if self.config.repeat == 1:
            yield
            return
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each")
            yield


def export_trace(prof: torch.profiler.profile, path: Path) -> None:
    """Export ``prof``'s last cycle as gzipped Chrome JSON to ``path``, atomically.

    Both intermediate files live next to ``path`` under dot-names ending in ``.tmp`` and are
    removed whatever happens; ``path`` only ever appears complete.
    """
    raw = temp_path(path, "raw")
    packed = temp_path(path, "gz")
    try:
        prof.export_chrome_trace(str(raw))
        _gzip(raw, packed)
        publish(packed, path)
    finally:
        raw.unlink(missing_ok=True)
        packed.unlink(missing_ok=True)


def _gzip(source: Path, target: Path) -> None:
    with open(source, "rb") as fin, gzip.open(target, "xb", compresslevel=6) as fout:
        shutil.copyfileobj(fin, fout, length=4 * 2**20)


def _activities() -> list[ProfilerActivity]:
    import torch
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    return activities


def _check_rank(rank: int) -> None:
    """The file name and ``distributedInfo.rank`` must agree, or the analysis mixes ranks up."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_rank() != rank:
        raise ValueError(
            f"rank {rank} given, but torch.distributed says this process is rank {dist.get_rank()}"
        )
