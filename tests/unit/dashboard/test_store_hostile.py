"""The Runs page over a store holding what would hang it or end it in a traceback.

A FIFO named ``run.json`` or ``steps.rank0.jsonl`` (opening one waits for a writer forever),
and a run folder nobody may read (``chmod 000``; as root, who is denied nothing, the page runs
as ``nobody`` through ``setpriv``): the page renders, and the run's row says why in one line.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.support.stores import APP, GLOO_REFERENCE, ROOT

NOBODY = 65534
ROWS = """
import json
from streamlit.testing.v1 import AppTest
at = AppTest.from_file(%r, default_timeout=60).run()
assert not at.exception, at.exception
print(json.dumps(at.dataframe[0].value[["run", "problem"]].values.tolist()))
"""


def _problems(at: AppTest) -> dict[str, str]:
    assert not at.exception, at.exception
    return dict(at.dataframe[0].value[["run", "problem"]].values.tolist())


@pytest.mark.parametrize("name", ["run.json", "steps.rank0.jsonl"])
def test_a_fifo_in_a_run_does_not_hang_the_runs_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
):
    store = tmp_path / "store"
    run = Path(shutil.copytree(GLOO_REFERENCE, store / "fifo"))
    (run / name).unlink(missing_ok=True)
    os.mkfifo(run / name)
    monkeypatch.setenv("FSOBS_STORE", str(store))
    at = AppTest.from_file(APP, default_timeout=60).run()  # a hang fails after 60 s
    problem = _problems(at)["fifo"]
    assert problem == f"fifo/{name}: cannot read file: not a regular file (a FIFO)"


def test_an_unreadable_run_folder_is_one_line_on_the_runs_page():
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: chmod 000 denies root nothing")
        prefix = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
    with tempfile.TemporaryDirectory() as scratch:
        store = Path(scratch) / "store"
        Path(scratch).chmod(0o755)  # nobody may go in
        shutil.copytree(GLOO_REFERENCE, store / "readable")
        locked = Path(shutil.copytree(GLOO_REFERENCE, store / "locked"))
        for folder in (store, *store.rglob("*")):
            folder.chmod(0o777 if folder.is_dir() else 0o666)  # nobody writes the cache
        locked.chmod(0)
        try:
            done = subprocess.run(
                [*prefix, sys.executable, "-c", ROWS % APP],
                capture_output=True,
                text=True,
                timeout=180,
                cwd=ROOT,
                env=os.environ | {"FSOBS_STORE": str(store), "HOME": scratch},
            )
        finally:
            locked.chmod(stat.S_IRWXU)
    assert done.returncode == 0, done.stderr
    rows = dict(json.loads(done.stdout.splitlines()[-1]))
    assert rows == {
        "locked": "locked: cannot list this folder: Permission denied",
        "readable": "",
    }
