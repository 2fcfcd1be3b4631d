"""Data for the app's views: a capture in, small DataFrames, arrays or HTML strings out.

Pure helpers behind ``apps/app.py`` (no Streamlit here), so the app script holds UI code only and
these can be tested and reused on their own. Every function reads only the rows it shows: a window
of query rows, one query's row, one query and one key vector, never a whole ``[query, key]``
matrix of a long input.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from inspector.analysis.explain import Explanation
from inspector.analysis.keys import MASKED, head_weights
from inspector.analysis.split import word_row
from inspector.errors import InspectorError
from inspector.store.capture_file import Capture, Site

GRID_METRICS = {
    "normalized_entropy": "normalized entropy",
    "entropy": "entropy (nats)",
    "sink_mass": "sink mass",
    "self_mass": "self mass",
    "prev_mass": "previous-token mass",
    "top_key_weight": "top key weight",
    "split_score": "split score",
}
BERTVIZ_MAX_TOKENS = 64  # bertviz embeds every weight as JSON: a 64-token window of 12 x 12 heads is ~4 MB
# bertviz's model view draws one SVG line per weight of every head (layers x heads x window^2): 6 x 12 heads
# at 64 tokens are 295k lines, about 10 s in Chromium before anything shows; at 32 tokens 74k lines, 2.6 s
MODEL_VIEW_MAX_TOKENS = 32
# the app recomputes a lazy capture's weights and expands a banded (long-document) site's compact band to every
# key (Overview ranks every head): a crafted file of 2 MB can declare 2.4e9 of them and hold the server for
# minutes, so the app refuses more than this many before any work
APP_MAX_RECOMPUTED = 1_000_000_000
VENDOR_FILES = {  # what bertviz's HTML would fetch from cdnjs, as installed by `make assets`
    "requirejs": "requirejs/require.js",
    "d3": "d3/dist/d3.min.js",
    "jquery": "jquery/dist/jquery.min.js",
}


# ---- labels ------------------------------------------------------------------------------------
def site_label(site: Site) -> str:
    """``L5 self · encoder.layer.5.attention.self`` (stack shown for encoder-decoder models)."""
    where = f"{site.stack} {site.kind}" if site.stack != "none" else site.kind
    return f"L{site.layer} {where} · {site.name}"


def site_short(site: Site) -> str:
    """``L5 self · attention.self``: the layer, kind and the last two parts of the module name (a
    sidebar-wide label; :func:`site_label` has the whole name)."""
    where = f"{site.stack} {site.kind}" if site.stack != "none" else site.kind
    tail = ".".join(site.name.split(".")[-2:])
    return f"L{site.layer} {where} · {tail}"


def group_label(stack: str, kind: str) -> str:
    """A grid's title: ``encoder self``, ``decoder causal``, ``decoder cross`` or just ``self``."""
    return f"{stack} {kind}" if stack != "none" else kind


def token_label(index: int, token: str) -> str:
    """A token's label in the app: ``"<index> · <token>"``."""
    return f"{index} · {token}"


def search_labels(capture: Capture, site: Site, which: str = "query", batch: int = 0) -> list[str]:
    """A label per position of an axis for a token search: ``"25 · ##em (indemnity)"``, the token and, when
    the tokenizer split a word into several tokens or the token does not spell the text it covers
    (``"7 · [UNK] (😀)"``), that text (from the tokenizer's word ids and character offsets), so that a
    search for a word finds each of its pieces."""
    out: list[str] = []
    words: dict[int, list[str | None]] = {}  # id(record) -> per token: its word's text when the word has 2+ tokens
    for pos, (rec, i) in enumerate(capture.axis(site, which, batch)):
        if id(rec) not in words:
            words[id(rec)] = _split_words(rec)
        word = words[id(rec)][i]
        out.append(token_label(pos, rec.tokens[i]) + (f" ({word})" if word else ""))
    return out


def _split_words(rec) -> list[str | None]:
    """Per token of an input record, the text of its word when the tokenizer split that word into two or more
    tokens or when the token does not spell its text (an unknown token, a byte-level piece), else None. A word is a run of adjacent tokens with the same word id (word ids start again at 0
    in the second text of a pair, so the id alone does not name a word)."""
    ids = list(rec.word_ids or [])
    ids += [None] * (len(rec.tokens) - len(ids))
    out: list[str | None] = [None] * len(rec.tokens)
    start = 0
    while start < len(ids):
        stop = start + 1
        while stop < len(ids) and ids[start] is not None and ids[stop] == ids[start]:
            stop += 1
        spans = [o for o in rec.offsets[start:stop] if o is not None]
        if not spans and ids[start] is not None:  # a word's token kept without offsets ("[UNK]"): the text between
            before = [o[1] for o in rec.offsets[:start] if o is not None]  # its neighbours' offsets
            after = [o[0] for o in rec.offsets[stop:] if o is not None]
            spans = [[before[-1] if before else 0, after[0] if after else len(rec.text)]]
        if spans:
            text = " ".join(rec.text[min(o[0] for o in spans):max(o[1] for o in spans)].split())
            if stop - start > 1:
                out[start:stop] = [text or None] * (stop - start)
            elif text and text.lower() not in rec.tokens[start].lower():  # "[UNK]" for an emoji, "Ã©" for "é"
                out[start] = text
        start = stop
    return out


