"""Write a synthetic multi-rank NCCL GPU run (:func:`fsobs.simulate.write_gpu_run`) to a folder.

The load generator behind the benchmarks' synthetic runs, from the command line::

    .venv/bin/python benchmarks/gen_synthetic.py OUT --ranks 8 --steps 5 --mb 100

The same arguments always give byte-identical files.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from fsobs.simulate import write_gpu_run


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="output directory")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--mb", type=float, default=None, help="uncompressed MB per rank")
    parser.add_argument("--kernels-per-step", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-gzip", action="store_true")
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args(argv)
    target = int(args.mb * 1e6) if args.mb else None
    paths = write_gpu_run(
        args.out,
        num_ranks=args.ranks,
        num_steps=args.steps,
        kernels_per_step=args.kernels_per_step,
        target_bytes_per_rank=target,
        seed=args.seed,
        gzip=not args.no_gzip,
        workers=args.workers,
    )
    total = sum(p.stat().st_size for p in paths)
    print(f"wrote {len(paths)} traces to {args.out} ({total / 1e6:.1f} MB on disk)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
