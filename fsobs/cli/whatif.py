"""``fsobs whatif`` (each toggle predicted from one run) and ``fsobs simulate`` (N ranks)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsobs.analysis.whatif.predict import TOGGLES, whatif
from fsobs.analysis.whatif.splits import KK, SPLITS, BalanceSplit
from fsobs.cli.commands import COMMANDS
from fsobs.cli.common import (
    Commands,
    add_load_options,
    analyze_with_progress,
    console,
    cost_model_path,
    example,
    load_config,
)
from fsobs.errors import FsobsError
from fsobs.report import render_whatif, whatif_json
from fsobs.runformat.names import WINDOWS_DIR
from fsobs.runformat.windows import WindowSchedule, window_dir, window_id
from fsobs.trace import LoadConfig
from optim.balance import METHODS, CostModel
from optim.plan import COUNTS

if TYPE_CHECKING:
    from fsobs.simulate.simulator import SimConfig, SimWindows


def _toggle_list(text: str) -> tuple[str, ...]:
    names = tuple(t.strip().replace("-", "_") for t in text.split(",") if t.strip())
    unknown = [t for t in names if t not in TOGGLES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown toggle(s) {unknown}, expected some of {','.join(TOGGLES)}"
        )
    return names


def _balance_split(text: str) -> BalanceSplit:
    try:
        return BalanceSplit.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_whatif(commands: Commands) -> None:
    cmd = commands.add_parser(
        "whatif",
        help=COMMANDS["whatif"].help,
        description="Replays the run's segment graph (per rank and step, compute between the "
        "matched collectives) with each toggle applied; every number is a prediction with an "
        "interval over resampled steps and residual noise.",
        epilog=example("fsobs whatif out/demo/baseline-0 --toggles balance,sm_free --json"),
    )
    cmd.add_argument("run", metavar="RUN", help="the baseline run directory")
    cmd.add_argument(
        "--toggles",
        type=_toggle_list,
        default=TOGGLES,
        help="comma-separated toggles; every combination of them is predicted "
        "(default: %(default)s)",
    )
    cmd.add_argument(
        "--balance-split",
        type=_balance_split,
        metavar="|".join(SPLITS),
        help="the balance toggle's mode: kk (equal counts, default), lpt (unequal counts), "
        "kk-unequal, or window:K (K consecutive global batches dealt into K steps)",
    )
    cmd.add_argument("--json", action="store_true", help="print one JSON object")
    cmd.add_argument("--draws", type=int, default=200, help="noise draws (default: %(default)s)")
    cmd.add_argument("--seed", type=int, default=0, help="of the draws (default: %(default)s)")
    cmd.add_argument(
        "--cost-model", metavar="FILE", help="the balancer's cost model (default: the run's own)"
    )
    add_load_options(cmd)
    cmd.set_defaults(handler=_whatif)


def _whatif(args: argparse.Namespace) -> int:
    if args.draws < 1:
        raise FsobsError(f"--draws must be >= 1, got {args.draws}")
    if args.balance_split is not None and "balance" not in args.toggles:
        raise FsobsError("--balance-split needs the balance toggle (--toggles balance,...)")
    model = CostModel.from_json(cost_model_path(args.cost_model)) if args.cost_model else None
    analysis = analyze_with_progress(args.run, load_config(args))
    result = whatif(
        analysis,
        args.toggles,
        draws=args.draws,
        seed=args.seed,
        balance_split=args.balance_split or KK,
        cost_model=model,
    )
    if args.json:
        print(json.dumps(whatif_json(result), indent=2, allow_nan=False))
    else:
        render_whatif(result, console())
    return 0


def add_simulate(commands: Commands) -> None:
    cmd = commands.add_parser(
        "simulate",
        help=COMMANDS["simulate"].help,
        description="Writes per-rank GPU traces, step sidecars, run.json (simulated: true) and "
        "truth.json (the true bubble classes of every rank and step) into OUT.",
        epilog=example(
            "fsobs simulate --world-size 256 --steps 20 --calibrate out/demo/baseline-0 "
            "--toggles balance --out out/sim256"
        ),
    )
    cmd.add_argument("--world-size", type=int, required=True)
    cmd.add_argument("--steps", type=int, default=20)
    cmd.add_argument("--out", required=True, help="run directory to write")
    cmd.add_argument(
        "--calibrate",
        metavar="RUN",
        help="take cost model, noise, lengths and transfers from "
        "this measured run (default: a GPU-like job)",
    )
    cmd.add_argument("--toggles", type=_toggle_list, default=(), help="policies to simulate")
    cmd.add_argument(
        "--balance-method",
        choices=METHODS,
        help="partitioner of the balance policy (default: kk, Karmarkar-Karp)",
    )
    cmd.add_argument(
        "--balance-counts",
        choices=COUNTS,
        help="equal or unequal sample counts per rank (default: the method's: kk equal, "
        "lpt unequal)",
    )
    cmd.add_argument(
        "--balance-window",
        type=int,
        metavar="K",
        help="global batches the balance policy plans together (default: 1; K > 1 needs "
        "unequal counts)",
    )
    cmd.add_argument("--seed", type=int, default=0)
    cmd.add_argument("--workers", type=int, default=None, help="writer processes (default: CPUs)")
    _add_degradation(cmd)
    cmd.set_defaults(handler=_simulate)


_DEGRADATION = {
    "slow_rank": (int, "R", "a rank whose compute slows (a slower node)"),
    "slow_from": (int, "S", "the step it slows from (default: 0)"),
    "slow_factor": (float, "F", "its compute times this factor"),
    "shift_from": (int, "S", "a data shift from this step: longer samples"),
    "shift_factor": (float, "F", "the samples' lengths times this factor"),
    "shift_rank": (int, "R", "the rank whose samples grow (default: every rank)"),
    "gc_rank": (int, "R", "a rank with a GC pause in every step"),
    "gc_from": (int, "S", "the step the pauses start from (default: 0)"),
    "gc_ms": (float, "MS", "the pause per step"),
}
"""``SimConfig``'s degradation fields, each a flag (``--slow-rank`` ...): type, metavar, help."""


