"""Rich display in Jupyter: the HTML behind ``Capture._repr_html_``, ``Site._repr_html_`` and
``Explanation._repr_html_``. Every string from a capture is escaped (the Jinja2 template
``templates/display.html.j2`` autoescapes the headings, pandas' ``to_html`` with ``escape=True`` writes
the tables), so a token ``<script>`` shows as text."""

from __future__ import annotations

import functools

import pandas as pd

SITE_FIELDS = ["name", "stack", "layer", "kind", "num_heads", "num_kv_heads", "d_head", "query_len", "key_len"]
SITES_SHOWN = 12
ROWS_SHOWN = 12


@functools.cache
def _templates():
    """The display macros (``templates/display.html.j2``, package data), autoescaping every value."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("inspector.store", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    return env.get_template("display.html.j2").module


def _table(df: pd.DataFrame):
    from markupsafe import Markup

    return Markup(df.to_html(index=False, escape=True, border=0, float_format=lambda x: f"{x:.4f}", classes="inspector"))


def capture_html(capture) -> str:
    """The model, the kind of capture, its inputs and its first sites."""
    m = capture.meta.get("model", {})
    inputs = pd.DataFrame([{"role": r.role, "batch": r.batch, "tokens": len(r.ids),
                            "text": r.text if len(r.text) <= 80 else r.text[:80] + "…"} for r in capture.inputs])
    sites = pd.DataFrame([{k: getattr(s, k) for k in SITE_FIELDS} for s in capture.sites[:SITES_SHOWN]], columns=SITE_FIELDS)
    kind = capture.storage()
    return str(_templates().capture(m.get("name", "?"), m.get("class", "?"), kind, len(capture.sites), capture.batch_size,
                                    _table(inputs), _table(sites), len(capture.sites) - SITES_SHOWN))


def site_html(site) -> str:
    """One site's fields as a one-row table."""
    row = pd.DataFrame([{k: getattr(site, k) for k in SITE_FIELDS}
                        | {"parts": ", ".join(site.parts), "scaling": site.scaling}])
    return str(_templates().site(site.name, _table(row)))


def explanation_html(exp) -> str:
    """The step-by-step table (first rows, contributions shortened) and the output vector's start; at a
    site stored as weights only, the weights table and the note saying why there are no steps."""
    t = exp.table.head(ROWS_SHOWN).copy()
    if not exp.steps:  # a site stored as weights only: the weights, and the note saying why there are no steps
        return str(_templates().explanation(exp, _table(t), len(exp.table) - ROWS_SHOWN, None))
    t["contribution"] = ["[" + ", ".join(f"{x:.4f}" for x in c[:4]) + (", …]" if len(c) > 4 else "]") for c in t["contribution"]]
    out = ", ".join(f"{x:.4f}" for x in exp.output[:8]) + (", …" if len(exp.output) > 8 else "")
    return str(_templates().explanation(exp, _table(t), len(exp.table) - ROWS_SHOWN, out))


def word_explanation_html(exp) -> str:
    """A word's explanation: the query, the aggregate row split judges (its heaviest keys), the verdict when
    referents were given, and each query row's step-by-step table folded (``<details>``)."""
    from markupsafe import Markup

    agg = exp.aggregate.sort_values("weight", ascending=False, kind="stable").head(ROWS_SHOWN)
    verdict = None
    if exp.verdict:
        verdict = _table(pd.DataFrame([{k: v for k, v in exp.verdict.items() if not isinstance(v, (list, dict))}]))
    rows = [(e, Markup(explanation_html(e))) for e in exp.rows]
    positions = ", ".join(str(p) for p in exp.query_positions)
    return str(_templates().word_explanation(exp, positions, _table(agg), len(exp.aggregate) - len(agg), verdict, rows))
