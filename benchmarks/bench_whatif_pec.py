"""Benchmark: the what-if's ``priority_overlap`` (torchrec's PEC) predicted from a baseline run
against the measured PEC run on the same global batches.

Per world size and seed: a baseline run (``--item-popularity 1.1``) and a PEC run
(``--priority-overlap``, same seed: the same global batches). The prediction reads only the
baseline (its trace and its sidecars' ``id_overlap``). Metrics:

- the reduction of embedding straggler wait + exposed communication per rank and step (plain
  torchrec's ``embedding`` role and every PEC role, its mask exchange included): predicted
  ``1 - replay(PEC graph) / replay(baseline graph)``, measured from the two runs' roles;
- the step-time ratio (mean over steps of the longest window): PEC / baseline.

Per seed, ``--pairs`` pairs (the baseline first on even pairs, last on odd ones); the seed's
predicted reduction is the mean of its baselines' predictions, the measured one compares the
mean over pairs of each arm's metric.

    .venv/bin/python benchmarks/bench_whatif_pec.py --world-sizes 2,4 --seeds 0,1,2 \\
        --pairs 2 --runs /tmp/pecval2
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from fsobs.analysis import Analysis, analyze_path
from fsobs.analysis.whatif.graph import build_graph
from fsobs.analysis.whatif.priority import embedding_blocked_ms, pec_overlap, prioritize
from fsobs.analysis.whatif.replay import replay

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import fsobs_run  # noqa: E402
from bench_ab import embedding_blocked  # noqa: E402


def measured_blocked(analysis: Analysis) -> float:
    """Embedding wait + exposed (PEC roles included), ms per rank and step (the A/B's
    metric, :func:`bench_ab.embedding_blocked`)."""
    return float(embedding_blocked(analysis).mean())


def step_time(table: object) -> float:
    return float(table.groupby("step")["window_ms"].max().mean())  # type: ignore[attr-defined]


def one(pairs: list[tuple[Path, Path]]) -> dict[str, float]:
    """One seed's predicted and measured figures over its pairs (baseline, PEC)."""
    got: dict[str, list[float]] = {}
    for base_dir, pec_dir in pairs:
        base, test = analyze_path(base_dir), analyze_path(pec_dir)
        graph = build_graph(base)
        overlap = pec_overlap(base.run.sidecar)
        assert overlap is not None, "the baseline's sidecars have no id_overlap"
        pec_graph, _ = prioritize(graph, overlap)
        b_pred, p_pred = embedding_blocked_ms(graph), embedding_blocked_ms(pec_graph)
        for key, value in (
            ("overlap", statistics.mean(v for v in overlap.values() if v > 0)),
            ("blocked_base_replay", b_pred),
            ("blocked_base", measured_blocked(base)),
            ("blocked_pec", measured_blocked(test)),
            ("pred", 1 - p_pred / b_pred),
            ("ratio_pred", step_time(replay(pec_graph)) / step_time(replay(graph))),
            ("step_base", step_time(base.steps)),
            ("step_pec", step_time(test.steps)),
        ):
            got.setdefault(key, []).append(value)
    out = {k: statistics.mean(v) for k, v in got.items()}
    out["meas"] = 1 - out["blocked_pec"] / out["blocked_base"]
    out["ratio_meas"] = out["step_pec"] / out["step_base"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--runs", type=Path, required=True, help="folder of the runs (reused)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--pairs", type=int, default=1)
    args = parser.parse_args()
    rows = []
    for world in map(int, args.world_sizes.split(",")):
        for seed in map(int, args.seeds.split(",")):
            pairs = []
            for pair in range(args.pairs):
                arms = [("base", []), ("pec", ["--priority-overlap"])]
                dirs = {}
                for arm, flags in arms if pair % 2 == 0 else arms[::-1]:
                    out = args.runs / f"w{world}_s{seed}_p{pair}_{arm}"
                    if not (out / "run.json").exists():
                        fsobs_run(out, [
                            f"--world-size={world}", f"--steps={args.steps}",
                            "--model-size=small", f"--seed={seed}", "--batch-size=32",
                            "--item-popularity", "1.1", *flags,
                        ])  # fmt: skip
                    dirs[arm] = out
                pairs.append((dirs["base"], dirs["pec"]))
            rows.append((world, seed, one(pairs)))
    print(
        "| ranks | seed | overlap | base ms (replay / measured) | PEC ms measured "
        "| reduction predicted | measured | error | step ratio predicted | measured |"
    )
    print("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for world, seed, r in rows:
        print(f"| {world} | {seed} | {r['overlap']:.2f} | {r['blocked_base_replay']:.2f} / "
              f"{r['blocked_base']:.2f} | {r['blocked_pec']:.2f} | {r['pred']:.1%} | "
              f"{r['meas']:.1%} | {100 * (r['pred'] - r['meas']):+.1f} pp | "
              f"{r['ratio_pred']:.3f} | {r['ratio_meas']:.3f} |")  # fmt: skip
    print()
    print(
        "| ranks | pairs | mean predicted | mean measured | error of the means "
        "| step ratio predicted | measured |"
    )
    print("|--:|--:|--:|--:|--:|--:|--:|")
    for world in sorted({w for w, _, _ in rows}):
        mine = [r for w, _, r in rows if w == world]
        mp = statistics.mean(r["pred"] for r in mine)
        mm = statistics.mean(r["meas"] for r in mine)
        rp = statistics.mean(r["ratio_pred"] for r in mine)
        rm = statistics.mean(r["ratio_meas"] for r in mine)
        print(f"| {world} | {len(mine)} | {mp:.1%} | {mm:.1%} | {100 * (mp - mm):+.1f} pp "
              f"| {rp:.3f} | {rm:.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
