"""The public API is small and explicit; the torch-free parts import without torch."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fsobs
import fsobs.analysis
import fsobs.report
import fsobs.simulate
import fsobs.workload
import optim
from fsobs import errors

ROOT = Path(__file__).resolve().parents[3]


def test_exported_members():
    assert sorted(fsobs.__all__) == sorted(
        [
            "Analysis",
            "BubbleConfig",
            "Comparison",
            "DuplicateRankError",
            "EmptyRunError",
            "FsobsError",
            "LoadConfig",
            "MissingRankError",
            "RankTrace",
            "Run",
            "RunError",
            "TraceFormatError",
            "TraceReadError",
            "WorldSizeMismatchError",
            "analyze",
            "analyze_path",
            "compare",
            "load_rank",
            "load_run",
        ]
    )
    new = {"Comparison", "CostFit", "WhatIf", "compare", "fit_cost", "fit_points", "whatif"}
    assert new <= set(fsobs.analysis.__all__)
    for name in fsobs.__all__ + fsobs.analysis.__all__ + fsobs.report.__all__:
        assert not name.startswith("_")


def test_reports_live_in_report_not_in_analysis():
    """The JSON objects and text reports of analyze, compare and whatif are fsobs.report's;
    fsobs.analysis computes and never renders."""
    assert sorted(fsobs.report.__all__) == [
        "ALLTOALL_COLUMNS",  # the all-to-all table's column names, the dashboard's too
        # the Bubbles page's first view words what the text report words
        "EMBEDDING_TOTAL_NOTE",
        "NextStep",
        "WHOLE_TRACE_NOTE",
        "applied_already",
        "capture_findings",  # the line a graph-capture trace leads with, the dashboard's too
        "causes_unknown_line",
        "compare_json",
        "dominant_class",
        "findings",
        "next_step",
        "render",
        "render_comparison",
        "render_whatif",
        "to_json",
        "toggles_line",
        "whatif_json",
    ]
    assert not set(fsobs.report.__all__) & set(fsobs.analysis.__all__)


def test_optim_exported_members():
    assert sorted(optim.__all__) == sorted(
        [
            "MAX_COST_MODEL_BYTES",
            "METHODS",
            "MODES",
            "REDUCTIONS",
            "BalanceConfig",
            "BalancedBatchSampler",
            "BatchShare",
            "CostModel",
            "FieldError",
            "FreeScale",
            "FreeScaleConfig",
            "PipelineBatch",
            "PipelineModel",
            "PriorityConfig",
            "SMFreeConfig",
            "ShareCollate",
            "ShareDataset",
            "ShareLoader",
            "StepPlan",
            "StepShare",
            "SyncGCConfig",
            "ToggleStatus",
            "imbalance",
            "loss_weight",
            "partition",
        ]
    )
    pytest.importorskip("torch")  # FreeScale and StepShare load optim.freescale
    for name in optim.__all__:
        assert not name.startswith("_")
        assert getattr(optim, name) is not None, name


@pytest.mark.parametrize("package", [optim, fsobs.simulate, fsobs.workload])
def test_lazy_names_are_listed_and_unknown_ones_raise(package):
    assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        package.nope  # noqa: B018


def test_a_lazy_name_is_loaded_once_and_kept():
    from fsobs.simulate.simulator import SimConfig

    assert fsobs.simulate.SimConfig is SimConfig
    assert vars(fsobs.simulate)["SimConfig"] is SimConfig  # later lookups skip __getattr__


def test_errors_are_value_errors():
    assert issubclass(fsobs.FsobsError, ValueError)
    assert issubclass(fsobs.DuplicateRankError, fsobs.RunError)


def test_every_error_is_in_the_error_module_and_drawn_in_its_tree():
    defined = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.FsobsError)
    }
    assert {"ClusterError", "ExportError", "LaunchError"} <= defined
    assert defined == {"FsobsError", *re.findall(r"\+-- (\w+)", errors.__doc__ or "")}


def test_the_error_module_imports_the_standard_library_only():
    tree = ast.parse(Path(errors.__file__).read_text(encoding="utf-8"))
    imported = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


def test_torch_free_packages_import_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import fsobs, fsobs.trace, fsobs.analysis, fsobs.cli, fsobs.report\n"
        "import optim, optim.balance, optim.plan, fsobs.simulate, dashboard.figures\n"
        "assert 'torchrec' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


PUBLIC_MODULES = (
    "fsobs",
    "fsobs.analysis",
    "fsobs.cli",
    "fsobs.export",
    "fsobs.live",
    "fsobs.report",
    "fsobs.runformat",
    "fsobs.simulate",
    "fsobs.storage",
    "fsobs.trace",
    "fsobs.workload",
    "optim",
)
"""The modules whose ``__all__`` is the API that code outside fsobs and optim imports."""


def private_imports(source: str) -> list[str]:
    """``module.name`` of every import of fsobs or optim in ``source`` that is not a name in
    the ``__all__`` of one of :data:`PUBLIC_MODULES` (or, for ``import X``, not one of them)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _OURS:
            module = node.module or ""
            public = importlib.import_module(module).__all__ if module in PUBLIC_MODULES else ()
            found += [f"{module}.{a.name}" for a in node.names if a.name not in public]
        elif isinstance(node, ast.Import):
            found += [
                a.name
                for a in node.names
                if a.name.split(".")[0] in _OURS and a.name not in PUBLIC_MODULES
            ]
    return found


_OURS = ("fsobs", "optim")


def test_private_imports_names_deep_and_unlisted_imports_only():
    source = (
        "import fsobs\n"
        "import fsobs.trace.loader\n"
        "from fsobs.trace import GZIP_MAGIC, load_run\n"
        "from fsobs.trace._decode import GZIP_MAGIC\n"
        "from fsobs.runformat import SidecarWriter, sidecar_files\n"
        "def f():\n"
        "    from optim.balance import CostModel\n"
        "import pandas\n"
    )
    assert private_imports(source) == [
        "fsobs.trace.loader",
        "fsobs.trace._decode.GZIP_MAGIC",
        "fsobs.runformat.sidecar_files",
        "optim.balance.CostModel",
    ]


def test_the_dashboard_imports_fsobs_and_optim_through_their_public_apis():
    dashboard = ROOT / "dashboard"
    found = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted(dashboard.rglob("*.py"))
        for name in private_imports(path.read_text(encoding="utf-8"))
    ]
    assert found == []
    preload = ast.parse((dashboard / "serve.py").read_text(encoding="utf-8"))
    (modules,) = [
        ast.literal_eval(node.value)
        for node in ast.walk(preload)
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "PRELOAD"
    ]
    assert [m for m in modules if m.split(".")[0] in _OURS and m not in PUBLIC_MODULES] == []


@pytest.mark.parametrize("module", sorted(set(PUBLIC_MODULES) - {"optim", "fsobs.workload"}))
def test_every_public_name_is_there(module):
    """(optim's and fsobs.workload's torch-backed names are checked above.)"""
    package = importlib.import_module(module)
    for name in package.__all__:
        assert not name.startswith("_")
        assert hasattr(package, name), name


def test_lazy_names_shadow_their_namesake_subpackage_whatever_is_imported_first():
    code = (
        "import sys\n"
        "import fsobs.analysis, fsobs.report\n"
        "assert 'pandas' not in sys.modules  # the names load on first use\n"
        "import fsobs.analysis.whatif.bounds\n"
        "from fsobs.analysis import whatif\n"
        "from fsobs.analysis.whatif.predict import whatif as predicted\n"
        "assert whatif is predicted and fsobs.analysis.whatif is predicted\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[3])
