"""The instrumented reference job, one process per rank (started by ``fsobs run`` / torchrun).

    python -m torch.distributed.run --standalone --nproc-per-node=2 \\
        -m fsobs.workload.train RUN_DIR

Every rank reads the job's config from ``RUN_DIR/job.json`` (a ``JobConfig``, written by the
launcher: ``fsobs.workload.config``) and writes the run into ``RUN_DIR``. Every rank builds the
same dataset and global batches (same seed), takes its random-split share of each step's global
batch (or, with the ``balance`` toggle, its part of a cost-balanced plan:
``fsobs.workload.inputs``), and trains ``SeqRecModel`` under torchrec DMP with
``TrainPipelineSparseDist`` (gloo on CPU, nccl on GPU). It records the run as any user's loop
does, through :class:`~fsobs.collect.RunRecorder` (docs/design.md §3):
``rank<R>.trace.json.gz`` (torch.profiler), ``steps.rank<R>.jsonl`` (what data each step got,
its estimated cost, wall-clock bounds, the balance fields and the embedding-ID overlap with the
previous global batch, which :class:`~fsobs.workload.inputs.StepInputs` works out before the
loop) and, from rank 0, ``run.json``. The recorder is made after the optimizer's process
groups, so that its own group does not change their names in ``run.json``.

The sidecar's step numbers are the profiler's ``ProfilerStep#N`` numbers: step N is the N-th
call of ``TrainPipelineSparseDist.progress``, which trains batch N. A step's wall-clock bounds
run from before ``progress`` to after its loss is computed.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from fsobs.collect.recorder import RunRecorder, StepState
from fsobs.runformat import RUN_JSON
from fsobs.workload.batch import Batch
from fsobs.workload.config import JobConfig, ModelConfig, read_job_json
from fsobs.workload.cost import cost_coefficients
from fsobs.workload.data import SyntheticHistories, global_batches
from fsobs.workload.inputs import StepInput, StepInputs
from fsobs.workload.model import SeqRecModel
from fsobs.workload.sharding import build_optimizer, table_constraints, wrap_model
from optim.balance import CostModel
from optim.freescale import FreeScale

PLAN_AHEAD_ENV = "FSOBS_PLAN_AHEAD"
"""For A/B runs and equivalence tests: ``0`` makes the balance plans on the training thread
(``FreeScale.split``'s way) instead of one step ahead on FreeScale's planner thread."""
PIN_ENV = "FSOBS_PIN_CORES"
"""``1``: pin each rank, and every thread it has or starts (gloo's, the profiler's, the balance
planner's), to one core, ``LOCAL_RANK`` modulo the cores it may use (an experiment on where a
CPU rank's speed noise comes from: BENCHMARKS.md "Window against kk")."""
FAIL_ENV = "FSOBS_FAIL_AT_STEP"
"""Fault injection for tests: ``RANK:STEP`` makes that rank exit at the start of that step (code
3, no clean-up), ``RANK:STEP:KILL`` makes it send itself SIGKILL there."""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="FreeScale reference job (one rank)")
    parser.add_argument("run_dir", type=Path, help="the run directory: reads its job.json")
    out = parser.parse_args(argv).run_dir
    job = read_job_json(out)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    if os.environ.get(PIN_ENV) == "1":
        pin_to_one_core(int(os.environ.get("LOCAL_RANK", 0)))
    if not torch.cuda.is_available():
        device = torch.device("cpu")
    else:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    torch.set_num_threads(int(os.environ.get("FSOBS_THREADS_PER_RANK", 1)))
    try:
        train(job, out, device)
    finally:
        gc.collect()  # the model and its DDP reducer first (see examples/dlrm_freescale.py)
        dist.destroy_process_group()


def pin_to_one_core(local_rank: int) -> int:
    """Pin this process's threads (and so the threads they start) to one of the cores it may
    use, chosen by ``local_rank``; returns the core."""
    cores = sorted(os.sched_getaffinity(0))
    core = cores[local_rank % len(cores)]
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), {core})
    return core


