"""Checks of words and capture files before torch loads (issue 28): a word in a text or in a capture's header
(with the nearest words as a hint), ``--variant`` files, a capture's ``--batch``, ``--site``, ``--head``,
``--query-index``, ``--occurrence`` and ``--referents``."""

from __future__ import annotations

import bisect
import re

from inspector.cli.arguments import short_repr
from inspector.cli.files import read_text, read_utf8
from inspector.errors import InspectorError


def check_word_in(word: str | None, text: str, where: str, *, case_sensitive: bool = True) -> None:
    """Refuse (before a model loads) a word that is not in ``text``, naming ``where`` the text is from, by the
    analysis's own rule (:func:`inspector.store.words.occurs_in`: whole-word, case-sensitive unless
    ``case_sensitive`` is false). A token index (``@7``) is checked once the text is tokenized."""
    from inspector.store.words import is_token_index, occurs_in, shown

    if word is None or not word.strip() or is_token_index(word):
        return
    if not occurs_in(text, word, case_sensitive):
        rule = "whole-word, case-sensitive" if case_sensitive else "whole-word, any case"
        raise InspectorError(f"the word {shown(word)} is not in {where} ({rule}){nearest_hint(word, [text])}: pick a "
                             "word every text holds, or fix the file")


def check_global_texts(spans: str | None, texts: dict[str, str | None]) -> None:
    """``--global SPANS`` checked, before the model loads, against every text whose tokens it will mark
    (``texts``: what to call it in a message -> the text; the source, each ``--variant``, a ``--patch-from``
    file): an empty entry, a backwards range or a word one of them lacks is one line naming that text
    (:func:`inspector.capture.inputs.check_global_words`)."""
    if spans is None:
        return
    from inspector.capture.inputs import check_global_words
    from inspector.store.words import token_index

    for spec in spans.split(","):
        token_index(spec, "--global")  # '@٣': one line saying ASCII digits, not "no token index"
    for where, text in texts.items():
        if text is not None:
            check_global_words(spans.split(","), text, where)


def parse_variants(items: list[str] | None, query: str | None = None) -> dict[str, str]:
    """``NAME=FILE`` items as ``{name: text}``; refuses (before the model loads) a bad name, a file that is
    missing or not UTF-8, and a file without the query word."""
    out = {}
    for item in items or []:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise InspectorError(f"--variant takes NAME=FILE, got {item!r}")
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}", name) or ".." in name:
            raise InspectorError(f"variant name {short_repr(name, 40)} must be 1 to 64 letters, digits, '_', '-' or '.' (it "
                                 "names the variant's files), e.g. --variant quoted=FILE")
        if name in out:  # the second would replace the first's text, files and rows without a word
            raise InspectorError(f"--variant {name} is given twice: give each variant its own name, e.g. {name}2=FILE")
        out[name] = read_utf8(file, "variant")
        if not out[name].strip():
            raise InspectorError(f"the variant file {file!r} (--variant {name}=...) is empty: give a version of the "
                                 "source text")
        check_word_in(query, out[name], f"the variant file {file} (--variant {name}=...)")
    return out


# ---- checks before torch, transformers or pandas load (issue 28) --------------------------------------------
# Each command runs these first, in pure Python: a mistake costs a second, not an import of torch and a model.
def check_capture_arg(path: str, *, batch: int | None = None, site: str | None = None, head: int | None = None,
                      query_index: int | None = None) -> dict:
    """The capture file ``path``'s inspector header (:func:`inspector.store.header.read`: a folder, a missing file,
    a file that is no safetensors capture are one line), with ``--batch``, ``--site``, ``--head`` and
    ``--query-index`` checked against it where given. What the header does not state clearly is left to the full
    check when the file is opened."""
    from inspector.store import header

    meta = header.read(path)
    if batch is not None:
        rows = header.batch_size(meta)
        if batch < 0 or (rows is not None and batch >= rows):
            have = ("it has one row, 0" if rows == 1 else f"it has rows 0..{rows - 1}") if rows else "rows count from 0"
            raise InspectorError(f"--batch {batch} is not a row of {path}: {have}")
    if site is not None:
        sites = header.sites(meta)
        if sites and site not in sites:
            near = ", ".join(sorted(sites)[:6])
            raise InspectorError(f"no site {site!r} in {path}; sites are: {near}{' ...' if len(sites) > 6 else ''}")
        d = sites.get(site, {})
        # a count the header states as no positive whole number is the full check's to name (field and problem)
        n, q = (v if type(v) is int and v >= 1 else None for v in (d.get("num_heads"), d.get("query_len")))
        if head is not None and (head < 0 or (n is not None and head >= n)):
            have = ("it has one head, 0" if n == 1 else f"it has heads 0..{n - 1}") if n is not None else "heads count from 0"
            raise InspectorError(f"head {head} does not exist at {site}: {have}")
        if query_index is not None and q is not None and not 0 <= query_index < q:
            raise InspectorError(f"query index {query_index} is outside {site}'s query axis (0..{q - 1})")
    if query_index is not None and query_index < 0:
        raise InspectorError(f"--query-index counts from 0, got {query_index}")
    return meta


