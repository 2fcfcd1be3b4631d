"""Shaded text: a key text cut into pieces shaded by their weight (:class:`Shade`, the one definition the report and
the app share), drawn as HTML from the package's autoescaping Jinja2 :func:`templates`."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from inspector.store.capture_file import Capture, Site


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
