"""The public API is small and explicit; the torch-free parts import without torch."""

from __future__ import annotations

import ast
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
        "capture_findings",  # the line a graph-capture trace leads with, the dashboard's too
        "compare_json",
        "findings",
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
            "METHODS",
            "MODES",
            "REDUCTIONS",
            "BalanceConfig",
            "BalancedBatchSampler",
            "BatchShare",
            "CostModel",
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
