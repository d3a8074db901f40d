"""Run a script in fresh Python processes (determinism across processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def json_from_fresh_processes(script: str, hash_seeds: tuple[str, ...] = ("1", "2")) -> list[Any]:
    """What ``script`` prints as JSON, once per ``PYTHONHASHSEED`` (each a fresh interpreter
    with the repository on its path)."""
    outputs = []
    for hash_seed in hash_seeds:
        done = subprocess.run(
            [sys.executable, "-c", script],
            cwd=ROOT,
            env={"PYTHONPATH": str(ROOT), "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            check=True,
        )
        outputs.append(json.loads(done.stdout))
    return outputs


def torchrun_example(example: Path, *args: str, timeout: float = 400) -> None:
    """Run ``example`` on 2 local ranks with torchrun, this checkout's packages first on the
    ranks' path; assert it exits 0 (the tails of its output otherwise)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [*cmd, str(example), *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
