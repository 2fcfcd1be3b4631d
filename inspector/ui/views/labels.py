"""Labels and text: a site's, a head's, a token's names in the app, token-search labels, sites grouped by stack and
kind, and :func:`md_text`, a capture's strings as literal Markdown."""

from __future__ import annotations

import re

from inspector.store.capture_file import Capture, Site


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