def _add_degradation(cmd: argparse.ArgumentParser) -> None:
    group = cmd.add_argument_group("degradation from a known step (recorded in truth.json)")
    for name, (kind, metavar, text) in _DEGRADATION.items():
        group.add_argument("--" + name.replace("_", "-"), type=kind, metavar=metavar, help=text)
    live = cmd.add_argument_group("the live layout: windows/w<step>/, as a scheduled job's")
    live.add_argument(
        "--window-every", type=int, metavar="N", help="a window every N steps, after a warm-up step"
    )
    live.add_argument("--window-steps", type=int, metavar="K", help="of K steps (K < N)")
    live.add_argument(
        "--unpublished",
        type=_step_rank,
        action="append",
        default=[],
        metavar="STEP:RANK",
        help="the window from STEP that RANK leaves unpublished (repeatable)",
    )


def _step_rank(text: str) -> tuple[int, int]:
    step, sep, rank = text.partition(":")
    if not sep or not step.isdigit() or not rank.isdigit():
        raise argparse.ArgumentTypeError(f"expected STEP:RANK, got {text!r}")
    return int(step), int(rank)


def _windows(args: argparse.Namespace) -> SimWindows | None:
    """The live layout from ``--window-every``/``--window-steps``/``--unpublished``."""
    from fsobs.simulate.simulator import SimWindows

    if args.window_every is None and args.window_steps is None:
        if args.unpublished:
            raise FsobsError("--unpublished needs --window-every and --window-steps")
        return None
    if args.window_every is None or args.window_steps is None:
        raise FsobsError("--window-every and --window-steps go together")
    try:
        schedule = WindowSchedule(
            every=args.window_every, wait=0, warmup=1, active=args.window_steps
        )
        return SimWindows(schedule=schedule, unpublished=tuple(args.unpublished))
    except ValueError as exc:  # WindowSchedule and SimWindows name the field
        raise FsobsError(f"bad simulate option: {exc}") from None


