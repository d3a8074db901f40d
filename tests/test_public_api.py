"""The public API is small and explicit; the torch-free parts import without torch."""

from __future__ import annotations

import subprocess
import sys

import fsobs
import fsobs.analysis
import fsobs.report


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


def test_errors_are_value_errors():
    assert issubclass(fsobs.FsobsError, ValueError)
    assert issubclass(fsobs.DuplicateRankError, fsobs.RunError)


def test_torch_free_packages_import_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import fsobs, fsobs.trace, fsobs.analysis, fsobs.cli, fsobs.report\n"
        "import optim, optim.balance, optim.plan, fsobs.simulate, dashboard.figures\n"
        "assert 'torchrec' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