def groups(capture: Capture) -> list[tuple[str, str, list[Site]]]:
    """Sites grouped by (stack, kind), in the capture's order, each group sorted by layer."""
    out: dict[tuple[str, str], list[Site]] = {}
    for s in capture.sites:
        out.setdefault((s.stack, s.kind), []).append(s)
    return [(stack, kind, sorted(sites, key=lambda s: (s.layer, s.name))) for (stack, kind), sites in out.items()]


def focus_window(candidates, focus, size: int, anchor: str = "centre") -> list[int]:
    """At most ``size`` of the ``candidates`` (positions in increasing order, e.g. an axis's non-padding
    positions) around the ``focus`` positions, in order: the one definition of a heatmap's window in the app
    (:func:`heatmap_windows`), :func:`inspector.ui.show.head_heatmap` and the report.

    When the focus positions fit in ``size`` candidates, a contiguous run holding them all: centred on them
    (``anchor="centre"``) or ending at the last where it can (``anchor="end"``, a causal site's rows up to its
    query); clipped to the ends. Otherwise each focus position with the same number of neighbours on each
    side, grown until one more would pass ``size`` (earlier focus positions first; the result has gaps).
    Focus positions that are not candidates are ignored; without any, the run starts at the first
    candidate (``"centre"``) or ends at the last (``"end"``)."""
    cands = list(candidates)
    n = len(cands)
    size = max(1, size)
    if n <= size:
        return cands
    where = {p: i for i, p in enumerate(cands)}
    idx = [where[p] for p in dict.fromkeys(focus) if p in where][:size] or [0 if anchor == "centre" else n - 1]
    lo, hi = min(idx), max(idx)
    if hi - lo < size:
        if anchor == "end":
            start = min(max(0, hi - size + 1), n - size)
        else:
            start = max(min(max(0, (lo + hi) // 2 - size // 2), n - size, lo), hi - size + 1)
        return cands[start:start + size]
    chosen, r = set(idx), 0
    while True:
        r += 1
        grown = set(chosen)
        for i in idx:
            grown.update(range(max(0, i - r), min(n, i + r + 1)))
        if len(grown) > size:
            return [cands[i] for i in sorted(chosen)]
        chosen = grown


def _run(positions: list[int]) -> slice:
    return slice(positions[0], positions[-1] + 1) if positions else slice(0, 0)


def window(center: int, size: int, n: int) -> slice:
    """A ``size``-long slice of ``range(n)`` around ``center`` (clipped to the ends): :func:`focus_window`."""
    return _run(focus_window(range(n), [center], size))


def window_to(last: int, size: int, n: int) -> slice:
    """A ``size``-long slice of ``range(n)`` whose last position is ``last`` where it can be (clipped to the
    ends): a causal site's query rows up to the selected query, which then sees every key of the window
    (:func:`focus_window` with ``anchor="end"``)."""
    return _run(focus_window(range(n), [last], size, anchor="end"))


def csv_bytes(df: pd.DataFrame) -> bytes:
    """The CSV the CLI writes for ``df`` (``--csv``), byte for byte (:func:`inspector.store.files.csv_text`)."""
    from inspector.store.files import csv_text

    return csv_text(df).encode("utf-8")


# ---- overview ----------------------------------------------------------------------------------
def grid_frame(rank: pd.DataFrame, split: pd.DataFrame | None = None) -> pd.DataFrame:
    """The ranking table plus a ``group`` column and, when a split was run, ``split_score``."""
    df = rank.copy()
    df["group"] = [group_label(s, k) for s, k in zip(df["stack"], df["kind"], strict=True)]
    if split is not None and len(split):
        scores = split[["site", "head", "split_score"]]
        df = df.merge(scores, on=["site", "head"], how="left")
    else:
        df["split_score"] = float("nan")
    return df


# ---- head view ---------------------------------------------------------------------------------
def heatmap_frame(
    capture: Capture, site: Site, head: int, queries: slice, keys: slice | None = None, top_k: int | None = None,
    batch: int = 0, weighting: str = "attention",
) -> pd.DataFrame:
    """Long-form weights of one head for a window of query rows: every key of the ``keys`` window,
    or each row's ``top_k`` keys over the whole key axis. Columns ``query_index, query_token,
    key_index, key_token, weight``; only these rows are read from the capture. ``weighting="value-norm"``
    gives value-weighted attention (see :func:`inspector.analysis.head_weights`)."""
    w = head_weights(capture, site, batch, heads=[head], queries=queries, weighting=weighting)[0]  # [nq, key]
    q_tokens = capture.tokens(site, "query", batch)
    k_tokens = capture.tokens(site, "key", batch)
    q_idx = list(range(*queries.indices(site.query_len)))
    if top_k is not None:
        k = max(1, min(top_k, site.key_len))
        values, index = w.topk(k, dim=-1)
        qi = [q for q in q_idx for _ in range(k)]
        ki = index.reshape(-1).tolist()
        wv = values.reshape(-1).tolist()
    else:
        ks = keys if keys is not None else slice(None)
        k_idx = list(range(*ks.indices(site.key_len)))
        sub = w[:, ks]
        qi = [q for q in q_idx for _ in k_idx]
        ki = k_idx * len(q_idx)
        wv = sub.reshape(-1).tolist()
    # labels from the Python lists (iterating the frame's Arrow-backed string columns costs ~5x more)
    q_label = {i: token_label(i, q_tokens[i]) for i in set(qi)}
    k_label = {i: token_label(i, k_tokens[i]) for i in set(ki)}
    return pd.DataFrame({
        "query_index": qi,
        "query_token": [q_tokens[i] for i in qi],
        "key_index": ki,
        "key_token": [k_tokens[i] for i in ki],
        "weight": wv,
        "query_label": [q_label[i] for i in qi],
        "key_label": [k_label[i] for i in ki],
    })


def query_row(capture: Capture, site: Site, head: int, query_index: int, batch: int = 0,
              weighting: str = "attention") -> pd.DataFrame:
    """One query's weights over every key: ``key_index, key_token, weight, special, padding``."""
    w = head_weights(capture, site, batch, heads=[head], queries=slice(query_index, query_index + 1), weighting=weighting)[0, 0]
    special, padding = capture.flags(site, "key", batch)
    tokens = capture.tokens(site, "key", batch)
    return pd.DataFrame({
        "key_index": range(site.key_len),
        "key_token": tokens,
        "weight": w.tolist(),
        "special": special.tolist(),
        "padding": padding.tolist(),
        "key_label": [token_label(i, t) for i, t in enumerate(tokens)],
    })


def qkv_frame(capture: Capture, site: Site, head: int, query_index: int, key_index: int, batch: int = 0) -> pd.DataFrame:
    """The query vector of ``query_index`` and the key and value vectors of ``key_index`` for one head
    (K/V of the head's K/V group under grouped-query attention): ``dim, q, k, q*k, v``."""
    if not {"q", "k", "v"} <= set(site.parts):
        raise InspectorError(f"site {site.name} was captured through output_attentions, without Q/K/V: no vectors to show")
    kv = site.head_map[head]

    def row(part: str, h: int, pos: int) -> list[float]:
        t = capture.tensors.slice(site.tensor_name(part), (slice(batch, batch + 1), slice(h, h + 1), slice(pos, pos + 1)))
        return t[0, 0, 0].float().tolist()

    q, k, v = row("q", head, query_index), row("k", kv, key_index), row("v", kv, key_index)
    n = max(len(q), len(v))
    pad = [float("nan")] * n
    return pd.DataFrame({
        "dim": range(n),
        "q": (q + pad)[:n],
        "k": (k + pad)[:n],
        "q*k": ([a * b for a, b in zip(q, k, strict=True)] + pad)[:n],
        "v": (v + pad)[:n],
    })


# ---- step by step ------------------------------------------------------------------------------
def explain_frame(exp: Explanation, preview: int = 4) -> pd.DataFrame:
    """The explanation table for display: a ``visible`` column from the mask and the contribution
    vector shortened to its first ``preview`` entries (the CSV keeps ``exp.table`` as-is). Without steps
    (a site stored as weights only) the table already has ``visible``: returned as it is."""
    df = exp.table.copy()
    if not exp.steps:
        return df
    df.insert(df.columns.get_loc("mask") + 1, "visible", [bool(m > MASKED) for m in df["mask"]])
    df["contribution"] = [
        "[" + ", ".join(f"{x:.4f}" for x in c[:preview]) + (", …]" if len(c) > preview else "]") for c in df["contribution"]
    ]
    return df


# ---- split finder ------------------------------------------------------------------------------
def head_label(row: dict) -> str:
    """A head's short name in bar charts: ``L5 H9`` (``L5 H9 cross`` for cross-attention; the site name
    when the row has no layer)."""
    where = f"L{row['layer']}" if "layer" in row else str(row.get("site", ""))
    return f"{where} H{row['head']}" + (f" {row['kind']}" if row.get("kind") == "cross" else "")


def split_bars(split: pd.DataFrame, top: int = 10, referents: list[str] | None = None) -> pd.DataFrame:
    """The referent-bar data of the app's split finder and the report (one definition): long form of the
    first ``top`` rows of a split table, ``head_label, site, head, referent, weight, flagged, split_score``
    (heads in split-table order, referents in ``referents`` order, else the table's ``weight:`` columns);
    ``weight`` is the row's ``weight:<referent>``, the word's aggregate row summed over the referent."""
    refs = [r for r in referents if f"weight:{r}" in split.columns] if referents is not None else \
        [c.split(":", 1)[1] for c in split.columns if c.startswith("weight:")]
    rows = []
    for r in split.head(top).to_dict("records"):
        label = head_label(r)
        for ref in refs:
            rows.append({"head_label": label, "site": r.get("site"), "head": r["head"], "referent": ref,
                         "weight": float(r[f"weight:{ref}"]), "flagged": bool(r.get("flagged", False)),
                         "split_score": r.get("split_score")})
    return pd.DataFrame(rows, columns=["head_label", "site", "head", "referent", "weight", "flagged", "split_score"])


def query_weights(capture: Capture, site: Site, head: int, positions: list[int], batch: int = 0,
                  weighting: str = "attention") -> torch.Tensor:
    """A query word's aggregate row over the key axis, float64 ``[key]``: the mean of its rows, the row
    :func:`~inspector.analysis.split_heads` judges (:func:`inspector.analysis.split.word_row`)."""
    return word_row(capture, site, head, positions, batch=batch, weighting=weighting)


@dataclass(frozen=True)
class Shade:
    """One shaded piece of a key text: characters ``start:end`` of its role's text (None for a token
    outside the text, a chip: [CLS], BOS), the key ``positions`` it covers, their summed ``weight`` and
    the ``alpha`` (opacity, 0..1) it is drawn with."""

    start: int | None
    end: int | None
    positions: tuple[int, ...]
    tokens: tuple[str, ...]
    weight: float
    alpha: float


def shade_alpha(weight: float) -> float:
    """The opacity a weight is shaded with: the weight itself on a fixed 0..1 scale (clipped; NaN 0),
    so shaded texts of different heads and queries compare, and a key's shade reads as its weight."""
    return min(1.0, max(0.0, weight)) if math.isfinite(weight) else 0.0


def shade_pieces(capture: Capture, site: Site, weights, batch: int = 0) -> list[tuple[str, str, list[Shade], list[Shade]]]:
    """The one definition of shaded text, used by the report and the app: per key role of ``site``,
    ``(role, text, pieces, chips)``. ``weights [key]`` is a row over the site's key axis (e.g. a query word's
    aggregate row, :func:`query_weights`). Each non-padding token with a character span is a piece of the
    text; a token whose span overlaps the previous one or is empty (byte-level BPE quirks) is folded into the
    previous piece, its weight added. Tokens without a span (special tokens) are chips."""
    w = [float(x) for x in weights]
    out = []
    start = 0
    for role in site.key_input:
        rec = capture.records(role, batch)
        segs: list[list] = []  # [begin, end, weight, positions]
        chips: list[Shade] = []
        for i, (off, pad) in enumerate(zip(rec.offsets, rec.padding, strict=True)):
            p = start + i
            if pad or p >= len(w):
                continue
            if off is None:
                chips.append(Shade(None, None, (p,), (rec.tokens[i],), w[p], shade_alpha(w[p])))
                continue
            a, b = int(off[0]), int(off[1])
            if segs and a < segs[-1][1]:  # overlapping spans: fold into the previous one
                a = segs[-1][1]
            if a >= b:
                if segs:
                    segs[-1][2] += w[p]
                    segs[-1][3].append(p)
                continue
            segs.append([a, b, w[p], [p]])
        pieces = [Shade(a, b, tuple(pos), tuple(rec.tokens[q - start] for q in pos), weight, shade_alpha(weight))
                  for a, b, weight, pos in segs]
        out.append((role, rec.text, pieces, chips))
        start += len(rec.ids)
    return out


def shade_segments(text: str, pieces: list[Shade]) -> tuple[list[tuple[str, Shade]], str]:
    """A key role's text cut at its shaded pieces (:func:`shade_pieces`, in text order): ``(before, piece)``
    pairs, ``before`` the unshaded text since the previous piece, and the text after the last piece. The
    report and the app both lay their shaded text out from this."""
    out, cursor = [], 0
    for piece in pieces:
        out.append((text[cursor:piece.start], piece))
        cursor = piece.end
    return out, text[cursor:]


@functools.cache
def templates():
    """The Jinja2 templates under ``inspector/ui/templates`` (package data), autoescaping every value: the
    app's HTML here and the report's (:mod:`inspector.ui.report`). Undefined names raise."""
    import jinja2

    return jinja2.Environment(loader=jinja2.PackageLoader("inspector.ui", "templates"), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def shaded_html(
    capture: Capture, site: Site, weights: torch.Tensor | list[float], *, batch: int = 0,
    query_positions: list[int] | tuple[int, ...] = (), referent_positions: list[int] | tuple[int, ...] = (),
) -> str:
    """The key-side text with each piece shaded by its weight (:func:`shade_pieces`: opacity = weight,
    the report's shading too). Special tokens, which have no span, are shown as small chips. The
    query's tokens are outlined, the referents' underlined. Every piece of text is HTML-escaped (template
    ``shaded_text.html.j2``, autoescaped); each piece carries its key positions (``data-k``) and weight
    (``data-w``, the float's repr)."""
    qset, rset = set(query_positions), set(referent_positions)

    def data(piece: Shade, chip: bool, **extra) -> dict:
        cls = (["chip"] if chip else []) + (["q"] if qset & set(piece.positions) else []) + \
            (["r"] if rset & set(piece.positions) else [])
        ks = " ".join(map(str, piece.positions))
        return {"cls": " ".join(cls), "alpha": f"{piece.alpha:.3f}", "k": ks, "w": repr(piece.weight),
                "title": f"key {ks} {' '.join(piece.tokens)}: weight {piece.weight:.4f}", **extra}

    texts = []
    for role, text, pieces, chips in shade_pieces(capture, site, weights, batch):
        segments, tail = shade_segments(text, pieces)
        texts.append({"role": role, "tail": tail,
                      "segments": [data(p, False, before=before, text=text[p.start:p.end]) for before, p in segments],
                      "chips": [data(c, True, label=f"{c.tokens[0]} {c.weight:.2f}") for c in chips]})
    return templates().get_template("shaded_text.html.j2").render(texts=texts, multi=len(site.key_input) > 1)


# ---- bertviz -----------------------------------------------------------------------------------
def bertviz_kwargs(capture: Capture, start: int, size: int, *, batch: int = 0, decimals: int = 3) -> dict:
    """Keyword arguments for ``bertviz.head_view`` / ``model_view`` from the captured weights of a
    token window ``[start, start + size)`` (applied to each axis, clipped to its length).

    Single-stack models give ``attention`` and ``tokens``; encoder-decoder models the encoder,
    decoder and cross attentions and both token lists. Weights are rounded to ``decimals`` places,
    which keeps bertviz's JSON about three times smaller; rows are not renormalized, so weight on
    keys outside the window is simply not drawn.
    """
    if size > BERTVIZ_MAX_TOKENS:
        raise InspectorError(f"bertviz windows hold at most {BERTVIZ_MAX_TOKENS} tokens; got {size}: choose a smaller window")
    by_group = {(stack, kind): sites for stack, kind, sites in groups(capture)}

    def stack_of(sites: list[Site], q_axis: slice, k_axis: slice) -> list[torch.Tensor]:
        per_layer: dict[int, Site] = {}
        for s in sites:
            per_layer.setdefault(s.layer, s)
        out = []
        for _, s in sorted(per_layer.items()):
            w = capture.weights(s, batch, queries=q_axis)[:, :, k_axis]
            out.append(torch.round(w.double(), decimals=decimals).unsqueeze(0))  # float64: JSON "0.123", not 0.12300000339
        return out

    def toks(site: Site, which: str, ax: slice) -> list[str]:
        # tokens go to bertviz as they are; bertviz_html escapes them for its inline script (script_safe_json)
        return list(capture.tokens(site, which, batch)[ax])

    def win(site: Site, which: str) -> slice:
        n = site.query_len if which == "query" else site.key_len
        a = min(max(0, start), max(0, n - 1))
        return slice(a, min(n, a + size))

    enc = by_group.get(("encoder", "self"))
    if enc:
        dec = by_group.get(("decoder", "causal")) or by_group.get(("decoder", "self"))
        cross = by_group.get(("decoder", "cross"))
        e_ax = win(enc[0], "query")
        kwargs: dict = {
            "encoder_attention": stack_of(enc, e_ax, e_ax),
            "encoder_tokens": toks(enc[0], "query", e_ax),
        }
        if dec:
            d_ax = win(dec[0], "query")
            kwargs["decoder_attention"] = stack_of(dec, d_ax, d_ax)
            kwargs["decoder_tokens"] = toks(dec[0], "query", d_ax)
            if cross:
                kwargs["cross_attention"] = stack_of(cross, d_ax, win(cross[0], "key"))
        return kwargs
    # single stack: the self / causal sites (cross sites of a single-stack model have no square matrix)
    sites = [s for stack, kind, ss in groups(capture) if kind != "cross" for s in ss]
    if not sites:
        raise InspectorError("this capture has no self-attention sites for bertviz to draw")
    ax = win(sites[0], "query")
    same_len = [s for s in sites if s.query_len == sites[0].query_len and s.key_len == sites[0].key_len]
    return {"attention": stack_of(same_len, ax, ax), "tokens": toks(sites[0], "query", ax)}


def default_vendor_dir() -> Path:
    """Where ``make assets`` puts bertviz's scripts: ``$INSPECTOR_VENDOR``, else ``apps/vendor/node_modules``
    of the checkout this package runs from (what the app serves)."""
    import os

    given = os.environ.get("INSPECTOR_VENDOR")
    return Path(given) if given else Path(__file__).resolve().parents[2] / "apps" / "vendor" / "node_modules"


def vendor_scripts(vendor_dir: str | Path) -> dict[str, str]:
    """The three scripts bertviz needs, read from ``apps/vendor/node_modules`` (``make assets``)."""
    root = Path(vendor_dir)
    out = {}
    for name, rel in VENDOR_FILES.items():
        path = root / rel
        if not path.is_file():
            raise InspectorError(
                f"bertviz needs {name} at {path}, which is missing: run `make assets` "
                "(npm install --prefix apps/vendor) and reload the app"
            )
        out[name] = path.read_text(encoding="utf-8").replace("</script", "<\\/script")
    return out


# bertviz's model view draws at a fixed width (970 px): in a narrower frame or notebook cell its last heads were
# cut off. Each bertviz SVG drawn at a fixed size in pixels gets a viewBox from that width and height, so CSS
# scales it down to fit. An SVG whose width or height is relative (the head view's width="100%") already follows
# its container and keeps its own coordinates: read as a viewBox, "100%" made 100 units fill the frame and drew
# the head view ~9x too large (tokens 100+ px tall, most heads outside the frame).
FIT_WIDTH = (
    '<style>[id^="bertviz-"] svg[viewBox]{max-width:100%;height:auto}</style>\n'
    "<script>(function () {"
    "var px = /^\\s*[0-9.]+\\s*(px)?\\s*$/;"
    "function fit() { document.querySelectorAll('[id^=\"bertviz-\"] svg:not([viewBox])').forEach(function (s) {"
    "var w = s.getAttribute('width'), h = s.getAttribute('height');"
    "if (px.test(w || '') && px.test(h || '')) {"
    " s.setAttribute('viewBox', '0 0 ' + parseFloat(w) + ' ' + parseFloat(h)); } }); }"
    "new MutationObserver(fit).observe(document.documentElement, {childList: true, subtree: true});"
    "})();</script>\n"
)
_CDN_SCRIPT = re.compile(r'<script\s+src="https://[^"]*require[^"]*"\s*>\s*</script>', re.IGNORECASE)
_REQUIRE_CONFIG = re.compile(r"require\.config\(\{\s*paths:\s*\{[^}]*\}\s*\}\);", re.DOTALL)


def offline_bertviz(page: str, scripts: dict[str, str]) -> str:
    """bertviz's returned HTML with require.js, d3 and jQuery inlined and its CDN URLs removed, and its
    drawing scaled to the width it is shown in (:data:`FIT_WIDTH`).

    require.js replaces the CDN ``<script src>``; d3 and jQuery run as plain scripts (with ``define``
    hidden, so they set globals instead of registering anonymous modules) and are then registered
    under the names bertviz asks for; the ``require.config`` that pointed those names at cdnjs is
    dropped. The result fetches nothing.
    """
    if not _CDN_SCRIPT.search(page) or not _REQUIRE_CONFIG.search(page):
        raise InspectorError("this bertviz version's HTML has an unexpected layout: the app cannot serve its scripts offline")
    head = templates().get_template("bertviz_scripts.html.j2").render(scripts=scripts)
    page = _CDN_SCRIPT.sub(lambda _: head + FIT_WIDTH, page, count=1)
    page = _REQUIRE_CONFIG.sub("/* d3 and jquery are defined inline above */", page)
    if re.search(r"https?://cdn", page):
        raise InspectorError("bertviz's HTML still names a CDN after rewriting: the app cannot show it offline")
    return page


def bertviz_html(capture: Capture, view: str, start: int, size: int, vendor_dir: str | Path, *, batch: int = 0,
                 layer: int | None = None, heads: list[int] | None = None) -> str:
    """bertviz's head or model view of a token window, as self-contained HTML. For the head view,
    ``layer`` (an index into the captured layers) and ``heads`` pick what is shown first. The model view
    takes windows of at most :data:`MODEL_VIEW_MAX_TOKENS` tokens (:class:`InspectorError` otherwise)."""
    import bertviz

    if view == "model" and size > MODEL_VIEW_MAX_TOKENS:
        raise InspectorError(f"bertviz's model view draws every weight of every head: windows of at most "
                             f"{MODEL_VIEW_MAX_TOKENS} tokens, got {size}: choose a smaller window (or the head view)")

    scripts = vendor_scripts(vendor_dir)
    kwargs = bertviz_kwargs(capture, start, size, batch=batch)
    if view == "head":
        page = bertviz.head_view(**kwargs, layer=layer, heads=heads, html_action="return").data
    elif view == "model":
        page = bertviz.model_view(**kwargs, html_action="return").data
    else:
        raise InspectorError(f"unknown bertviz view {view!r}: use head or model")
    template = (Path(bertviz.__file__).parent / f"{view}_view.js").read_text(encoding="utf-8")
    return offline_bertviz(script_safe_json(page, template), scripts)


def html_size(page: str) -> str:
    """The UTF-8 size of ``page`` for a label: kB below 100 kB, else MB."""
    n = len(page.encode("utf-8"))
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} kB"


# ---- text from a capture, errors and scales (app safety and readability) ----------------------------
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>#!|~:$^&])")
_MD_LINE_START = re.compile(r"^(\s*)([-+=]|\d+(?=[.)]))")


def md_text(value: object) -> str:
    """``value`` as literal text inside Streamlit Markdown: every Markdown, HTML, emoji-shortcode
    (``:x:``), colour-directive and LaTeX (``$``) character backslash-escaped, line breaks made spaces.

    Strings from a capture file (site names, the model name, tokens) are untrusted: a site name
    ``x![s](http://host/s.png)`` must not make the browser fetch an image, a backtick must not end a
    code span."""
    text = str(value).replace("\r", " ").replace("\n", " ")
    text = _MD_SPECIAL.sub(r"\\\1", text)
    return _MD_LINE_START.sub(lambda m: m.group(1) + "\\" + m.group(2), text)


_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[\\/][^\s'\"\\/:,;)]+)+[\\/]?")


def recomputed_weights(capture: Capture) -> int:
    """How many attention weights the views make for ``capture`` beyond those the file stores as they are:
    batch x heads x queries x keys summed over the sites that store no weights (recomputed from Q and K) and the
    banded or block-local sites (long documents: their compact band and global rows are expanded to every key).
    Read from the header alone: nothing is computed."""
    return sum(capture.batch_size * s.num_heads * s.query_len * s.key_len for s in capture.sites
               if "weights" not in s.parts or s.band is not None)


def check_app_work(capture: Capture, limit: int | None = None) -> None:
    """Refuse, in one line naming the fix, a capture whose weights the app would recompute or expand past ``limit``
    (:func:`recomputed_weights`; default :data:`APP_MAX_RECOMPUTED`, read when called): before any work is done."""
    limit = APP_MAX_RECOMPUTED if limit is None else limit
    n = recomputed_weights(capture)
    if n > limit:
        lazy = sum(1 for s in capture.sites if "weights" not in s.parts)
        banded = sum(1 for s in capture.sites if s.band is not None)
        what = " and ".join(w for w in (f"{lazy} without stored weights" if lazy else "",
                                        f"{banded} banded (long-document)" if banded else "") if w)
        raise InspectorError(f"this capture declares {n:,} attention weights to recompute or expand (heads x queries x "
                             f"keys over its {what} sites), more than the app's bound of {limit:,}: capture a shorter "
                             "text (or with stored weights), or use the CLI (inspector rank FILE)")


def app_error(exc: BaseException) -> str:
    """One line for an error box: the message without server paths (each absolute path shortened to
    its last component) and never a traceback; exceptions that are not :class:`InspectorError` are
    named by their type."""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    msg = _PATH.sub(lambda m: Path(m.group(0).rstrip("/\\")).name or "/", msg)[:300]
    if isinstance(exc, InspectorError):
        return msg
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def metric_domain(metric: str, max_keys: int) -> tuple[float, float]:
    """The fixed colour domain of a grid metric, so grids of different heads and captures compare:
    ``[0, log n]`` nats for ``entropy`` (``n`` = the longest key axis), ``[0, 1]`` for every other
    metric (normalized entropy, masses, top-key weight, split score)."""
    if metric == "entropy":
        return 0.0, math.log(max(2, max_keys))
    return 0.0, 1.0


def heatmap_positions(site: Site, query_positions, size: int, *, key_focus=(), rows_from=None,
                      keys_from=None) -> tuple[list[int], list[int]]:
    """The query rows and keys (position lists, at most ``size`` each) of a heatmap of ``site`` around a
    query word's ``query_positions``: the one definition behind the app's Head page (:func:`heatmap_windows`),
    :func:`inspector.ui.show.head_heatmap` and the report's heatmap and step table. ``rows_from`` /
    ``keys_from``: the candidate positions of each axis (default all; the report passes the non-padding ones).

    On a causal site (queries and keys one text): the rows up to the last query position and the keys they
    could see, ending at the last row's own key (:func:`focus_window` with ``anchor="end"``, keeping
    ``key_focus``, e.g. the referents, in view). Else rows centred on the query, and keys centred on the
    query and ``key_focus`` (same text) or on ``key_focus`` alone (different texts). Without query
    positions: the first ``size`` rows and the keys they see (causal) or the first ``size`` keys."""
    rows_c = list(range(site.query_len) if rows_from is None else rows_from)
    keys_c = list(range(site.key_len) if keys_from is None else keys_from)
    q = [int(p) for p in query_positions]
    same = site.query_input == site.key_input
    if site.kind == "causal" and same:
        rows = focus_window(rows_c, q, size, anchor="end") if q else rows_c[:max(1, size)]
        offset = site.key_len - site.query_len  # a decoder continuing a cached prefix sees that prefix too
        stop = min(site.key_len, (rows[-1] if rows else -1) + 1 + offset)
        seen = [k for k in keys_c if k < stop]
        return rows, focus_window(seen, [stop - 1, *[p + offset for p in q], *key_focus], size, anchor="end")
    if not q:
        return rows_c[:max(1, size)], keys_c[:max(1, size)]
    return focus_window(rows_c, q, size), focus_window(keys_c, [*(q if same else []), *key_focus], size)


def heatmap_windows(site: Site, query_index: int | None, size: int, centre_key: int | None = None) -> tuple[slice, slice]:
    """The query rows and keys of a heatmap window of at most ``size`` x ``size`` that follows the query
    ``query_index`` (the app's Head page and :func:`inspector.ui.show.head_heatmap` alike), as slices:
    :func:`heatmap_positions` of that one query (contiguous), keys on ``centre_key`` (e.g. the query's
    strongest key) when queries and keys are different texts."""
    same = site.query_input == site.key_input
    focus = [centre_key] if centre_key is not None and not same else []
    rows, keys = heatmap_positions(site, [] if query_index is None else [query_index], size, key_focus=focus)
    return _run(rows), _run(keys)


def causal_keys(site: Site, queries: slice, size: int) -> slice:
    """The key window a causal site's query rows ``queries`` could see: the ``size`` keys ending at the
    last row's own position (keys after it are masked for every row of the window)."""
    offset = site.key_len - site.query_len  # a decoder continuing a cached prefix sees that prefix too
    stop = min(site.key_len, queries.stop + offset)
    return _run(focus_window(range(stop), [stop - 1], size, anchor="end"))


def visible_frame(capture: Capture, site: Site, frame: pd.DataFrame, batch: int = 0) -> pd.Series:
    """For each row of a :func:`heatmap_frame`, whether its query may see its key (the capture's own
    mask; padding keys and, for maskless causal captures, future keys are not visible)."""
    from inspector.analysis.keys import visible_keys

    if not len(frame):
        return pd.Series([], dtype=bool)
    q0, q1 = int(frame["query_index"].min()), int(frame["query_index"].max()) + 1
    _, pad_k = capture.flags(site, "key", batch)
    vis = visible_keys(capture, site, batch, slice(q0, q1), pad_k)[0]  # [query, key] (head 0 of a per-head mask)
    qi = torch.as_tensor(frame["query_index"].to_numpy() - q0)
    ki = torch.as_tensor(frame["key_index"].to_numpy().copy())
    return pd.Series(vis[qi, ki].numpy(), index=frame.index, name="visible")


def script_safe_json(page: str, template: str) -> str:
    """bertviz's page with ``<``, ``>`` and ``&`` escaped (``\\u003c`` ...) inside the JSON it pasted into
    its inline script in place of ``PYTHON_PARAMS`` in ``template`` (head_view.js / model_view.js).

    A token ``</script>`` or ``<!--<script>`` would otherwise end or suspend the inline script and blank
    the view; JSON has no ``<`` outside strings, and ``\\u003c`` reads back as the same character."""
    before, marker, after = template.partition("PYTHON_PARAMS")
    if not marker:
        raise InspectorError("this bertviz version's script has no PYTHON_PARAMS marker: the app cannot escape its tokens")
    head = before[-200:]
    start = page.find(head)
    if start < 0:
        raise InspectorError("bertviz's page does not contain its own script: the app cannot escape its tokens")
    start += len(head)
    try:
        _, end = json.JSONDecoder().raw_decode(page, start)  # the exact end of the pasted JSON
    except ValueError:
        raise InspectorError("bertviz's page holds no JSON where its script expects it: the app cannot escape its tokens") from None
    blob = page[start:end]
    safe = blob.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return page.replace(blob, safe)  # bertviz pastes it twice: also into a comment of the same script


def sandboxed(page: str, height: int) -> str:
    """``page`` inside an ``<iframe sandbox="allow-scripts">``: its scripts run in an opaque origin,
    with no access to the app's page, cookies or Streamlit's connection."""
    return templates().get_template("sandboxed.html.j2").render(page=page, height=int(height))