def check_capture_words(path: str, meta: dict, words: list[str], what: str, *, roles: list[str] | None = None,
                        batch: int = 0, case_sensitive: bool = True, occurrence: int | None = None,
                        axis: tuple[str, int | None] | None = None) -> None:
    """Refuse a word (``what`` names it: query, referent) that none of the capture's texts in ``roles`` (all when
    None) holds, by the analysis's rule (:func:`inspector.store.words.occurs_in`), naming the nearest words; one
    the texts hold but no token covers (an emoji read as ``[UNK]``); ``occurrence`` beyond the word's occurrences in
    those texts (their count bounds what any site's axis holds); a token index (``@7``) past ``axis`` (its name and
    length, where the header states it). Passes where the header names no text for those roles."""
    from inspector.store import header
    from inspector.store.words import (
        is_token_index,
        iter_matches,
        matches,
        occurs_in,
        shown,
        times,
        token_index,
    )

    for word in words:
        if is_token_index(word):
            span = token_index(word, "token index")  # a number of thousands of digits is one line now
            if span is not None and axis is not None and isinstance(axis[1], int) and span[1] >= axis[1]:
                raise InspectorError(f"token index {word.strip()} is outside the {axis[0]} (0..{axis[1] - 1}): give "
                                     f"@0 to @{axis[1] - 1}")
    texts = header.texts(meta, roles, batch)
    if not texts:
        return
    rule = "whole-word, case-sensitive" if case_sensitive else "whole-word, any case"
    records = _header_records(meta, list(texts), batch)  # once for every word
    covers = [_Coverage(rec) for rec in records]
    for word in words:
        if not word.strip() or is_token_index(word):
            continue
        if not any(occurs_in(t, word, case_sensitive) for t in texts.values()):
            raise InspectorError(f"{what} {shown(word)} is not in the {' + '.join(texts)} text of {path} ({rule})"
                                 f"{nearest_hint(word, texts.values())}: check the spelling or give token indices like @7")
        if records and not any(cover(a, b) for cover in covers for a, b in iter_matches(cover.text, word, case_sensitive)):
            unk = [i for rec in records for i in _unknown_tokens(rec)]
            where = f" (the tokenizer reads it as {records[0]['tokens'][unk[0]]!s}, at @{unk[0]})" \
                if unk and len(records) == 1 else ""
            raise InspectorError(f"{what} {shown(word)} has no token of its own in {path}{where}: give token indices "
                                 f"like @{unk[0] if unk else 7} instead")
        if occurrence is not None and what == "query":
            n = sum(len(matches(t, word, case_sensitive)) for t in texts.values())
            if occurrence > n:
                raise InspectorError(f"{what} {shown(word)} occurs {times(n)} in the {' + '.join(texts)} text of "
                                     f"{path}, so --occurrence must be {'1' if n == 1 else f'1..{n}'}")


HINT_LENGTH = 64  # characters of a word that gets nearest-word hints: a longer one gets none (difflib is quadratic)


def nearest_hint(word: str, texts) -> str:
    """``; nearest: a, b`` -- the words of ``texts`` closest to ``word`` (difflib, as the analysis's own message
    names them), or nothing where none is close. Bounded work: nothing for a word of more than
    :data:`HINT_LENGTH` characters, and only the text's words whose length could reach difflib's ratio of 0.5
    (a third to three times the word's) are compared."""
    import difflib

    word = word.strip()
    if not word or len(word) > HINT_LENGTH:
        return ""
    found: set[str] = set()
    for text in texts:
        found.update(w for w in re.findall(r"\w+", text) if len(word) <= 3 * len(w) and len(w) <= 3 * len(word))
    near = difflib.get_close_matches(word, sorted(found), n=4, cutoff=0.5)
    return f"; nearest: {', '.join(near)}" if near else ""


