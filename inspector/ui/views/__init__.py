"""Data for the app's views: a capture in, small DataFrames, arrays or HTML strings out.

Pure helpers behind ``apps/app.py`` (no Streamlit here), so the app script holds UI code only and
these can be tested and reused on their own. Every function reads only the rows it shows: a window
of query rows, one query's row, one query and one key vector, never a whole ``[query, key]``
matrix of a long input. Every public name of the submodules is re-exported here (``views.md_text``):

* :mod:`~inspector.ui.views.labels`: names of sites, heads and tokens, token-search labels, sites grouped by
  stack and kind, a capture's strings as literal Markdown (:func:`md_text`);
* :mod:`~inspector.ui.views.windows`: the query rows and keys a heatmap shows around a query, a metric's colour domain;
* :mod:`~inspector.ui.views.frames`: the views' DataFrames (Overview grid, heatmap rows, a query's row, Q/K/V,
  step by step, split bars) and the CLI's CSV bytes;
* :mod:`~inspector.ui.views.shading`: a key text shaded by weight, as pieces and as HTML; the Jinja2 templates;
* :mod:`~inspector.ui.views.bertviz`: bertviz's head and model views, offline, escaped and sandboxed;
* :mod:`~inspector.ui.views.limits`: the app's bound on recomputed weights and its one-line error messages.
"""

from inspector.analysis.heads import head_label  # the one head name (analysis: the verdict names heads too)
from inspector.ui.views.bertviz import (
    BERTVIZ_MAX_HEADS,
    BERTVIZ_MAX_TOKENS,
    BERTVIZ_MAX_WEIGHTS,
    FIT_WIDTH,
    MODEL_VIEW_MAX_TOKENS,
    MODEL_VIEW_MAX_WEIGHTS,
    VENDOR_FILES,
    bertviz_html,
    bertviz_kwargs,
    bertviz_weights,
    check_bertviz,
    default_vendor_dir,
    html_size,
    offline_bertviz,
    sandboxed,
    script_safe_json,
    vendor_scripts,
)
from inspector.ui.views.frames import (
    GRID_METRICS,
    csv_bytes,
    explain_frame,
    grid_frame,
    heatmap_frame,
    qkv_frame,
    query_row,
    query_weights,
    split_bars,
    visible_frame,
)
from inspector.ui.views.labels import (
    group_label,
    groups,
    md_text,
    search_labels,
    site_label,
    site_short,
    token_label,
)
from inspector.ui.views.limits import (
    APP_MAX_HEAD_DIM,
    APP_MAX_RECOMPUTED,
    app_error,
    check_app_work,
    check_head_dims,
    recomputed_weights,
)
from inspector.ui.views.shading import (
    Shade,
    shade_alpha,
    shade_pieces,
    shade_segments,
    shaded_html,
    templates,
)
from inspector.ui.views.windows import (
    causal_keys,
    focus_window,
    heatmap_positions,
    heatmap_windows,
    metric_domain,
    window,
    window_to,
)

__all__ = [
    "APP_MAX_HEAD_DIM",
    "APP_MAX_RECOMPUTED",
    "BERTVIZ_MAX_HEADS",
    "BERTVIZ_MAX_TOKENS",
    "BERTVIZ_MAX_WEIGHTS",
    "FIT_WIDTH",
    "GRID_METRICS",
    "MODEL_VIEW_MAX_TOKENS",
    "MODEL_VIEW_MAX_WEIGHTS",
    "VENDOR_FILES",
    "Shade",
    "app_error",
    "bertviz_html",
    "bertviz_kwargs",
    "bertviz_weights",
    "causal_keys",
    "check_app_work",
    "check_bertviz",
    "check_head_dims",
    "csv_bytes",
    "default_vendor_dir",
    "explain_frame",
    "focus_window",
    "grid_frame",
    "group_label",
    "groups",
    "head_label",
    "heatmap_frame",
    "heatmap_positions",
    "heatmap_windows",
    "html_size",
    "md_text",
    "metric_domain",
    "offline_bertviz",
    "qkv_frame",
    "query_row",
    "query_weights",
    "recomputed_weights",
    "sandboxed",
    "script_safe_json",
    "search_labels",
    "shade_alpha",
    "shade_pieces",
    "shade_segments",
    "shaded_html",
    "site_label",
    "site_short",
    "split_bars",
    "templates",
    "token_label",
    "vendor_scripts",
    "visible_frame",
    "window",
    "window_to",
]
