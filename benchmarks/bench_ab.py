"""Benchmark: A/B of FreeScale toggles on the reference job, same global batches, N pairs.

Each pair runs every arm once (control first on even pairs, last on odd ones, so that a drift
of the machine does not favour one arm: ``fsobs.workload.pairs``, which ``make demo`` uses
too), with the same seed, so every arm trains the same
global batches; each run is analyzed with fsobs. Per arm against the control it reports the
median over pairs and a 95% bootstrap CI over the pooled steps of every pair (steps paired with
the control's same step of the same pair) of:

- the reduction of embedding exposed communication per step (``by_role``: what
  ``priority_overlap`` is for);
- the reduction of straggler wait and of the whole bubble;
- the step-time change (``1 - mean step time test / control``: positive = faster);

and per arm the causes of the straggler wait (data, GC, preemption, unexplained: medians over
the pairs of each cause's share).

    .venv/bin/python benchmarks/bench_ab.py --world-sizes 2,4 --pairs 3 \\
        --common "--dense-mb 16" --arm concurrent="--priority-overlap" \\
        --arm after_embedding="--priority-overlap --dense-order after_embedding"
    .venv/bin/python benchmarks/bench_ab.py --control="--balance" \\
        --arm sync_gc="--balance --sync-gc"

``--job seqrec`` runs ``examples/seqrec_dataloader.py`` (torchrun) instead of the reference job,
``--job ranker`` ``examples/ranker_candidates.py`` (a loop without a pipeline, a loss over
candidates);
``--whatif`` adds, for every arm named after a toggle, ``fsobs whatif``'s prediction of its
bubble reduction from each pair's control run (the median over pairs) beside the measured one:

    .venv/bin/python benchmarks/bench_ab.py --job seqrec --world-sizes 2 --pairs 3 --steps 12 \\
        --whatif --arm balance="--balance" --arm priority_overlap="--priority-overlap"

An arm's leading ``NAME=VALUE`` words are environment variables of its runs, e.g. the balance
plans made on the training thread (``fsobs.workload.train.PLAN_AHEAD_ENV``):

    .venv/bin/python benchmarks/bench_ab.py --control="--balance" \\
        --arm in_place="FSOBS_PLAN_AHEAD=0 --balance"
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fsobs.analysis import Analysis, analyze_path
from fsobs.analysis.comparison.ab import bootstrap_reduction
from fsobs.analysis.stragglers.causes import CAUSES
from fsobs.analysis.whatif.predict import TOGGLES
from fsobs.workload.pairs import pair_order, predicted_reductions
from optim.markers import EMBEDDING_ROLES

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import ROOT, fsobs_run, run_checked  # noqa: E402

EXAMPLES = {
    "seqrec": ROOT / "examples" / "seqrec_dataloader.py",
    "ranker": ROOT / "examples" / "ranker_candidates.py",
}

METRICS = {
    "embedding wait + exposed": lambda a: embedding_blocked(a),
    "embedding exposed comm": lambda a: _role(a, "embedding", "exposed_comm_ms"),
    "embedding straggler wait": lambda a: _role(a, "embedding", "straggler_wait_ms"),
    "straggler wait": lambda a: a.steps.groupby("step")["straggler_wait_ms"].mean(),
    "bubble": lambda a: a.steps.groupby("step")["bubble_ms"].mean(),
    "step time": lambda a: a.steps.groupby("step")["window_ms"].max(),
}


def embedding_blocked(analysis: Analysis) -> pd.Series:
    """Straggler wait + exposed communication per step in embedding collectives: plain
    torchrec's (``embedding``) and PEC's (every ``pec_*`` role, its mask exchange included)."""
    roles = analysis.roles
    mine = roles[roles["role"].isin(EMBEDDING_ROLES)]
    blocked = mine["straggler_wait_ms"] + mine["exposed_comm_ms"]
    per_rank = blocked.groupby([mine["step"], mine["rank"]]).sum()
    return per_rank.groupby(level="step").mean()


def _role(analysis: Analysis, role: str, column: str) -> pd.Series:
    roles = analysis.roles[analysis.roles["role"] == role]
    return roles.groupby("step")[column].mean()


@dataclass
class Arm:
    name: str
    flags: list[str]
    env: dict[str, str]

    @classmethod
    def parse(cls, name: str, words: str) -> Arm:
        """An arm from its command-line words: leading ``NAME=VALUE`` ones are its environment."""
        flags = shlex.split(words)
        env = {}
        while flags and "=" in flags[0] and not flags[0].startswith("-"):
            key, _, value = flags.pop(0).partition("=")
            env[key] = value
        return cls(name, flags, env)

    @property
    def words(self) -> str:
        """The arm as it was given: its environment, then its flags."""
        return shlex.join([*(f"{k}={v}" for k, v in self.env.items()), *self.flags])


def run(out: Path, world: int, args: argparse.Namespace, arm: Arm) -> Analysis:
    common = [
        f"--steps={args.steps}", f"--seed={args.seed}", f"--batch-size={args.batch_size}",
        *shlex.split(args.common), *arm.flags,
    ]  # fmt: skip
    env = os.environ | arm.env
    if args.job in EXAMPLES:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        launch = [*torchrun, f"--nproc-per-node={world}", str(EXAMPLES[args.job]), f"--out={out}"]
        run_checked([*launch, *common], run_dir=out, env=env)
    else:
        flags = [f"--world-size={world}", f"--model-size={args.model_size}", *common]
        fsobs_run(out, flags, env=env)
    return analyze_path(out)


def predicted(pairs: list[dict], arm: str) -> str:
    """``fsobs whatif``'s predicted bubble reduction of the toggle ``arm`` from each pair's
    control run: the median over pairs and each pair's (or why there is none)."""
    if arm not in TOGGLES:
        return "n/a"
    values = []
    for pair in pairs:
        value = predicted_reductions(pair["control"], [(arm,)], draws=20)[(arm,)]
        values += [] if value is None else [value]
    if not values:
        return "none"
    each = ", ".join(f"{v:.0%}" for v in values)
    return f"{statistics.median(values):.1%} ({each})"


