"""The run format (docs/design.md §3): one home for the files a run is made of, without torch.

A training loop that is not ours writes a run with this package alone::

    from fsobs.runformat import RunMeta, SidecarWriter, StepRecord, ToggleStatus, write_run_json
    from fsobs.runformat import trace_file_name

    with SidecarWriter(run_dir, rank) as sidecar:           # steps.rank<R>.jsonl, atomic
        for step, batch in enumerate(loader):
            ...                                              # train; the profiler writes
            sidecar.write(StepRecord.of(step, lengths, est_cost, t0_ns, t1_ns, loss=loss))
    # the profiler's trace goes to run_dir / trace_file_name(rank)
    if rank == 0:
        write_run_json(run_dir, RunMeta(name="mine", world_size=world_size, backend="nccl",
                                        device="cuda", ranks_present=tuple(range(world_size))))

Modules: :mod:`.names` (the file names), :mod:`.files` (which files a folder holds:
:func:`run_files`, what every reader of a run lists), :mod:`.steps` (a sidecar line,
:class:`StepRecord`, its writer and strict reader), :mod:`.runmeta` (``run.json``,
:class:`RunMeta`, and how an interrupted run is closed off), :mod:`.atomic` (write to a
temporary name, then rename), :mod:`.bounded` (``run.json`` and sidecar lines read with a size
bound).
"""

from fsobs.runformat.atomic import write_atomic
from fsobs.runformat.bounded import read_limited
from fsobs.runformat.files import RunFiles, run_files
from fsobs.runformat.names import (
    COST_MODEL,
    FORMAT_VERSION,
    PARTIAL_SUFFIX,
    RUN_JSON,
    WINDOWS_DIR,
    is_run_file,
    is_trace_name,
    sidecar_file_name,
    trace_file_name,
)
from fsobs.runformat.runmeta import (
    RunMeta,
    ToggleStatus,
    finalize_incomplete,
    mark_incomplete,
    read_run_json,
    read_run_meta,
    write_run_json,
)
from fsobs.runformat.steps import (
    SidecarWriter,
    StepRecord,
    read_sidecars,
    read_step_lengths,
    write_sidecar,
)

__all__ = [
    "COST_MODEL",
    "FORMAT_VERSION",
    "PARTIAL_SUFFIX",
    "RUN_JSON",
    "WINDOWS_DIR",
    "RunFiles",
    "RunMeta",
    "SidecarWriter",
    "StepRecord",
    "ToggleStatus",
    "finalize_incomplete",
    "is_run_file",
    "is_trace_name",
    "mark_incomplete",
    "read_limited",
    "read_run_json",
    "read_run_meta",
    "read_sidecars",
    "read_step_lengths",
    "run_files",
    "sidecar_file_name",
    "trace_file_name",
    "write_atomic",
    "write_run_json",
    "write_sidecar",
]
