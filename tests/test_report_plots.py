"""The report's bar charts: inline SVG whose bars carry exactly the split and comparison tables' numbers."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from inspector.ui import report_plots

from helpers.report import REFS

BAR = re.compile(r'aria-label="([^"]*)"')


def bars(svg: str) -> list[dict[str, str]]:
    """Each bar's fields from its aria-label (``field: value; ...``), axes and legends left out."""
    out = []
    for label in BAR.findall(svg):
        if label.startswith(("X-axis", "Y-axis", "Symbol legend")) or "; " not in label:
            continue
        out.append(dict(part.split(": ", 1) for part in label.split("; ")))
    return out


def section(html: str, cls: str) -> str:
    start = html.index(f'<div class="plot {cls}">')
    return html[start:html.index("</svg>", start)]


def test_referent_bars_are_the_split_weights(legal):
    got = bars(section(legal["html"], "referent-plot"))
    split = legal["split"].head(10)
    assert len(got) == len(split) * len(REFS)
    want = {(report_plots._label(r), ref): r[f"weight:{ref}"] for r in split.to_dict("records") for ref in REFS}
    for b in got:
        assert float(b["weight on the referent"]) == pytest.approx(want[(b["head"], b["referent"])], abs=1e-12)


def test_comparison_bars_pair_original_and_variant(legal):
    got = bars(section(legal["html"], "compare-plot"))
    comp = legal["comparison"]
    top = comp.reindex(comp["change"].abs().sort_values(ascending=False, kind="stable").index).head(10)
    assert len(got) == 2 * len(top)
    by_head: dict[str, dict[str, float]] = {}
    for b in got:
        by_head.setdefault(b["head"], {})[b["capture"]] = float(b["split score"])
    for r in top.to_dict("records"):
        pair = by_head[report_plots._label(r)]
        assert pair == pytest.approx({"original": r["split_score:original"], "swapped": r["split_score:swapped"]}, abs=1e-12)


def test_compare_captures_columns_are_understood():
    df = pd.DataFrame({"site": ["a", "b"], "stack": ["none"] * 2, "kind": ["self", "cross"], "layer": [1, 2], "head": [3, 4],
                       "split_score[original]": [0.1, 0.5], "split_score[quoted]": [0.4, 0.1], "split_change": [0.3, -0.4]})
    long = report_plots.comparison_frame(df, 10)
    assert long["head"].tolist() == ["L2 H4 cross", "L2 H4 cross", "L1 H3", "L1 H3"]  # largest change first
    assert long["capture"].tolist() == ["original", "quoted"] * 2
    assert long["split_score"].tolist() == [0.5, 0.1, 0.1, 0.4]
    assert report_plots.comparison_bars(df.iloc[:0]) == ""