def measure(tmp: Path, world: int, args: argparse.Namespace, arms: list[Arm]) -> list[dict]:
    pairs = []
    for index in range(args.pairs):
        result = {arm.name: run(tmp / f"w{world}-{arm.name}-{index}", world, args, arm)
                  for arm in pair_order(arms, index)}  # fmt: skip
        line = ", ".join(
            f"{name} emb exposed {METRICS['embedding exposed comm'](a).mean():.1f} "
            f"step {METRICS['step time'](a).mean():.0f} ms"
            for name, a in result.items()
        )
        print(f"  world {world} pair {index}: {line}", file=sys.stderr)
        pairs.append(result)
    return pairs


def summarize(world: int, pairs: list[dict], control: str, arm: str) -> list[str]:
    rows = []
    for metric, of in METRICS.items():
        c = [of(p[control]) for p in pairs]
        t = [of(p[arm]) for p in pairs]
        points = [
            1 - b.mean() / a.mean() if a.mean() > 0 else np.nan for a, b in zip(c, t, strict=True)
        ]
        common = [a.index.intersection(b.index) for a, b in zip(c, t, strict=True)]
        pooled_c = np.concatenate([a[i].to_numpy() for a, i in zip(c, common, strict=True)])
        pooled_t = np.concatenate([b[i].to_numpy() for b, i in zip(t, common, strict=True)])
        lo, hi = bootstrap_reduction(pooled_c, pooled_t, paired=True, n_boot=4000)
        rows.append(
            f"| {world} | {arm} | {metric} | {statistics.median(a.mean() for a in c):.2f} -> "
            f"{statistics.median(b.mean() for b in t):.2f} | {statistics.median(points):.1%} "
            f"| {lo:.1%} – {hi:.1%} | {', '.join(f'{p:.0%}' for p in points)} |"
        )
    return rows


def causes_rows(world: int, pairs: list[dict]) -> list[str]:
    """Per arm, the medians over pairs of each cause's share of the straggler wait
    (fsobs.analysis.stragglers.causes) and of the straggler wait itself."""
    rows = []
    for arm in pairs[0]:
        found = [p[arm].causes for p in pairs if p[arm].causes is not None]
        wait = statistics.median(METRICS["straggler wait"](p[arm]).mean() for p in pairs)
        if not found:
            rows.append(f"| {world} | {arm} | {wait:.1f} | unknown | | | |")
            continue
        shares = [statistics.median(c.shares[k] for c in found) for k in CAUSES]
        rows.append(
            f"| {world} | {arm} | {wait:.1f} | " + " | ".join(f"{v:.0%}" for v in shares) + " |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", choices=["reference", *EXAMPLES], default="reference")
    parser.add_argument("--whatif", action="store_true", help="what-if's prediction per toggle")
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--model-size", default="small")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--common", default="", help="flags of every arm, e.g. '--dense-mb 16'")
    parser.add_argument(
        "--control", default="", help="the control arm's own flags (default: none, the baseline)"
    )
    parser.add_argument(
        "--arm", action="append", default=[], metavar="NAME=FLAGS", help="a test arm (repeat)"
    )
    args = parser.parse_args(argv)
    arms = [Arm.parse("control", args.control)] + [
        Arm.parse(name, words) for name, _, words in (a.partition("=") for a in args.arm)
    ]
    rows, causes, predictions = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for world in (int(w) for w in args.world_sizes.split(",")):
            pairs = measure(Path(tmp), world, args, arms)
            for arm in arms[1:]:
                rows += summarize(world, pairs, "control", arm.name)
                if args.whatif:
                    predictions.append(f"| {world} | {arm.name} | {predicted(pairs, arm.name)} |")
            causes += causes_rows(world, pairs)
    print(
        f"job {args.job}, model {args.model_size}, {args.batch_size} samples/rank/step, "
        f"{args.steps} steps "
        f"{args.steps} steps "
        f"(traced: all but 2), seed {args.seed}, common flags '{args.common}'; "
        f"{args.pairs} pairs; arms: "
        + "; ".join(
            f"{a.name}: '{shlex.join([*(f'{k}={v}' for k, v in a.env.items()), *a.flags])}'"
            for a in arms
        )
    )
    print("| ranks | arm | metric (ms per step) | control -> arm (median) | reduction (median) "
          "| 95% CI (pooled steps) | per pair |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print(
        "| ranks | arm | straggler wait ms/step (median) | data | gc | preemption | unexplained |"
    )
    print("|---|---|---|---|---|---|---|")
    print("\n".join(causes))
    if predictions:
        print()
        print("| ranks | arm | what-if: bubble reduction predicted from the control (median) |")
        print("|---|---|---|")
        print("\n".join(predictions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
