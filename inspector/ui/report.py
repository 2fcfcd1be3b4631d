"""A self-contained HTML report of one split-head investigation.

:func:`render_report` is pure: a capture and the DataFrames of :func:`~inspector.analysis.split_heads`
and :func:`~inspector.analysis.rank_heads` in, one HTML document out (the caller writes it). The
document loads nothing: inline CSS, HTML-table heatmaps, the system font stack and a
Content-Security-Policy that forbids every fetch, so it opens the same offline and in a mail.

Per shown head: the referents' weights as bars; a query x key heatmap (a window of at most
:data:`LIMIT` x :data:`LIMIT` cells around the query and referents; colour = weight / largest weight
shown; each cell's exact float32 weight in ``data-w``); and the query's weights shaded over the key
texts (opacity = weight, a multi-token query averages its rows), with the head's chance and lift,
its query rows' own split scores and, when most of the split sits on token pieces both referents
share, a note saying so. Then, for the top head, a table of every query row and the aggregate row
``split`` judges, and explain() of the row that drives the flag; the split and rank tables (with how
the heads were ranked), one sentence per flagged head and variant saying whether the variant moved
its split down, up or not at all, the comparison of variants, and the commands that reproduce the run.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from inspector.analysis import spans
from inspector.analysis.explain import explain
from inspector.analysis.heads import head_weights, referent_split
from inspector.analysis.moves import move_sentence
from inspector.errors import InspectorError
from inspector.store.capture_file import Capture, Site
from inspector.ui import views

__all__ = ["render_report"]

LIMIT = 64  # heatmap rows and columns at most
SPLIT_ROWS = 40  # split table rows shown (flagged rows always)
RANK_ROWS = 15
COMPARE_ROWS = 40
VECTOR_SHOWN = 4  # contribution entries shown per row

CSS = """
:root{--ink:#1f2328;--mut:#59636e;--line:#d0d7de;--soft:#f6f8fa;--heat:29,78,216;--shade:234,120,20}
*{box-sizing:border-box}
body{margin:0 auto;max-width:1200px;padding:24px 28px 56px;color:var(--ink);background:#fff;
font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
h1{font-size:22px;margin:0 0 6px}h2{font-size:17px;margin:34px 0 10px;padding-bottom:4px;border-bottom:1px solid var(--line)}
h3{font-size:15px;margin:0 0 10px}h4{font-size:13px;margin:14px 0 6px;color:var(--mut);font-weight:600}
code,pre,.mono,.hm th,.chip,.steps td:nth-child(2){font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"Liberation Mono",monospace}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:8px 0}dl.kv dt{color:var(--mut)}dl.kv dd{margin:0}
.summary{font-size:15px;background:var(--soft);border-left:4px solid rgb(var(--shade));padding:10px 14px;margin:16px 0}
.note{color:var(--mut);font-size:12.5px;margin:4px 0}
.card{border:1px solid var(--line);border-radius:6px;padding:14px 18px;margin:16px 0}
.tag{display:inline-block;font-size:11px;padding:0 6px;border-radius:9px;background:rgb(var(--shade));color:#fff;margin-left:6px;vertical-align:2px}
.scroll{overflow:auto;max-width:100%}
table.data{border-collapse:collapse;font-size:12.5px;margin:6px 0}
.data th,.data td{padding:3px 9px;border-bottom:1px solid #eaeef2;text-align:left;white-space:nowrap}
.data th{background:var(--soft);font-weight:600}
.num{text-align:right!important;font-variant-numeric:tabular-nums}
.data tr.flag td{background:#fff1e0}.data tr.ref td{background:#eef3ff}.data tr.top td{font-weight:600}
table.bars td{padding:2px 10px 2px 0;border:0}
.bar{display:inline-block;width:180px;height:10px;background:#eaeef2;border-radius:2px;vertical-align:middle}
.bar>i{display:block;height:100%;background:rgb(var(--shade));border-radius:2px}
table.hm{border-collapse:collapse;font-size:10px;line-height:1}
.hm td{width:13px;min-width:13px;height:13px;padding:0;border:1px solid #fff;background:rgba(var(--heat),var(--a))}
.hm thead th{writing-mode:vertical-rl;transform:rotate(180deg);text-align:left;font-weight:400;padding:3px 0;
max-height:92px;overflow:hidden;white-space:nowrap}
.hm tbody th{text-align:right;font-weight:400;padding:0 6px 0 0;white-space:nowrap;max-width:140px;overflow:hidden}
.hm .q,.note .q{color:rgb(var(--shade));font-weight:700}.hm .r,.note .r{color:rgb(var(--heat));font-weight:700}
.hm .gap{border-left:3px solid var(--ink)}.hm tr.gap td,.hm tr.gap th{border-top:3px solid var(--ink)}
.legend{display:inline-block;width:120px;height:10px;vertical-align:middle;border:1px solid var(--line);
background:linear-gradient(90deg,rgba(var(--heat),0),rgba(var(--heat),1))}
.src{font-size:14px;line-height:2.1;padding:8px 12px;border:1px solid var(--line);border-radius:4px;white-space:pre-wrap;word-wrap:break-word}
.src .t{background:rgba(var(--shade),var(--a));border-radius:2px}
.src .t.q{font-weight:700;box-shadow:inset 0 -2px 0 var(--ink)}.src .t.r{box-shadow:inset 0 -2px 0 rgb(var(--heat))}
.chip{display:inline-block;font-size:11.5px;padding:0 5px;margin-right:6px;border:1px solid var(--line);border-radius:3px;
background:rgba(var(--shade),var(--a))}
pre{background:var(--soft);border:1px solid var(--line);border-radius:4px;padding:10px 12px;overflow:auto;font-size:12.5px}
.vec{font-size:12px;line-height:1.7}
.plot{overflow:auto;max-width:100%}.plot svg{max-width:100%;height:auto}
"""


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def _f32(x: float) -> str:
    """Shortest text that reads back as the same float32."""
    return str(np.float32(x))


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, (bool, np.bool_)):
        return "✓" if v else ""
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if math.isnan(v):
            return "–"
        if math.isinf(v):
            return "−∞" if v < 0 else "∞"
        return f"{v:.4f}"
    if isinstance(v, (list, tuple, np.ndarray)):
        shown = ", ".join(_fmt(float(x)) for x in list(v)[:VECTOR_SHOWN])
        more = len(v) - VECTOR_SHOWN
        return f"[{shown}{f', … {more} more' if more > 0 else ''}]"
    return str(v)


def _is_num(series: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series)


def html_table(df: pd.DataFrame, *, row_class=None, cls: str = "data") -> str:
    """A DataFrame as an HTML table, numbers right-aligned; ``row_class(i, row)`` names a row class."""
    num = [_is_num(df[c]) for c in df.columns]
    head = "".join(f'<th class="num">{esc(c)}</th>' if n else f"<th>{esc(c)}</th>" for c, n in zip(df.columns, num, strict=True))
    body = []
    for i, row in enumerate(df.itertuples(index=False)):
        rc = row_class(i, row) if row_class else ""
        cells = "".join(
            f'<td class="num">{esc(_fmt(v))}</td>' if n else f"<td>{esc(_fmt(v))}</td>" for v, n in zip(row, num, strict=True)
        )
        body.append(f'<tr class="{rc}">{cells}</tr>' if rc else f"<tr>{cells}</tr>")
    return f'<div class="scroll"><table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _window(cands: list[int], focus: list[int], limit: int = LIMIT) -> list[int]:
    """At most ``limit`` of the candidate positions, around the focus positions (earlier ones first)."""
    where = {p: i for i, p in enumerate(cands)}
    return [cands[i] for i in _span(len(cands), [where[p] for p in focus if p in where], limit)]


def _span(n: int, focus: list[int], limit: int) -> list[int]:
    if n <= limit:
        return list(range(n))
    focus = [p for p in dict.fromkeys(focus) if 0 <= p < n][:limit] or [0]
    lo, hi = min(focus), max(focus)
    if hi - lo < limit:
        start = min(max(0, (lo + hi) // 2 - limit // 2), n - limit, lo)
        start = max(start, hi - limit + 1)
        return list(range(start, start + limit))
    chosen, r = set(focus), 0
    while True:
        r += 1
        grown = set(chosen)
        for p in focus:
            grown.update(range(max(0, p - r), min(n, p + r + 1)))
        if len(grown) > limit:
            return sorted(chosen)
        chosen = grown


def _real(capture: Capture, site: Site, which: str, batch: int) -> list[int]:
    """Positions of an axis that are not padding."""
    return [i for i, pad in enumerate(capture.flags(site, which, batch)[1].tolist()) if not pad]


@dataclass
class _Head:
    site: Site
    head: int
    row: dict
    positions: list[int]  # query positions on the site's query axis
    refs: dict[str, list[int]]  # referent -> key positions
    weighting: str = "attention"  # of the heatmap and the shading (analysis.head_weights)


def _locate(capture: Capture, row: dict, query: str, referents: list[str], batch: int) -> _Head:
    """The shown head: its query positions (the split row's ``query_positions``, else the query's first
    occurrence) and every referent's key positions."""
    site = capture.site(row["site"])
    given = [int(p) for p in (row.get("query_positions") or [])]
    if not given:
        found = spans.find(capture, site, query, "query", batch=batch)
        given = list(spans.resolve_query(capture, site, query, occurrence=1 if len(found) > 1 else None, batch=batch).positions)
    refs: dict[str, list[int]] = {}
    for ref in referents:
        try:
            refs[ref] = sorted({p for o in spans.find(capture, site, ref, "key", batch=batch) for p in o.positions})
        except InspectorError:
            refs[ref] = []
    return _Head(site, int(row["head"]), row, given, refs)


def _query_weights(capture: Capture, h: _Head, batch: int) -> np.ndarray:
    """The head's aggregate row over the keys (float64): :func:`inspector.ui.views.query_weights`."""
    return views.query_weights(capture, h.site, h.head, h.positions, batch=batch, weighting=h.weighting).numpy()


def _bars(h: _Head, referents: list[str]) -> str:
    rows = []
    for ref in referents:
        v = h.row.get(f"weight:{ref}")
        if v is None:
            continue
        width = max(0.0, min(1.0, float(v))) * 100
        rows.append(f'<tr><td class="mono">{esc(ref)}</td><td><span class="bar"><i style="width:{width:.1f}%"></i></span></td>'
                    f'<td class="num">{float(v):.4f}</td></tr>')
    extra = " · ".join(f"{k} {float(h.row[k]):.4f}" for k in ("referent_mass", "chance_mass", "lift", "split_score") if k in h.row)
    return f'<table class="bars">{"".join(rows)}</table><p class="note">{esc(extra)}</p>' + _verdict_notes(h, referents)


def _verdict_notes(h: _Head, referents: list[str]) -> str:
    """The query-row rule and the shared pieces of one head's split row, in words."""
    r, notes = h.row, []
    positions = list(r.get("query_positions") or [])
    if len(positions) > 1 and "row_split_scores" in r:
        each = ", ".join(f"row {p}: {float(s):.4f}" for p, s in zip(positions, r["row_split_scores"], strict=False))
        passing = list(r.get("rows_flagged") or [])
        notes.append(f"The query is {len(positions)} tokens; split judges the mean of their rows. Each row's own split "
                     f"score: {each}. Row {r.get('driving_row')} drives the flag"
                     + (f"; rows passing the rule alone: {' '.join(map(str, passing))}." if passing
                        else "; no row passes the rule alone."))
    pieces = [f"{ref}: {r[f'pieces:{ref}']}" for ref in referents if r.get(f"pieces:{ref}")]
    if pieces:
        notes.append("Weight by token: " + " · ".join(pieces) + ".")
    if r.get("mostly_shared"):
        notes.append(f"Most of this split sits on pieces both referents share ({r.get('shared_pieces')}): "
                     f"{float(r['shared_share']):.0%} of the referent weight; without them the split score would be "
                     f"{float(r['split_unshared']):.4f}, not {float(r['split_score']):.4f}. The head may be reading the "
                     "shared piece, not choosing between the names.")
    return "".join(f'<p class="note verdict">{esc(n)}</p>' for n in notes)


def _heatmap(capture: Capture, h: _Head, batch: int) -> str:
    site = h.site
    same = site.query_input == site.key_input
    ref_pos = sorted({p for ps in h.refs.values() for p in ps},
                     key=lambda p: min(abs(p - q) for q in h.positions) if same else p)
    kc, qc = _real(capture, site, "key", batch), _real(capture, site, "query", batch)
    keys, rows = _window(kc, (h.positions if same else []) + ref_pos), _window(qc, h.positions)
    w = head_weights(capture, site, batch, heads=[h.head], queries=slice(rows[0], rows[-1] + 1), weighting=h.weighting)[0]
    w = w[[r - rows[0] for r in rows]][:, keys].numpy()
    vmax = float(w.max()) if w.size and w.max() > 0 else 1.0
    qtok, ktok = capture.tokens(site, "query", batch), capture.tokens(site, "key", batch)
    qset, rset = set(h.positions), set(ref_pos)

    def mark(i: int, pos: list[int], j: int, hot: set[int], cls: str) -> str:
        c = [cls] if i in hot else []
        if j and pos[j] != pos[j - 1] + 1:
            c.append("gap")
        return f' class="{" ".join(c)}"' if c else ""

    head = "".join(f'<th data-k="{k}"{mark(k, keys, j, rset | (qset if same else set()), "r" if k in rset else "q")}'
                   f' title="#{k} {esc(ktok[k])}">{esc(ktok[k])}</th>' for j, k in enumerate(keys))
    body = []
    for i, q in enumerate(rows):
        cells = "".join(
            f'<td{" class=gap" if j and keys[j] != keys[j - 1] + 1 else ""} style="--a:{w[i, j] / vmax:.3f}" '
            f'title="{esc(qtok[q])} → {esc(ktok[k])}: {w[i, j]:.4f}" data-w="{_f32(w[i, j])}"></td>'
            for j, k in enumerate(keys)
        )
        gap = " gap" if i and q != rows[i - 1] + 1 else ""
        hot = "q" if q in qset else ""
        body.append(f'<tr data-q="{q}" class="{gap.strip()}"><th class="{hot}" title="#{q}">{esc(qtok[q])}</th>{cells}</tr>')
    note = (f"{len(rows)} of {len(qc)} query rows × {len(keys)} of {len(kc)} keys{' (padding left out)' if len(kc) < site.key_len else ''}; "
            f"colour = weight ÷ largest shown ({vmax:.4f})")
    gaps = " · thick lines mark skipped positions" if len(keys) < len(kc) or len(rows) < len(qc) else ""
    return (f'<p class="note"><span class="legend"></span> {esc(note)}{gaps} · '
            f'<span class="q mono">query</span> / <span class="r mono">referent</span> tokens in colour</p>'
            f'<div class="scroll"><table class="hm" data-site="{esc(site.name)}" data-head="{h.head}">'
            f'<thead><tr><th></th>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>')


def _shade_record(pieces: list, chips: list, text: str, role: str, qset: set[int], rset: set[int]) -> str:
    """One key role's text, each piece (:func:`inspector.ui.views.shade_pieces`, the app's too) with
    background opacity = its alpha."""
    out, cursor = [], 0
    for sh in pieces:
        out.append(esc(text[cursor:sh.start]))
        cls = "t" + (" q" if qset & set(sh.positions) else "") + (" r" if rset & set(sh.positions) else "")
        out.append(f'<span class="{cls}" style="--a:{sh.alpha:.3f}" data-k="{" ".join(map(str, sh.positions))}" '
                   f'data-w="{sh.weight!r}" title="#{esc(" ".join(map(str, sh.positions)))} {esc(" ".join(sh.tokens))}: '
                   f'{sh.weight:.4f}">{esc(text[sh.start:sh.end])}</span>')
        cursor = sh.end
    out.append(esc(text[cursor:]))
    chip_html = "".join(
        f'<span class="chip" style="--a:{c.alpha:.3f}" data-k="{c.positions[0]}" data-w="{c.weight!r}" '
        f'title="#{c.positions[0]}">{esc(c.tokens[0])} {c.weight:.3f}</span>' for c in chips
    )
    extra = f'<p class="note">tokens outside the text: {chip_html}</p>' if chips else ""
    return f'<div class="src" data-role="{esc(role)}">{"".join(out)}</div>{extra}'


def _shaded(capture: Capture, h: _Head, batch: int, note: bool = True) -> str:
    w = _query_weights(capture, h, batch)
    same = h.site.query_input == h.site.key_input
    qset = set(h.positions) if same else set()
    rset = {p for ps in h.refs.values() for p in ps}
    parts, start = [], 0
    for role, text, pieces, chips in views.shade_pieces(capture, h.site, w, batch):
        n = len(capture.records(role, batch).ids)
        label = f"{role} text" + ("" if len(h.site.key_input) == 1 else f" (keys {start}–{start + n - 1})")
        parts.append(f"<h4>{esc(label)}</h4>{_shade_record(pieces, chips, text, role, qset, rset)}")
        start += n
    if not note:
        return "".join(parts)
    qtoks = capture.tokens(h.site, "query", batch)
    rows = " ".join(qtoks[p] for p in h.positions)
    how = f"mean of the {len(h.positions)} query rows ({rows})" if len(h.positions) > 1 else f"query row {h.positions[0]} ({rows})"
    return (f'<p class="note">Weights of {esc(how)}, shaded over the key text: opacity = weight; '
            "query in bold, referents underlined in blue.</p>" + "".join(parts))


def _head_card(capture: Capture, h: _Head, referents: list[str], batch: int, flagged: bool) -> str:
    site = h.site
    tag = '<span class="tag">flagged</span>' if flagged else ""
    title = f"{site.name} · head {h.head}"
    stack = "" if site.stack == "none" else f"{site.stack} · "
    sub = f"layer {site.layer} · {stack}{site.kind} attention · queries: {' + '.join(site.query_input)}, keys: {' + '.join(site.key_input)}"
    parts = [f'<div class="card head" data-site="{esc(site.name)}" data-head="{h.head}">',
             f'<h3><code>{esc(title)}</code>{tag}</h3><p class="note">{esc(sub)}</p>',
             "<h4>Weight on each referent</h4>", _bars(h, referents)]
    for what, fn in (("Query × key weights", _heatmap), ("The query's weights over the text", _shaded)):
        parts.append(f"<h4>{what}</h4>")
        try:
            parts.append(fn(capture, h, batch))
        except InspectorError as exc:
            parts.append(f'<p class="note">cannot show this: {esc(exc)}</p>')
    parts.append("</div>")
    return "".join(parts)


def _row_table(capture: Capture, h: _Head, batch: int) -> str:
    """Each query row's referent weights, lift and split score, and the aggregate row split judges."""
    refs = {r: p for r, p in h.refs.items() if p}
    if len(refs) < 2:
        return ""
    try:
        found = referent_split(capture, h.site, h.positions, refs, batch=batch, weighting=h.weighting)
    except Exception:  # noqa: BLE001 - nothing visible: no table
        return ""
    qtok = capture.tokens(h.site, "query", batch)
    rows = []
    for i, p in enumerate(h.positions):
        v = found.row_of(h.head, i)
        rows.append({"query row": f"{p} {qtok[p]}", **{k: v[k] for k in v if k.startswith("weight:")},
                     "chance_mass": v["chance_mass"], "lift": v["lift"], "split_score": v["split_score"], "passes": v["flagged"]})
    agg = found.row(h.head)
    rows.append({"query row": "aggregate (mean)", **{k: agg[k] for k in agg if k.startswith("weight:")},
                 "chance_mass": agg["chance_mass"], "lift": agg["lift"], "split_score": agg["split_score"],
                 "passes": agg["flagged"]})
    df = pd.DataFrame(rows)
    drive = f"{agg['driving_row']} {qtok[agg['driving_row']]}"
    return (f'<h4>The query\'s rows over the referents ({esc(h.weighting)} weights)</h4>'
            + html_table(df, row_class=lambda i, r: "top" if r[0] == drive else "", cls="data qrows"))


def _steps(capture: Capture, h: _Head, batch: int) -> str:
    qi = int(h.row.get("driving_row", h.positions[-1])) if len(h.positions) > 1 else h.positions[-1]
    if qi not in h.positions:
        qi = h.positions[-1]
    try:
        exp = explain(capture, h.site, h.head, qi, batch=batch)
    except InspectorError as exc:
        return f'<p class="note">no step-by-step view: {esc(exc)}</p>'
    site = h.site
    same = site.query_input == site.key_input
    rset = {p for ps in h.refs.values() for p in ps}
    keys = _window(_real(capture, site, "key", batch), (h.positions if same else []) + sorted(rset))
    t = exp.table.iloc[keys][["key_index", "key_token", "dot", "scaled", "mask", "weight", "contribution"]]
    t = t.reset_index(drop=True)
    best = int(exp.table["weight"].idxmax())

    def row_class(i, row):
        return " ".join(c for c, ok in (("ref", row.key_index in rset), ("top", row.key_index == best)) if ok)

    left = len(_real(capture, site, "key", batch)) - len(keys)
    rest = f" {left} other keys outside the window carry weight {float(exp.table['weight'].drop(index=keys).sum()):.4f}." if left else ""
    cap = f"scaled = dot × {site.scaling:.6g}" + (f", soft-capped at {site.softcap:g}" if site.softcap else "")
    out = ", ".join(f"{x:.4f}" for x in exp.output)
    which = ("the query's only token" if len(h.positions) == 1
             else f"the row that drives the flag, of the query's rows {' '.join(map(str, h.positions))}")
    return (_row_table(capture, h, batch)
            + f'<p class="note">Query token <code>{esc(exp.query_token)}</code> (#{qi}, {esc(which)}) at '
            f"<code>{esc(site.name)}</code> head {h.head}: {esc(cap)}; weight = softmax(scaled + mask); contribution = "
            f"weight × value (first {VECTOR_SHOWN} of {site.d_v} entries). Referent rows shaded, the largest weight in bold."
            f"{esc(rest)}</p>"
            + html_table(t, row_class=row_class, cls="data steps")
            + f'<h4>Output vector (sum of contributions, {len(exp.output)} entries)</h4><p class="vec mono">[{out}]</p>')


def _comparison(comparison: pd.DataFrame) -> str:
    """Any comparison table; sorted by the size of its change column when it has one."""
    cols = [c for c in comparison.columns if str(c).lower() in ("change", "delta", "difference", "diff") and _is_num(comparison[c])]
    order = ""
    if cols:
        comparison = comparison.reindex(comparison[cols[0]].abs().sort_values(ascending=False, kind="stable").index)
        order = f", largest {cols[0]} first"
    shown = comparison.head(COMPARE_ROWS).reset_index(drop=True)
    return (f'<p class="note">{len(shown)} of {len(comparison)} rows{esc(order)}.</p>'
            + html_table(shown, cls="data compare"))


def _referent_plot(split: pd.DataFrame, referents: list[str], top: int = 10) -> str:
    """The top heads' referent weights as grouped bars (inline SVG), or a note when the plot libraries are missing."""
    from inspector.ui.report_plots import referent_bars

    svg = referent_bars(split, referents, top)
    if svg is None:
        return '<p class="note">(bar charts need Altair and vl-convert: pip install inspector[plots])</p>'
    if not svg:
        return ""
    return (f'<div class="plot referent-plot">{svg}</div><p class="note">Weight of the query on each referent for the '
            f"first {min(top, len(split))} heads of the split table; flagged heads opaque, the others faded.</p>")


def _comparison_plot(comparison: pd.DataFrame, top: int = 10) -> str:
    """Split scores of the original and each variant as paired bars (inline SVG), largest changes first."""
    from inspector.ui.report_plots import comparison_bars

    svg = comparison_bars(comparison, top)
    if svg is None:
        return '<p class="note">(bar charts need Altair and vl-convert: pip install inspector[plots])</p>'
    if not svg:
        return ""
    return (f'<div class="plot compare-plot">{svg}</div><p class="note">Split score per head in each capture, '
            f"paired; the {top} largest changes.</p>")


def _occurrence(capture: Capture, h: _Head, query: str, batch: int) -> int:
    """Which occurrence of the query (0-based) the head's query positions are; 0 when none matches."""
    try:
        found = spans.find(capture, h.site, query, "query", batch=batch)
    except InspectorError:
        return 0
    return next((i for i, o in enumerate(found) if list(o.positions) == h.positions), 0)


def _variant(name: str, cap: Capture, top: _Head, query: str, referents: list[str], batch: int,
             main_model: str, k: int) -> str:
    """How the top head reads another capture: the same site, head and occurrence of the query."""
    try:
        site = cap.site(top.site.name)
        occ = spans.find(cap, site, query, "query", batch=batch)
        if not occ:
            raise InspectorError(f"query {query!r} is not in this variant")
        row = {"site": site.name, "head": top.head, "query_positions": list(occ[min(k, len(occ) - 1)].positions)}
        h = _locate(cap, row, query, referents, batch)
        h.weighting = top.weighting
        w = _query_weights(cap, h, batch)
        gives = " · ".join(f"{r} {w[p].sum():.4f}" for r, p in h.refs.items())
        body = f'<p class="note">{esc(gives)}</p>' + _shaded(cap, h, batch, note=False)
    except InspectorError as exc:
        body = f'<p class="note">cannot show this: {esc(exc)}</p>'
    model = "" if cap.model_name == main_model else f" · <code>{esc(cap.model_name)}</code>"
    return f'<div class="card variant" data-variant="{esc(name)}"><h3>{esc(name)}{model}</h3>{body}</div>'


def _moves(moves: pd.DataFrame) -> str:
    """Per flagged head and variant, one plain sentence: did the variant move the split down, up or not at all."""
    if not len(moves):
        return '<p class="note moves">No head is flagged in the original or in any variant.</p>'
    items = "".join(f"<li>{esc(move_sentence(r))}</li>" for r in moves.to_dict("records"))
    return f'<ul class="moves">{items}</ul>'


def _summary(n_flagged: int, rows: list[dict], query: str, referents: list[str]) -> str:
    refs = _and(referents) if referents else "the referents"
    if n_flagged:
        s = "s" if n_flagged != 1 else ""
        text = (f"{n_flagged} head{s} flagged: {'their' if s else 'its'} weight for {query!r} is split between {refs}."
                + (f" The first {len(rows)} are shown." if n_flagged > len(rows) else ""))
    else:
        text = (f"No head flagged: none passed the split thresholds for {query!r} between {refs}; "
                f"below are the {len(rows)} heads with the highest split scores.")
    if rows:
        r0 = rows[0]
        gives = [f"{float(r0[f'weight:{r}']):.3f} to {r}" for r in referents if f"weight:{r}" in r0]
        if gives:
            score = f" (split score {float(r0['split_score']):.3f})" if "split_score" in r0 else ""
            lift = (f", {float(r0['lift']):.2f} times what uniform attention would give the referents"
                    if "lift" in r0 and r0["lift"] == r0["lift"] else "")
            text += f" {'Strongest' if n_flagged else 'Highest'}: {r0['site']} head {r0['head']} gives {_and(gives)}{score}{lift}."
        if r0.get("mostly_shared"):
            text += (f" Most of that split sits on {r0.get('shared_pieces')!r}, a token piece both referents share "
                     f"(without it the split score is {float(r0['split_unshared']):.3f}).")
        if len(r0.get("query_positions") or []) > 1 and "driving_row" in r0:
            text += f" Of the query's rows, row {r0['driving_row']} drives it (row split scores {' '.join(f'{float(x):.4f}' for x in r0['row_split_scores'])})."
    return text


def render_report(
    capture: Capture,
    split: pd.DataFrame,
    rank: pd.DataFrame,
    *,
    query: str,
    referents: list[str],
    commands: list[str],
    comparison: pd.DataFrame | None = None,
    variants: dict[str, Capture] | None = None,
    top: int = 3,
    batch: int = 0,
    title: str | None = None,
    weighting: str = "attention",
    moves: pd.DataFrame | None = None,
    rank_note: str | None = None,
) -> str:
    """One self-contained HTML document for a split-head investigation (see the module docstring).

    ``weighting`` is the heatmaps' and shadings' (``attention`` or ``value-norm``, as the split's);
    ``moves`` (:func:`~inspector.investigate.variant_moves`) puts one sentence per flagged head and
    variant first in the summary and the variants section; ``rank_note`` says how heads were ranked."""
    referents = [r.strip() for r in referents if r.strip()]
    title = title or f"Attention report: {query!r} between {_and(referents) if referents else '—'}"
    model = capture.meta.get("model", {})
    flagged = split[split["flagged"].astype(bool)] if "flagged" in split.columns else split.iloc[:0]
    if len(flagged):
        shown = flagged.head(top)
    else:
        shown = split.sort_values("split_score", ascending=False, kind="stable") if "split_score" in split else split
        shown = shown.head(top)
    heads: list[tuple[_Head | None, dict, str | None]] = []
    for row in shown.to_dict("records"):
        try:
            h = _locate(capture, row, query, referents, batch)
            h.weighting = weighting
            heads.append((h, row, None))
        except InspectorError as exc:
            heads.append((None, row, str(exc)))
    summary = _summary(len(flagged), [row for _, row, _ in heads], query, referents)

    meta = [("model", capture.model_name), ("class", model.get("class", "")), ("query", query),
            ("referents", ", ".join(referents)), ("batch row", str(batch)),
            ("captured", " · ".join(str(x) for x in (capture.meta.get("created"), model.get("dtype"),
                                                       model.get("transformers") and f"transformers {model.get('transformers')}") if x))]
    body = [f"<header><h1>{esc(title)}</h1><dl class=kv>"
            + "".join(f"<dt>{esc(k)}</dt><dd><code>{esc(v)}</code></dd>" for k, v in meta if v) + "</dl></header>",
            f'<p class="summary">{esc(summary)}</p>',
            *([_moves(moves)] if moves is not None else []),
            _referent_plot(split, referents),
            f'<p class="note">Weights shown: {esc(weighting)}'
            + (" (weight × ||v_j W_O^h||, renormalized per row; Kobayashi et al. 2020)" if weighting == "value-norm" else "")
            + ". Flagged: split_score, referent_mass and lift (referent_mass ÷ what uniform attention over the visible keys "
            "would give the referents) all at or above their thresholds.</p>",
            f"<h2>{'Flagged heads' if len(flagged) else 'Heads with the highest split scores'}</h2>"]
    for h, row, err in heads:
        if h is None:
            body.append(f'<div class="card"><h3><code>{esc(row.get("site"))} · head {esc(row.get("head"))}</code></h3>'
                        f'<p class="note">cannot show this head: {esc(err)}</p></div>')
        else:
            body.append(_head_card(capture, h, referents, batch, bool(row.get("flagged", False))))
    first = next((h for h, _, _ in heads if h is not None), None)
    if first is not None:
        body += [f"<h2>Step by step: <code>{esc(first.site.name)}</code> head {first.head}</h2>", _steps(capture, first, batch)]

    keep = (np.arange(len(split)) < SPLIT_ROWS) | (split["flagged"].astype(bool).to_numpy() if "flagged" in split.columns else False)
    split_shown = split[keep]
    flags = split_shown["flagged"].astype(bool).tolist() if "flagged" in split.columns else [False] * len(split_shown)
    body += ["<h2>Split table</h2>",
             f'<p class="note">{len(split_shown)} of {len(split)} site × head rows, highest split score first; flagged rows highlighted.</p>',
             html_table(split_shown.reset_index(drop=True), row_class=lambda i, _r: "flag" if flags[i] else "", cls="data split"),
             "<h2>Head ranking</h2>",
             f'<p class="note">{esc(rank_note or "")} The first {min(RANK_ROWS, len(rank))} of {len(rank)} heads of the ranking.</p>',
             html_table(rank.head(RANK_ROWS).reset_index(drop=True), cls="data rank")]
    if comparison is not None or variants:
        body.append("<h2>Variants compared</h2>")
        if moves is not None:
            body.append(_moves(moves))
        if comparison is not None:
            body.append(_comparison_plot(comparison))
            body.append(_comparison(comparison))
        if variants and first is not None:
            body.append(f'<p class="note">How <code>{esc(first.site.name)}</code> head {first.head} reads each variant:</p>')
            k = _occurrence(capture, first, query, batch)
            body += [_variant(name, cap, first, query, referents, batch, capture.model_name, k) for name, cap in variants.items()]
    body += ["<h2>Reproduce</h2>", f"<pre>{esc(chr(10).join(commands))}</pre>" if commands else '<p class="note">no commands given</p>']
    csp = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n")
