"""The instrumented reference job, one process per rank (started by ``fsobs run`` / torchrun).

    python -m torch.distributed.run --standalone --nproc-per-node=2 \\
        -m fsobs.workload.train --out runs/a --steps 20 --model-size small

Every rank builds the same dataset and global batches (same seed), takes its random-split share
of each step's global batch (or, with ``--balance``, its part of a cost-balanced plan:
``fsobs.workload.inputs``), and trains ``SeqRecModel`` under torchrec DMP with
``TrainPipelineSparseDist`` (gloo on CPU, nccl on GPU). It writes the run format of DESIGN §3:
``rank<R>.trace.json.gz`` (torch.profiler), ``steps.rank<R>.jsonl`` (what data each step got,
its estimated cost and wall-clock bounds) and, from rank 0, ``run.json``.

The sidecar's step numbers are the profiler's ``ProfilerStep#N`` numbers: step N is the N-th
call of ``TrainPipelineSparseDist.progress``, which trains batch N.
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

from fsobs.collect.pauses import StepMonitor
from fsobs.collect.profiler import ProfilerConfig, StepProfiler
from fsobs.runformat import RunMeta, SidecarWriter, StepRecord, ToggleStatus, write_run_json
from fsobs.workload.batch import Batch
from fsobs.workload.config import ModelConfig, data_config_for
from fsobs.workload.cost import cost_coefficients
from fsobs.workload.data import SyntheticHistories, global_batches
from fsobs.workload.inputs import StepInput, StepInputs
from fsobs.workload.lengths import PRESETS
from fsobs.workload.model import SeqRecModel
from fsobs.workload.sharding import OPTIMIZERS, build_optimizer, wrap_model
from optim.balance import METHODS, CostModel
from optim.config import DENSE_ORDERS, FreeScaleConfig, PriorityConfig, SMFreeConfig
from optim.freescale import FreeScale
from optim.plan import MODES, BalanceConfig
from optim.sync_gc import SyncGCConfig

FAIL_ENV = "FSOBS_FAIL_AT_STEP"  # fault injection for tests: "RANK:STEP" exits that rank there


@dataclass(kw_only=True, frozen=True)
class JobConfig:
    """The job's knobs (the same on every rank)."""

    out: Path
    steps: int = 20
    model_size: str = "small"
    preset: str = "lognormal"
    batch_size: int = 32
    """Samples per rank and step."""
    num_samples: int = 100_000
    seed: int = 0
    profile: bool = True
    profile_active: int | None = None
    """Steps per profiler cycle; default: every step after one wait and one warm-up step."""
    profile_repeat: int = 1
    record_shapes: bool = False
    """Input shapes in the trace (gives gloo collectives their sizes; costs step time on CPU)."""
    balance: bool = False
    """The ``balance`` toggle (``optim.plan``): cost-balanced samples across ranks."""
    balance_method: str = "kk"
    balance_mode: str = "plan"
    cost_model: Path | None = None
    """A JSON cost model (``fsobs fit-cost``); default: the analytic one of the model shape."""
    save_params: bool = False
    """Write each rank's final parameters to ``params.rank<R>.pt`` (for equivalence tests)."""
    optimizer: str = "adagrad"
    """``adagrad`` or ``sgd`` (for equivalence tests: ``fsobs.workload.sharding.OPTIMIZERS``)."""
    priority_overlap: bool = False
    """The ``priority_overlap`` toggle: embedding and dense collectives on groups of their own."""
    dense_order: str = "after_embedding"
    """``optim.PriorityConfig.dense_order``."""
    sm_free: bool = False
    """The ``sm_free`` toggle: the embedding all-to-all on the copy engines (GPU, NCCL >= 2.28)."""
    sync_gc: bool = False
    """The ``sync_gc`` toggle: Python's GC at the same steps on every rank (``optim.sync_gc``)."""
    ddp_bucket_mb: int = 25
    """DDP's bucket size for the dense all-reduce (torchrec's default 25); smaller buckets make
    more all-reduces that can be in flight when the embedding all-to-all is issued."""
    dense_mb: float = 0.0
    """An extra dense block of about this many MiB in the head (``ModelConfig.wide_dim``), so
    that the dense all-reduce is large; 0: none."""

    def __post_init__(self) -> None:
        if self.steps < 3:
            raise ValueError("steps must be >= 3 (one wait and one warm-up step are not traced)")
        if self.model_size not in ("tiny", "small", "medium"):
            raise ValueError(f"model_size must be tiny, small or medium, got {self.model_size!r}")
        if self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {self.preset!r}")
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.dense_mb < 0:
            raise ValueError(f"dense_mb must be >= 0, got {self.dense_mb}")
        if self.ddp_bucket_mb < 1:
            raise ValueError(f"ddp_bucket_mb must be >= 1, got {self.ddp_bucket_mb}")
        _ = self.freescale_config  # raises ValueError on an unknown method, mode or order

    @property
    def freescale_config(self) -> FreeScaleConfig:
        return FreeScaleConfig(
            balance=BalanceConfig(
                enabled=self.balance, method=self.balance_method, mode=self.balance_mode
            ),
            priority_overlap=PriorityConfig(
                enabled=self.priority_overlap, dense_order=self.dense_order
            ),
            sm_free=SMFreeConfig(enabled=self.sm_free),
            sync_gc=SyncGCConfig(enabled=self.sync_gc),
        )

    def model_config(self) -> ModelConfig:
        base = ModelConfig.preset(self.model_size)
        return ModelConfig.preset(self.model_size, wide_dim=base.wide_dim_for(self.dense_mb))

    def load_cost_model(self, model_cfg: ModelConfig) -> CostModel:
        if self.cost_model is not None:
            return CostModel.from_json(self.cost_model)
        return cost_coefficients(model_cfg)

    @property
    def profiler(self) -> ProfilerConfig:
        active = self.profile_active or self.steps - 2
        return ProfilerConfig(
            wait=1,
            warmup=1,
            active=active,
            repeat=self.profile_repeat,
            record_shapes=self.record_shapes,
        )


