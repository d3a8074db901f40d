"""Run a script in fresh Python processes (determinism across processes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


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
