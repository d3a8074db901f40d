"""``FSOBS_PIN_CORES``: a rank's threads, the ones it had and the ones it starts, run on one core
(checked in a fresh process, so the suite's own affinity is untouched)."""

from __future__ import annotations

import os
import subprocess
import sys

CODE = """
import os, threading
from fsobs.workload.train import pin_to_one_core
before = threading.Thread(target=lambda: ready.wait())
ready = threading.Event()
before.start()
core = pin_to_one_core(LOCAL_RANK)
seen = {}
after = threading.Thread(target=lambda: seen.update(after=os.sched_getaffinity(0)))
after.start(); after.join()
tids = [int(t) for t in os.listdir("/proc/self/task")]
every = {frozenset(os.sched_getaffinity(t)) for t in tids}
ready.set(); before.join()
print(core, sorted(seen["after"]), sorted(map(sorted, every)))
"""


def test_every_thread_of_the_rank_runs_on_its_core() -> None:
    cores = sorted(os.sched_getaffinity(0))
    for local_rank in (0, 1, len(cores)):
        code = CODE.replace("LOCAL_RANK", str(local_rank))
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split(maxsplit=1)
        core = cores[local_rank % len(cores)]  # the rank's core: LOCAL_RANK modulo the cores
        assert int(out[0]) == core
        assert out[1].strip() == f"[{core}] [[{core}]]"
