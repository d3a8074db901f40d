"""``fsobs whatif`` (each toggle predicted from one run) and ``fsobs simulate`` (N ranks)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

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
from fsobs.cli.flags import Section, add_section, section_values
from fsobs.errors import FsobsError
from fsobs.report import render_whatif, whatif_json
from fsobs.runformat.names import WINDOWS_DIR
from fsobs.runformat.windows import WindowSchedule, window_dir, window_id
from fsobs.simulate.config import SimConfig
from fsobs.trace import LoadConfig
from optim.balance import CostModel
from optim.plan import BalanceConfig

if TYPE_CHECKING:
    from fsobs.simulate.simulator import SimWindows


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
    cmd.add_argument("--world-size", type=int, required=True, help="ranks simulated")
    cmd.add_argument("--out", required=True, help="run directory to write")
    cmd.add_argument(
        "--calibrate",
        metavar="RUN",
        help="take cost model, noise, lengths and transfers from "
        "this measured run (default: a GPU-like job)",
    )
    cmd.add_argument("--toggles", type=_toggle_list, default=(), help="policies to simulate")
    cmd.add_argument("--workers", type=int, default=None, help="writer processes (default: CPUs)")
    add_section(cmd, _SIMULATED, "the simulated job (SimConfig)")
    add_section(cmd, _BALANCE, "the balance policy, with --toggles balance (BalanceConfig)")
    add_section(cmd, _DEGRADATION, "degradation from a known step (recorded in truth.json)")
    _add_windows(cmd)
    cmd.set_defaults(handler=_simulate)


_BALANCE = Section(
    BalanceConfig,
    {"method": "--balance-method", "counts": "--balance-counts", "window": "--balance-window"},
)
"""The balance policy's flags (the simulator plans: no ``--balance-mode``)."""
_SIMULATED = Section(SimConfig, {"steps": "--steps", "seed": "--seed"})
_DEGRADATION = Section(
    SimConfig,
    {
        name: "--" + name.replace("_", "-")
        for name in (
            *("slow_rank", "slow_from", "slow_factor"),
            *("shift_from", "shift_factor", "shift_rank"),
            *("gc_rank", "gc_from", "gc_ms"),
        )
    },
)
"""``SimConfig``'s degradation fields, each a flag (``--slow-rank`` ...)."""


def _add_windows(cmd: argparse.ArgumentParser) -> None:
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


def _balance(args: argparse.Namespace) -> BalanceConfig | None:
    """The balance policy from its flags (they need ``--toggles balance``); None: none given."""
    given = section_values(args, _BALANCE)
    if given and "balance" not in args.toggles:
        flags = ", ".join(_BALANCE.flags[k] for k in given)
        raise FsobsError(f"{flags} needs --toggles balance")
    try:
        return BalanceConfig(**given) if given else None
    except ValueError as exc:  # BalanceConfig names the field
        raise FsobsError(f"bad simulate option: {exc}") from None


def _simulate(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from fsobs.simulate.simulator import calibrate, simulate, write_run
    from fsobs.simulate.study import kpis

    if args.world_size < 2 or (args.steps is not None and args.steps < 1):
        raise FsobsError("--world-size must be >= 2 and --steps >= 1")
    balance = _balance(args)
    given = section_values(args, _SIMULATED) | section_values(args, _DEGRADATION)
    windows = _windows(args)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise FsobsError("the output directory is not empty", path=out)
    if args.calibrate:
        base = calibrate(analyze_with_progress(args.calibrate, LoadConfig()))
    else:
        base = SimConfig()
    try:
        cfg = replace(base, world_size=args.world_size, **given)
        if balance is not None:
            cfg = replace(cfg, balance=balance)
        if windows is not None:
            windows.check(cfg)
    except ValueError as exc:  # SimConfig and SimWindows name the field
        raise FsobsError(f"bad simulate option: {exc}") from None
    sched = simulate(cfg, args.toggles)
    write_run(sched, out, workers=args.workers, windows=windows)
    k = kpis(sched)
    target = out if windows is None else window_dir(out, windows.spans(cfg.steps)[0][0])
    policy = cfg.balance
    toggles = [
        f"balance ({policy.method}, {policy.counts} counts, window {policy.window})"
        if t == "balance"
        else t
        for t in args.toggles
    ]
    print(
        f"wrote {out}: simulated, {cfg.world_size} ranks x {cfg.steps} steps, toggles: "
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
