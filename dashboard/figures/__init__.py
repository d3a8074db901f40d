"""Plotly figures as plain functions: DataFrames (or dicts) in, ``go.Figure`` out, each titled.

No Streamlit here, so every figure is tested on its trace data
(``tests/unit/dashboard/test_figures.py``).
"""

from dashboard.figures._style import title_in_template
from dashboard.figures.bubbles import (
    all_to_all_matrix,
    bubble_classes_by_rank,
    classes_over_steps,
    data_attribution,
    hta_temporal_breakdown,
    step_timeline,
    straggler_steps,
    straggler_wait_heatmap,
)
from dashboard.figures.compare import (
    bubble_reduction,
    class_means,
    op_diff_top,
    per_rank_delta,
    step_time_distribution,
)
from dashboard.figures.live import bubble_ratio_by_window, classes_by_window, step_time_trend
from dashboard.figures.optimizer import balance_bars, cost_fit, imbalance_over_steps
from dashboard.figures.whatif import scale_curve, toggles_at_scale, whatif_reductions

__all__ = [
    "all_to_all_matrix",
    "balance_bars",
    "bubble_classes_by_rank",
    "bubble_ratio_by_window",
    "bubble_reduction",
    "class_means",
    "classes_by_window",
    "classes_over_steps",
    "cost_fit",
    "data_attribution",
    "hta_temporal_breakdown",
    "imbalance_over_steps",
    "op_diff_top",
    "per_rank_delta",
    "scale_curve",
    "step_time_distribution",
    "step_time_trend",
    "step_timeline",
    "straggler_steps",
    "straggler_wait_heatmap",
    "title_in_template",
    "toggles_at_scale",
    "whatif_reductions",
]