def _balance(args: argparse.Namespace) -> dict[str, Any]:
    """``SimConfig``'s balance fields from the flags given (they need ``--toggles balance``)."""
    given = {
        "balance_method": args.balance_method,
        "balance_counts": args.balance_counts,
        "balance_window": args.balance_window,
    }
    chosen = {k: v for k, v in given.items() if v is not None}
    if chosen and "balance" not in args.toggles:
        flags = ", ".join("--" + k.replace("_", "-") for k in chosen)
        raise FsobsError(f"{flags} needs --toggles balance")
    return chosen


def _simulate(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from fsobs.simulate.simulator import SimConfig, calibrate, simulate, write_run
    from fsobs.simulate.study import kpis

    if args.world_size < 2 or args.steps < 1:
        raise FsobsError("--world-size must be >= 2 and --steps >= 1")
    balance = _balance(args)
    degradation = {k: getattr(args, k) for k in _DEGRADATION if getattr(args, k) is not None}
    windows = _windows(args)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise FsobsError("the output directory is not empty", path=out)
    if args.calibrate:
        base = calibrate(analyze_with_progress(args.calibrate, LoadConfig()))
    else:
        base = SimConfig()
    try:
        cfg = replace(
            base,
            world_size=args.world_size,
            steps=args.steps,
            seed=args.seed,
            **balance,
            **degradation,
        )
        if windows is not None:
            windows.check(cfg)
    except ValueError as exc:  # SimConfig and SimWindows name the field
        raise FsobsError(f"bad simulate option: {exc}") from None
    sched = simulate(cfg, args.toggles)
    write_run(sched, out, workers=args.workers, windows=windows)
    k = kpis(sched)
    target = out if windows is None else window_dir(out, windows.spans(cfg.steps)[0][0])
    toggles = [
        f"balance ({cfg.balance(enabled=True).method}, {cfg.balance(enabled=True).counts} counts, "
        f"window {cfg.balance_window})"
        if t == "balance"
        else t
        for t in args.toggles
    ]
    print(
        f"wrote {out}: simulated, {args.world_size} ranks x {args.steps} steps, toggles: "
        f"{', '.join(toggles) or 'none'} ({cfg.source})\n"
        f"{_degradation_line(cfg, windows)}"
        f"truth: bubble {k['bubble_ratio']:.1%} of step time, {k['bubble_ms_per_step']:.2f} ms "
        f"per rank and step (straggler wait {k['straggler_wait_ms_per_step']:.2f}, exposed comm "
        f"{k['exposed_comm_ms_per_step']:.2f}, host idle {k['host_idle_ms_per_step']:.2f}); "
        f"analyze it with: fsobs analyze {target}"
    )
    return 0


def _degradation_line(cfg: SimConfig, windows: SimWindows | None) -> str:
    """What degrades and the layout, one line ending in a newline; empty when neither."""
    parts = []
    slow, shift, gc = (cfg.degradation()[k] for k in ("slow", "shift", "gc"))
    if slow:
        parts.append(
            f"rank {slow['rank']} {slow['factor']:g}x slower from step {slow['from_step']}"
        )
    if shift:
        who = "every rank" if shift["rank"] is None else f"rank {shift['rank']}"
        parts.append(f"{who}'s samples {shift['factor']:g}x longer from step {shift['from_step']}")
    if gc:
        parts.append(
            f"rank {gc['rank']} pauses {gc['gc_ms']:g} ms for GC from step {gc['from_step']}"
        )
    if windows is not None:
        parts.append(
            f"windows of {windows.schedule.active} steps every {windows.schedule.every} in "
            f"{WINDOWS_DIR}/"
            + "".join(
                f", rank {r} leaves {window_id(s)} unpublished" for s, r in windows.unpublished
            )
        )
    return "; ".join(parts) + "\n" if parts else ""