def train(
    job: JobConfig,
    out: Path,
    device: torch.device,
    batches: Sequence[np.ndarray] | None = None,
) -> None:
    """Run the job on this rank (the process group is initialized), writing the run into
    ``out``. Every FreeScale toggle goes through the optimizer API (``optim.FreeScale``), as in
    any user's loop. ``batches``: the global batches to train, one array of sample indices per
    step (any sizes; the same on every rank); None: the job's own (``global_batches``)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(job.seed)
    model_cfg = job.model.config()
    data = SyntheticHistories(job.data)
    fs = FreeScale(job.freescale, cost_model=_cost_model(job, model_cfg))
    if rank == 0 and (out / RUN_JSON).exists():  # another run's: never rewritten
        raise FileExistsError(f"{out / RUN_JSON}: the folder holds a run already")
    fs.setup()
    if batches is None:
        batches = global_batches(len(data), job.batch_size * world_size, job.steps, job.seed)
    if len(batches) != job.steps:
        raise ValueError(f"batches: {len(batches)} global batches for {job.steps} steps")
    inputs = StepInputs(data, batches, fs, ahead=os.environ.get(PLAN_AHEAD_ENV, "1") != "0")
    model = fs.prepare(SeqRecModel(model_cfg, device="meta"), table_constraints())
    dmp_kwargs = fs.dmp_kwargs(bucket_cap_mb=job.ddp_bucket_mb)
    dmp = wrap_model(
        model, device, dmp_kwargs=dmp_kwargs, optimizer=job.optimizer, add_sharders=fs.sharders
    )
    optimizer = build_optimizer(dmp, optimizer=job.optimizer)
    pipeline = fs.pipeline(dmp, optimizer, device)
    made: list[tuple[Batch, StepInput]] = []  # what the pipeline has taken, to score its outputs
    fed = _recorded(iter(inputs), made)
    fail, how = _fault(rank)
    # made last: its own process group comes after the optimizer's (module docstring)
    recorder = RunRecorder(
        out,
        freescale=fs,
        cost_model=fs.cost_model,
        profiler=job.profiler,
        name=out.name,
        workload=job.to_json(),
    )
    with fs, recorder:
        for step in range(job.steps):
            if step == fail:
                _die(how)
            state = recorder.begin_step(step)
            logits = pipeline.progress(fed)  # trains batch ``step``, returns its logits
            batch, info = made[step]
            _describe(state, info)
            state.loss = F.binary_cross_entropy_with_logits(logits.cpu(), batch.labels.cpu())
            recorder.end_step()
            fs.after_step(step)
    if job.save_params:
        torch.save(local_state(dmp), out / f"params.rank{rank}.pt")


def _describe(state: StepState, info: StepInput) -> None:
    """What the step's sidecar line tells of its data, beside the loss: the samples, their
    lengths, the balance fields and the ID overlap (:class:`StepInput`)."""
    state.lengths = info.lengths
    state.sample_ids = info.sample_ids
    state.imbalance_before = info.imbalance_before
    state.imbalance_after = info.imbalance_after
    state.batch_digest = info.batch_digest
    state.id_overlap = info.id_overlap


def _cost_model(job: JobConfig, model_cfg: ModelConfig) -> CostModel:
    """The job's cost model file, else the analytic model of the shape."""
    if job.cost_model is not None:
        return CostModel.from_json(job.cost_model)
    return cost_coefficients(model_cfg)


def _recorded(
    inputs: Iterator[tuple[Batch, StepInput]], made: list[tuple[Batch, StepInput]]
) -> Iterator[Batch]:
    for batch, info in inputs:
        made.append((batch, info))
        yield batch


def local_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This rank's part of ``module``'s state: plain tensors as they are, sharded ones as the
    concatenation of their local shards (empty when the rank holds none)."""
    out = {}
    for name, value in module.state_dict().items():
        shards = getattr(value, "local_shards", None)
        if callable(shards):
            local = [s.tensor.detach().flatten() for s in shards()]
            out[name] = torch.cat(local) if local else torch.empty(0)
        elif isinstance(value, torch.Tensor):
            out[name] = value.detach().clone()
    return out


def _fault(rank: int) -> tuple[int, str]:
    """The step at which this rank is to die (-1: none) and how (:data:`FAIL_ENV`)."""
    spec = os.environ.get(FAIL_ENV, "")
    if not spec:
        return -1, ""
    fail_rank, step, *how = spec.split(":")
    return (int(step) if int(fail_rank) == rank else -1), "".join(how)


def _die(how: str) -> NoReturn:
    """A simulated crash, without clean-up: SIGKILL (``KILL``), else exit code 3."""
    if how == "KILL":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(3)


if __name__ == "__main__":
    main()