def _header_records(meta: dict, roles: list[str], batch: int) -> list[dict]:
    """The header's input records of ``roles`` (batch row ``batch``) whose tokens, offsets and padding agree in
    length; none where one of them does not (then the full check decides)."""
    out = []
    for r in meta.get("inputs") or []:
        if not (isinstance(r, dict) and r.get("batch") == batch and r.get("role") in roles):
            continue
        toks, offs, pad = r.get("tokens"), r.get("offsets"), r.get("padding")
        if not (isinstance(r.get("text"), str) and isinstance(toks, list) and isinstance(offs, list)
                and len(toks) == len(offs) and (pad is None or (isinstance(pad, list) and len(pad) == len(offs)))):
            return []
        if not all(o is None or (isinstance(o, list) and len(o) == 2 and all(isinstance(x, int) for x in o)) for o in offs):
            return []
        if not any(o is not None for o in offs):  # no offsets (a slow tokenizer): the analysis says so itself
            return []
        out.append(r)
    return out


class _Coverage:
    """Whether a token (not padding) of the header record ``rec`` overlaps characters ``[start, end)``: its tokens'
    spans sorted by start with the running largest end, so each question is one bisection (issue 40: a look at
    every token per occurrence made a frequent word quadratic)."""

    def __init__(self, rec: dict):
        import itertools

        pad = rec.get("padding") or [False] * len(rec["offsets"])
        spans = sorted((o[0], o[1]) for o, p in zip(rec["offsets"], pad, strict=True) if o is not None and not p)
        self.text = rec["text"]
        self.starts = [a for a, _ in spans]
        self.reach = list(itertools.accumulate((b for _, b in spans), max))

    def __call__(self, start: int, end: int) -> bool:
        k = bisect.bisect_left(self.starts, end)  # the tokens starting before the end; one of them must end after start
        return k > 0 and self.reach[k - 1] > start


def _unknown_tokens(rec: dict) -> list[int]:
    """Positions of the record's unknown-word tokens (``[UNK]``, ``<unk>``: no character offsets)."""
    return [i for i, (t, o) in enumerate(zip(rec["tokens"], rec["offsets"], strict=True))
            if o is None and isinstance(t, str) and "unk" in t.lower()]


def check_in_text(word: str | None, text: str, what: str, where: str, *, case_sensitive: bool = True) -> None:
    """Refuse ``word`` (``what`` names it: ``--query``, referent) when ``text`` (``where`` names it) does not hold it,
    by the analysis's rule (:func:`inspector.store.words.occurs_in`); a token index (``@7``) is checked once the text
    is tokenized."""
    from inspector.store.words import is_token_index, occurs_in, shown, token_index

    if word is not None and is_token_index(word):
        token_index(word, "token index")  # a number of thousands of digits is one line now
    if word is None or not word.strip() or is_token_index(word) or occurs_in(text, word, case_sensitive):
        return
    rule = "whole-word, case-sensitive" if case_sensitive else "whole-word, any case"
    raise InspectorError(f"{what} {shown(word)} is not in {where} ({rule}){nearest_hint(word, [text])}: check the "
                         "spelling, or pick a word the text says")


def check_source_words(args, source: str) -> None:
    """``ablate``, ``effects``, ``attribute``, ``routes``: the output text (``--output``/``--output-file``) not empty,
    ``--query`` in the source (where a model without an LM head reads it), and --contrast's WRONG word where the
    metric is read: in the output, or without one (and without ``--generate``) in the source."""
    from inspector.store.specs import contrast_words

    said = read_text(getattr(args, "output", None), getattr(args, "output_file", None), "output")
    if said is not None and not said.strip():
        raise InspectorError("the output text is empty: pass what the model said with --output, or --generate N")
    check_in_text(getattr(args, "query", None), source, "--query", "the source text")
    if getattr(args, "contrast", None) and not getattr(args, "generate", None):
        wrong = contrast_words(args.contrast)[1]
        check_in_text(wrong, said if said is not None else source, "--contrast's WRONG word",
                      "the output" if said is not None else "the source text")


def check_occurrence(occurrence: int | None) -> None:
    """``--occurrence`` counts from 1."""
    if occurrence is not None and occurrence < 1:
        raise InspectorError(f"--occurrence counts from 1, got {occurrence}: give 1 for the first occurrence")


def check_referents_arg(referents: str | None) -> list[str] | None:
    """``--referents A,B`` as its words (two or more different ones, :func:`inspector.store.specs.clean_referents`)."""
    from inspector.store.specs import clean_referents

    return None if referents is None else clean_referents(referents.split(","))
