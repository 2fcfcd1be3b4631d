"""Rich display in Jupyter: the HTML behind ``Capture._repr_html_``, ``Site._repr_html_`` and
``Explanation._repr_html_``. Every string from a capture is escaped (``html.escape`` for the headings,
pandas' ``to_html`` with ``escape=True`` for the tables), so a token ``<script>`` shows as text."""

from __future__ import annotations

import html

import pandas as pd

SITE_FIELDS = ["name", "stack", "layer", "kind", "num_heads", "num_kv_heads", "d_head", "query_len", "key_len"]
SITES_SHOWN = 12
ROWS_SHOWN = 12


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _table(df: pd.DataFrame) -> str:
    return df.to_html(index=False, escape=True, border=0, float_format=lambda x: f"{x:.4f}", classes="inspector")


def capture_html(capture) -> str:
    """The model, the kind of capture, its inputs and its first sites."""
    m = capture.meta.get("model", {})
    inputs = pd.DataFrame([{"role": r.role, "batch": r.batch, "tokens": len(r.ids),
                            "text": r.text if len(r.text) <= 80 else r.text[:80] + "…"} for r in capture.inputs])
    sites = pd.DataFrame([{k: getattr(s, k) for k in SITE_FIELDS} for s in capture.sites[:SITES_SHOWN]], columns=SITE_FIELDS)
    more = len(capture.sites) - SITES_SHOWN
    return (f"<div><strong>inspector Capture</strong> of <code>{_e(m.get('name', '?'))}</code> ({_e(m.get('class', '?'))}): "
            f"{'lazy (weights recomputed from Q and K)' if capture.lazy else 'with weights'}, {len(capture.sites)} sites, "
            f"batch {capture.batch_size}" + _table(inputs) + _table(sites)
            + (f"<p>… and {more} more sites</p>" if more > 0 else "") + "</div>")


def site_html(site) -> str:
    """One site's fields as a one-row table."""
    row = pd.DataFrame([{k: getattr(site, k) for k in SITE_FIELDS}
                        | {"parts": ", ".join(site.parts), "scaling": site.scaling}])
    return f"<div><strong>inspector Site</strong> <code>{_e(site.name)}</code>{_table(row)}</div>"


def explanation_html(exp) -> str:
    """The step-by-step table (first rows, contributions shortened) and the output vector's start."""
    t = exp.table.head(ROWS_SHOWN).copy()
    t["contribution"] = ["[" + ", ".join(f"{x:.4f}" for x in c[:4]) + (", …]" if len(c) > 4 else "]") for c in t["contribution"]]
    more = len(exp.table) - ROWS_SHOWN
    out = ", ".join(f"{x:.4f}" for x in exp.output[:8]) + (", …" if len(exp.output) > 8 else "")
    return (f"<div><strong>inspector Explanation</strong>: <code>{_e(exp.site)}</code> head {exp.head}, "
            f"query {exp.query_index} <code>{_e(exp.query_token)}</code>, scaling {exp.scaling:.6g}"
            + (f", softcap {exp.softcap}" if exp.softcap else "") + _table(t)
            + (f"<p>… and {more} more keys</p>" if more > 0 else "")
            + f"<p>output = [{out}] (d_v = {len(exp.output)})</p></div>")


def word_explanation_html(exp) -> str:
    """A word's explanation: the query, the aggregate row split judges (its heaviest keys), the verdict when
    referents were given, and each query row's step-by-step table folded (``<details>``)."""
    agg = exp.aggregate.sort_values("weight", ascending=False, kind="stable").head(ROWS_SHOWN)
    more = len(exp.aggregate) - len(agg)
    verdict = ""
    if exp.verdict:
        shown = {k: v for k, v in exp.verdict.items() if not isinstance(v, (list, dict))}
        verdict = "<p>verdict (as <code>split</code>):</p>" + _table(pd.DataFrame([shown]))
    rows = "".join(f"<details><summary>query row {e.query_index} <code>{_e(e.query_token)}</code></summary>"
                   f"{explanation_html(e)}</details>" for e in exp.rows)
    return (f"<div><strong>inspector WordExplanation</strong>: <code>{_e(exp.site)}</code> head {exp.head}, query "
            f"<code>{_e(exp.query)}</code> at {_e(', '.join(str(p) for p in exp.query_positions))} "
            f"({_e(exp.weighting)} weights)<p>mean of the query rows' weights, heaviest keys:</p>" + _table(agg)
            + (f"<p>… and {more} more keys</p>" if more > 0 else "") + verdict + rows + "</div>")
