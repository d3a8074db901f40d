"""``fsobs run``: the reference job on N ranks with torchrun (torch imported only to launch).

The flags are a frozen set (``tests/integration/cli/test_cli_run.py``), generated from the
fields of the configs that :class:`~fsobs.workload.config.JobConfig` composes (their types,
defaults and docstrings: :mod:`fsobs.cli.flags`); :func:`job_config` turns them into the job that
the launcher writes to ``<out>/job.json`` and the ranks read. A new knob goes into its
component's config.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from fsobs.cli.commands import COMMANDS
from fsobs.cli.common import Commands, cost_model_path, example
from fsobs.cli.flags import Section, add_section, section_values
from fsobs.errors import FsobsError
from fsobs.runformat.files import run_files
from fsobs.runformat.names import WINDOWS_DIR
from fsobs.workload.config import JobConfig, ModelSpec, data_config_for, job_profiler
from fsobs.workload.data import DataConfig
from optim.config import TOGGLES, FreeScaleConfig, PriorityConfig, SMFreeConfig
from optim.plan import BalanceConfig
from optim.sync_gc import SyncGCConfig

DEFAULT = JobConfig()
"""The job of ``fsobs run`` without flags: the flags' defaults."""


def add_run(commands: Commands) -> None:
    cmd = commands.add_parser(
        "run",
        help=COMMANDS["run"].help,
        description="Extra torchrun flags for multi-node runs go after '--' "
        "(e.g. -- --nnodes 2 --node-rank 0 --rdzv-endpoint host:29500). Each rank's output "
        "goes to OUT/logs/rank<R>.log; the console shows one progress bar.",
        epilog=example("fsobs run --world-size 2 --steps 20 --out out/demo/balanced --balance"),
    )
    cmd.add_argument("--world-size", type=int, required=True, help="ranks on this node")
    cmd.add_argument("--out", required=True, help="run directory to write")
    cmd.add_argument("--threads-per-rank", type=int, default=None)
    add_section(cmd, _JOB, "the job (JobConfig)")
    add_section(cmd, _MODEL, "the model (ModelSpec)")
    add_section(cmd, _DATA, "the data (DataConfig)")
    profiler = cmd.add_argument_group("the profiler (job_profiler)")
    profiler.add_argument("--no-profile", action="store_true", help="train without the profiler")
    profiler.add_argument(
        "--profile-window",
        type=int,
        metavar="K",
        help="live windows of K recorded steps, each published into OUT/windows/ as it closes "
        "(fsobs watch OUT shows them; a killed job keeps those it finished; default: one "
        "window over every step, in one trace per rank)",
    )
    profiler.add_argument(
        "--profile-every",
        type=int,
        metavar="N",
        help="with --profile-window: a window every N steps (default K + 2, back to back); "
        "0 without --profile-window: no scheduled window, only what fsobs capture asks for",
    )
    for name, section in zip(TOGGLES, _TOGGLES, strict=True):
        add_section(cmd, section, f"the {name} toggle ({section.config.__name__})")
    cmd.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,  # keeps `fsobs -v run ...` working
        help="stream every rank's output to the console instead of the progress bar",
    )
    cmd.add_argument("rdzv", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    cmd.set_defaults(handler=_run)


_JOB = Section(
    JobConfig,
    {
        "steps": "--steps",
        "batch_size": "--batch-size",
        "cost_model": "--cost-model",
        "ddp_bucket_mb": "--ddp-bucket-mb",
    },
)
_MODEL = Section(ModelSpec, {"size": "--model-size", "dense_mb": "--dense-mb"})
_DATA = Section(
    DataConfig,
    {
        "preset": "--preset",
        "num_samples": "--num-samples",
        "seed": "--seed",
        "item_popularity": "--item-popularity",
    },
)
_TOGGLES = (
    Section(
        BalanceConfig,
        {
            "enabled": "--balance",
            "method": "--balance-method",
            "mode": "--balance-mode",
            "counts": "--balance-counts",
            "window": "--balance-window",
        },
        toggle="enabled",
    ),
    Section(
        PriorityConfig,
        {"enabled": "--priority-overlap", "dense_order": "--dense-order"},
        toggle="enabled",
    ),
    Section(SMFreeConfig, {"enabled": "--sm-free"}),
    Section(SyncGCConfig, {"enabled": "--sync-gc"}),
)
"""The flags of ``fsobs run``'s configs (``--world-size``, ``--out``, ``--threads-per-rank``
are the launcher's, the ``--profile-*`` ones :func:`~fsobs.workload.config.job_profiler`'s)."""


def job_config(args: argparse.Namespace) -> JobConfig:
    """The job that ``fsobs run`` trains, from its flags: each section's config made from the
    flags given, its own defaults for the others. Checks the options that need another one
    and the cost model file (its path made absolute); a bad value raises FsobsError."""
    balance, overlap, sm_free, sync_gc = (section_values(args, s) for s in _TOGGLES)
    job = section_values(args, _JOB)
    if "cost_model" in job:
        job["cost_model"] = cost_model_path(job["cost_model"])
    for flag, value in (
        ("--profile-window", args.profile_window),
        ("--profile-every", args.profile_every),
    ):
        if value is not None and args.no_profile:
            raise FsobsError(f"{flag} needs the profiler (not --no-profile)")
    try:
        model = ModelSpec(**section_values(args, _MODEL))
        data = data_config_for(model.config(), **section_values(args, _DATA))
        profiler = job_profiler(
            job.get("steps", DEFAULT.steps),
            window=args.profile_window,
            every=args.profile_every,
            enabled=not args.no_profile,
        )
        freescale = FreeScaleConfig(
            balance=BalanceConfig(**balance),
            priority_overlap=PriorityConfig(**overlap),
            sm_free=SMFreeConfig(**sm_free),
            sync_gc=SyncGCConfig(**sync_gc),
        )
        return JobConfig(**job, model=model, data=data, profiler=profiler, freescale=freescale)
    except ValueError as exc:  # the configs name the field
        raise FsobsError(f"bad job option: {exc}") from None


def _run(args: argparse.Namespace) -> int:
    job = job_config(args)  # before torch is imported: bad flags fail fast
    from fsobs.workload.launch import LaunchConfig, check_out, failure_report, launch, log_dir

    rdzv = tuple(a for a in args.rdzv if a != "--")
    config = LaunchConfig(
        world_size=args.world_size,
        out=Path(args.out),
        threads_per_rank=args.threads_per_rank,
        rdzv=rdzv,
        job=job,
    )
    check_out(config.out)  # before the first line: a refusal is the only one
    verbose = bool(getattr(args, "verbose", False))
    print(
        f"fsobs run: {args.world_size} rank(s) on this node; their output: {log_dir(config.out)}/",
        file=sys.stderr,
    )
    code = launch(config, verbose=verbose)
    if code < 0:
        print(
            f"fsobs: error: {args.out}: stopped by {signal.Signals(-code).name}; torchrun and "
            f"every rank stopped, the run is marked incomplete; {what_can_be_analyzed(config.out)}",
            file=sys.stderr,
        )
        return 128 - code
    if code != 0:
        print(
            f"fsobs: error: {args.out}: the job failed (torchrun exit code {code}); the run is "
            f"marked incomplete; {what_can_be_analyzed(config.out)}\n"
            f"{failure_report(config.out)}",
            file=sys.stderr,
        )
        return 1
    if run_files(Path(args.out)).windows is not None:
        print(f"wrote {args.out}; {_live_windows(Path(args.out))}")
    else:
        print(f"wrote {args.out}; analyze it with: fsobs analyze {args.out}")
    return 0


def what_can_be_analyzed(out: Path) -> str:
    """What the run in ``out`` holds for the analyzer, in a few words: the steps that every
    rank with a trace recorded, and the ranks without one (it loads the traces)."""
    from fsobs.trace.loader import load_run

    files = run_files(out)
    if files.windows is not None:
        return _live_windows(out)
    if not files.traces:
        return "nothing can be analyzed (no rank left a trace)"
    try:
        run = load_run(out)
    except FsobsError as exc:
        return f"nothing can be analyzed ({exc.detail})"
    ranks = ", ".join(map(str, run.rank_ids))
    if not run.steps:
        return f"nothing can be analyzed (the traces of rank(s) {ranks} share no step)"
    text = f"fsobs analyze {out} reads steps {_spans(run.steps)} of rank(s) {ranks}"
    missing = sorted(set(range(run.world_size)) - set(run.rank_ids))
    if missing:
        text += f" (no trace from rank(s) {', '.join(map(str, missing))})"
    return text


def _live_windows(out: Path) -> str:
    """What a live run's windows hold: those every rank published, each a run of its own."""
    from fsobs.live.state import LiveConfig, LiveRun

    state = LiveRun(out, LiveConfig(index=False)).poll()
    whole = state.closed_windows
    if not whole:
        return "nothing can be analyzed (no window was published by every rank)"
    steps = [s for w in whole for s in range(w.first_step, w.last_step + 1)]
    return (
        f"fsobs watch {out} --once lists its {len(whole)} published window(s) (steps "
        f"{_spans(steps)}); fsobs analyze {out / WINDOWS_DIR / whole[-1].wid} reads the last"
    )


def _spans(steps: list[int]) -> str:
    """Sorted step numbers as ranges: ``2-3, 6-7``."""
    spans: list[list[int]] = []
    for step in steps:
        if spans and step == spans[-1][1] + 1:
            spans[-1][1] = step
        else:
            spans.append([step, step])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