def main(argv: Sequence[str] | None = None) -> None:
    job = parse_args(argv)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    if not torch.cuda.is_available():
        device = torch.device("cpu")
    else:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    torch.set_num_threads(int(os.environ.get("FSOBS_THREADS_PER_RANK", 1)))
    try:
        train(job, device)
    finally:
        gc.collect()  # the model and its DDP reducer first (see examples/dlrm_freescale.py)
        dist.destroy_process_group()


def train(job: JobConfig, device: torch.device) -> None:
    """Run the job on this rank (the process group is initialized). Every FreeScale toggle goes
    through the optimizer API (``optim.FreeScale``), as in any user's loop."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(job.seed)
    model_cfg = job.model_config()
    data = SyntheticHistories(
        data_config_for(model_cfg, preset=job.preset, num_samples=job.num_samples, seed=job.seed)
    )
    fs = FreeScale(job.freescale_config, cost_model=job.load_cost_model(model_cfg))
    if rank == 0:
        write_run_json(job.out, _meta(job, world_size, device, [], "incomplete", "running", fs))
    fs.setup()
    inputs = StepInputs(
        data, global_batches(len(data), job.batch_size * world_size, job.steps, job.seed), fs
    )
    model = SeqRecModel(model_cfg, device="meta")
    dmp_kwargs = fs.dmp_kwargs(bucket_cap_mb=job.ddp_bucket_mb)
    dmp = wrap_model(model, device, dmp_kwargs=dmp_kwargs, optimizer=job.optimizer)
    optimizer = build_optimizer(dmp, optimizer=job.optimizer)
    pipeline = fs.attach(TrainPipelineSparseDist(dmp, optimizer, device))
    made: list[tuple[Batch, StepInput]] = []  # what the pipeline has taken, to score its outputs
    batches = _recorded(iter(inputs), made)
    fail = _fail_step(rank)
    with (
        fs,
        StepProfiler(job.out, rank, job.profiler, enabled=job.profile) as profiler,
        SidecarWriter(job.out, rank) as sidecar,
        StepMonitor(trace_ranges=job.profile) as monitor,
    ):
        for step in range(job.steps):
            if step == fail:
                os._exit(3)  # simulated crash: no clean-up, as after a kill
            monitor.begin()
            start = time.time_ns()
            logits = pipeline.progress(batches)  # trains batch ``step``, returns its logits
            end = time.time_ns()
            pauses = monitor.end().fields() if job.profile else {}
            batch, info = made[step]
            loss = F.binary_cross_entropy_with_logits(logits.cpu(), batch.labels.cpu())
            record = StepRecord.of(
                step,
                info.lengths,
                info.est_cost,
                start,
                end,
                loss=float(loss),
                imbalance_before=info.imbalance_before,
                imbalance_after=info.imbalance_after,
                batch_digest=info.batch_digest,
                **pauses,
            )
            sidecar.write(record)
            fs.after_step(step)
            profiler.step()
    if job.save_params:
        torch.save(local_state(dmp), job.out / f"params.rank{rank}.pt")
    hosts: list[str] = [""] * world_size
    dist.all_gather_object(hosts, socket.gethostname())
    dist.barrier()  # every rank has closed its trace and sidecar
    if rank == 0:
        meta = _meta(job, world_size, device, sorted(set(hosts)), "complete", None, fs)
        write_run_json(job.out, meta)


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


def _meta(
    job: JobConfig,
    world_size: int,
    device: torch.device,
    hosts: list[str],
    status: str,
    reason: str | None,
    fs: FreeScale,
) -> RunMeta:
    workload = {k: v for k, v in asdict(job).items() if k != "out"}
    workload["cost_model"] = str(job.cost_model) if job.cost_model else "analytic"
    complete = status == "complete"
    return RunMeta.now(
        name=job.out.name,
        world_size=world_size,
        backend="nccl" if device.type == "cuda" else "gloo",
        device=device.type,
        hosts=tuple(hosts),
        workload=workload,
        toggles={name: ToggleStatus(**t) for name, t in fs.status().items()},
        ranks_present=tuple(range(world_size)) if complete else (),
        status=status,
        reason=reason,
        process_groups=fs.layout() if complete else None,
    )


def _fail_step(rank: int) -> int:
    spec = os.environ.get(FAIL_ENV, "")
    if not spec:
        return -1
    fail_rank, _, step = spec.partition(":")
    return int(step) if int(fail_rank) == rank else -1


def parse_args(argv: Sequence[str] | None = None) -> JobConfig:
    p = argparse.ArgumentParser(description="FreeScale reference job (one rank)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--model-size", default="small", choices=["tiny", "small", "medium"])
    p.add_argument("--preset", default="lognormal", choices=sorted(PRESETS))
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank and step")
    p.add_argument("--num-samples", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-profile", dest="profile", action="store_false")
    p.add_argument("--profile-active", type=int, default=None)
    p.add_argument("--profile-repeat", type=int, default=1)
    p.add_argument("--record-shapes", action="store_true")
    p.add_argument("--balance", action="store_true")
    p.add_argument("--balance-method", default="kk", choices=list(METHODS))
    p.add_argument("--balance-mode", default="plan", choices=list(MODES))
    p.add_argument("--cost-model", type=Path, default=None)
    p.add_argument("--save-params", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--optimizer", default="adagrad", choices=OPTIMIZERS, help=argparse.SUPPRESS)
    p.add_argument("--priority-overlap", action="store_true")
    p.add_argument("--dense-order", default="after_embedding", choices=list(DENSE_ORDERS))
    p.add_argument("--sm-free", action="store_true")
    p.add_argument("--sync-gc", action="store_true")
    p.add_argument("--dense-mb", type=float, default=0.0)
    p.add_argument("--ddp-bucket-mb", type=int, default=25)
    args = p.parse_args(argv)
    return JobConfig(**vars(args))


if __name__ == "__main__":
    main()
