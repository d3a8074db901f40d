"""``fsobs run``: the reference job on N ranks with torchrun (torch imported only to launch).

The flags are a frozen set (``tests/integration/cli/test_cli_run.py``): :func:`job_config` turns
them into
the :class:`~fsobs.workload.config.JobConfig` that the launcher writes to ``<out>/job.json`` and
the ranks read; the defaults are the config's. A new knob goes into its component's config.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from fsobs.cli.commands import COMMANDS
from fsobs.cli.common import Commands, cost_model_path, example
from fsobs.errors import FsobsError
from fsobs.runformat.files import run_files
from fsobs.runformat.names import WINDOWS_DIR
from fsobs.workload.config import MODEL_PRESETS, JobConfig, ModelSpec, data_config_for, job_profiler
from optim.balance import METHODS
from optim.config import DENSE_ORDERS, FreeScaleConfig, PriorityConfig, SMFreeConfig
from optim.plan import COUNTS, MODES, BalanceConfig
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
    cmd.add_argument("--steps", type=int, default=DEFAULT.steps)
    cmd.add_argument("--out", required=True, help="run directory to write")
    cmd.add_argument("--preset", default=DEFAULT.data.preset, help="sequence-length distribution")
    cmd.add_argument("--model-size", default=DEFAULT.model.size, choices=list(MODEL_PRESETS))
    cmd.add_argument(
        "--batch-size", type=int, default=DEFAULT.batch_size, help="samples per rank and step"
    )
    cmd.add_argument(
        "--num-samples", type=int, default=DEFAULT.data.num_samples, help="samples in the data set"
    )
    cmd.add_argument("--seed", type=int, default=DEFAULT.seed)
    cmd.add_argument(
        "--item-popularity",
        type=float,
        default=DEFAULT.data.item_popularity,
        metavar="S",
        help="Zipf exponent of the items' popularity (0: uniform; 1.1 is realistic)",
    )
    cmd.add_argument("--threads-per-rank", type=int, default=None)
    cmd.add_argument("--no-profile", action="store_true", help="train without the profiler")
    cmd.add_argument(
        "--profile-window",
        type=int,
        metavar="K",
        help="live windows of K recorded steps, each published into OUT/windows/ as it closes "
        "(fsobs watch OUT shows them; a killed job keeps those it finished; default: one "
        "window over every step, in one trace per rank)",
    )
    cmd.add_argument(
        "--profile-every",
        type=int,
        metavar="N",
        help="with --profile-window: a window every N steps (default K + 2, back to back); "
        "0 without --profile-window: no scheduled window, only what fsobs capture asks for",
    )
    cmd.add_argument(
        "--balance", action="store_true", help="balance each global batch's cost across ranks"
    )
    cmd.add_argument(
        "--balance-method",
        choices=METHODS,
        help="partitioner for --balance (default: kk, Karmarkar-Karp)",
    )
    cmd.add_argument(
        "--balance-mode",
        choices=MODES,
        help="plan: every rank plans from the lengths; shuffle: all-gather the costs and "
        "exchange samples (default: plan)",
    )
    cmd.add_argument(
        "--balance-counts",
        choices=COUNTS,
        help="samples per rank: equal, or unequal with each rank's loss rescaled (default: "
        "the method's own: equal for kk, unequal for lpt)",
    )
    cmd.add_argument(
        "--balance-window",
        type=int,
        metavar="K",
        help="deal the samples of K consecutive global batches into K steps (needs unequal "
        "counts and plan mode; default 1: each global batch alone)",
    )
    cmd.add_argument(
        "--cost-model", metavar="FILE", help="cost model JSON for --balance (fsobs fit-cost)"
    )
    cmd.add_argument(
        "--priority-overlap",
        action="store_true",
        help="embedding collectives on a process group of their own (high-priority stream on "
        "NCCL), the dense all-reduce on another",
    )
    cmd.add_argument(
        "--dense-order",
        choices=DENSE_ORDERS,
        help="with --priority-overlap: after_embedding (default: each step's dense buckets "
        "wait for its backward embedding all-to-all), or concurrent",
    )
    cmd.add_argument(
        "--sm-free",
        action="store_true",
        help="embedding all-to-all on the GPU copy engines (NCCL >= 2.28, one node); elsewhere "
        "recorded as not applied, with the reason",
    )
    cmd.add_argument(
        "--sync-gc",
        action="store_true",
        help="automatic garbage collection off; every rank collects the young generation at "
        "the same steps (every 10)",
    )
    cmd.add_argument(
        "--dense-mb",
        type=float,
        default=DEFAULT.model.dense_mb,
        help="add a dense block of about this many MiB to the model (a large dense all-reduce)",
    )
    cmd.add_argument(
        "--ddp-bucket-mb",
        type=int,
        default=DEFAULT.ddp_bucket_mb,
        help="DDP bucket size of the dense all-reduce (default: torchrec's 25)",
    )
    cmd.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,  # keeps `fsobs -v run ...` working
        help="stream every rank's output to the console instead of the progress bar",
    )
    cmd.add_argument("rdzv", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    cmd.set_defaults(handler=_run)


def job_config(args: argparse.Namespace) -> JobConfig:
    """The job that ``fsobs run`` trains, from its flags. Checks the options that need another
    one and the cost model file (its path made absolute); a bad value raises FsobsError."""
    for flag, value in (
        ("--balance-method", args.balance_method),
        ("--balance-mode", args.balance_mode),
        ("--balance-counts", args.balance_counts),
        ("--balance-window", args.balance_window),
    ):
        if value is not None and not args.balance:
            raise FsobsError(f"{flag} needs --balance")
    cost_model = None if args.cost_model is None else cost_model_path(args.cost_model)
    if args.dense_order is not None and not args.priority_overlap:
        raise FsobsError("--dense-order needs --priority-overlap")
    for flag, value in (
        ("--profile-window", args.profile_window),
        ("--profile-every", args.profile_every),
    ):
        if value is not None and args.no_profile:
            raise FsobsError(f"{flag} needs the profiler (not --no-profile)")
    try:
        model = ModelSpec(size=args.model_size, dense_mb=args.dense_mb)
        data = data_config_for(
            model.config(),
            preset=args.preset,
            num_samples=args.num_samples,
            seed=args.seed,
            item_popularity=args.item_popularity,
        )
        return JobConfig(
            steps=args.steps,
            batch_size=args.batch_size,
            model=model,
            data=data,
            profiler=job_profiler(
                args.steps,
                window=args.profile_window,
                every=args.profile_every,
                enabled=not args.no_profile,
            ),
            freescale=_freescale(args),
            cost_model=cost_model,
            ddp_bucket_mb=args.ddp_bucket_mb,
        )
    except ValueError as exc:  # the configs name the field
        raise FsobsError(f"bad job option: {exc}") from None


def _freescale(args: argparse.Namespace) -> FreeScaleConfig:
    """The toggles; an option not given keeps its config's default."""
    balance, overlap = DEFAULT.freescale.balance, DEFAULT.freescale.priority_overlap
    return FreeScaleConfig(
        balance=BalanceConfig(
            enabled=args.balance,
            method=args.balance_method or balance.method,
            mode=args.balance_mode or balance.mode,
            counts=args.balance_counts,
            window=balance.window if args.balance_window is None else args.balance_window,
        ),
        priority_overlap=PriorityConfig(
            enabled=args.priority_overlap, dense_order=args.dense_order or overlap.dense_order
        ),
        sm_free=SMFreeConfig(enabled=args.sm_free),
        sync_gc=SyncGCConfig(enabled=args.sync_gc),
    )


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
