"""What a person names on the command line, parsed and checked by one rule each, in pure Python (no torch, no
pandas), so the command line refuses a malformed value before it imports either (issue 28) and the API applies the
same rule: a contrast ``RIGHT,WRONG`` (:func:`parse_contrast`, :func:`contrast_words`), referents
(:func:`clean_referents`), heads ``SITE:HEAD`` (:func:`parse_heads`) and the split rule's thresholds
(:func:`check_thresholds`), the ``--sites`` patterns of a capture (:func:`site_patterns`) and the largest
``--memory-budget`` any stage accepts (:data:`MEMORY_LIMIT_GIB`). Their stages re-export them (:mod:`inspector.analysis.question`,
:mod:`inspector.analysis.split`, :mod:`inspector.intervene.contrast`, :mod:`inspector.intervene.seam`)."""

from __future__ import annotations

import math
import re
import unicodedata

from inspector.errors import InspectorError

_INVISIBLE = ("Cc", "Cf", "Cs", "Co", "Cn")  # control, format, surrogate, private-use, unassigned
_MARKS = ("Mn", "Me", "Mc")  # combining marks


def has_visible(word: str) -> bool:
    """Whether ``word`` holds a character a tokenizer gives a token for: one that is not white space, not an
    invisible or control character (Unicode categories Cc, Cf, Cs, Co, Cn: a zero-width space, a soft hyphen, a
    byte-order mark) and not a combining mark (Mn, Me, Mc) alone."""
    return any(not c.isspace() and unicodedata.category(c) not in _INVISIBLE + _MARKS for c in word)


def _no_visible(what: str, raw: str, example: str) -> InspectorError:
    return InspectorError(f"{what} ({ascii(raw.strip() or raw)}) has no visible characters, so it tokenizes to no "
                          f"token: give a word the text holds, e.g. {example}")


def parse_contrast(spec: str | tuple[str, str] | None) -> tuple[str, str] | None:
    """``"RIGHT,WRONG"`` (or a pair) into its two words; None stays None. Raises :class:`InspectorError` unless
    there are two words, each holds a visible character (:func:`has_visible`: a zero-width space, a soft hyphen or
    an accent alone tokenizes to nothing, so the metric would be read at another word; the message names the
    word), the two differ, and neither holds an invisible or control character."""
    if spec is None:
        return None
    raw = list(spec.split(",") if isinstance(spec, str) else spec)
    given = spec if isinstance(spec, str) else ",".join(map(str, spec))  # a pair shown as the command line writes it
    if len(raw) != 2:
        raise InspectorError(f"--contrast takes two different words RIGHT,WRONG, e.g. Lessee,Lessor; got {given!r}")
    for i, word in enumerate(raw, 1):
        if not word:
            raise InspectorError(f"--contrast word {i} is empty: give two different words RIGHT,WRONG, e.g. Lessee,Lessor")
        if not has_visible(word):
            raise _no_visible(f"--contrast word {i}", word, "--contrast Lessee,Lessor")
    parts = [p.strip() for p in raw]
    if parts[0] == parts[1]:
        raise InspectorError(f"--contrast takes two different words RIGHT,WRONG, e.g. Lessee,Lessor; got {given!r}")
    visible = [re.sub(r"[\u200b-\u200f\u2060\ufeff\x00-\x1f\x7f]", "", p) for p in parts]
    if visible != parts:
        raise InspectorError(f"--contrast words must not hold invisible or control characters; got {spec!r}")
    return parts[0], parts[1]


def contrast_words(spec: str | tuple[str, str]) -> tuple[str, str]:
    """``RIGHT,WRONG`` (or a pair) into its two words, by :func:`parse_contrast`, and refused as well when a word
    holds an invisible or control character of any kind (Unicode categories Cc, Cf, Cs, Co, Cn: a soft hyphen, a
    bidi mark, a C1 control) or only combining marks: such a word tokenizes to nothing, so the metric would be read
    at the next word and labelled with this one. Raises :class:`InspectorError`."""
    words = parse_contrast(spec)
    for word in words:
        if any(unicodedata.category(c) in _INVISIBLE for c in word):
            raise InspectorError(f"--contrast words must not hold invisible or control characters; got {ascii(word)}")
        if all(unicodedata.category(c) in _MARKS or c.isspace() for c in word):
            raise InspectorError(f"--contrast word {ascii(word)} is only combining marks, which tokenize to nothing: "
                                 "give a word with letters, digits or symbols")
    return words


MEMORY_LIMIT_GIB = 65536.0  # the largest --memory-budget accepted (integrated gradients, effects, debug)


def check_memory_budget(gib: object, *, required: bool = False) -> None:
    """Refuse a ``--memory-budget`` (GiB) that is not a finite number above 0 and at most :data:`MEMORY_LIMIT_GIB`
    (``None`` means the default and passes, unless ``required``): :class:`InspectorError`, one line naming the flag.
    The one check that the CLI (before torch loads), effects, integrated gradients and sources all call."""
    import math

    if gib is None and not required:
        return
    if isinstance(gib, bool) or not isinstance(gib, (int, float)) or not math.isfinite(gib) \
            or not 0 < gib <= MEMORY_LIMIT_GIB:
        raise InspectorError(f"--memory-budget must be more than 0 and at most {MEMORY_LIMIT_GIB:g} GiB, got {gib!r}")
MAX_REFERENTS = 256  # referents a split compares at most: each is looked up in every text, before the model loads


def clean_referents(referents: list[str]) -> list[str]:
    """The referents stripped of surrounding spaces, blanks dropped; InspectorError unless two or more
    different ones remain, each with a visible character (:func:`has_visible`; the message names the referent),
    and no more than :data:`MAX_REFERENTS`."""
    refs = [r.strip() for r in referents if r.strip()]
    for i, r in enumerate(refs, 1):
        if not has_visible(r):
            raise _no_visible(f"referent {i}", r, "--referents Lessee,Lessor")
    if len(refs) > MAX_REFERENTS:
        raise InspectorError(f"{len(refs):,} referents given; a split compares at most {MAX_REFERENTS}: name the "
                             "words the head could confuse, e.g. --referents Lessee,Lessor")
    if len(refs) < 2 or len(set(refs)) != len(refs):
        raise InspectorError("give at least two different referents, e.g. --referents Lessee,Lessor")
    return refs


def parse_heads(spec: str, option: str = "--heads") -> list[tuple[str, int]]:
    """``SITE:HEAD[,SITE:HEAD...]`` (the head after the last colon) into ``[(site, head), ...]``; raises
    :class:`InspectorError` naming ``option`` for a malformed or empty list, and, apart, for a head number of more
    than 9 digits (no model has a billion heads: the site's heads are checked once the model is loaded)."""
    out = []
    for item in (x.strip() for x in spec.split(",")):
        if not item:
            continue
        site, sep, head = item.rpartition(":")
        head = head.strip()
        if sep and site.strip() and re.fullmatch(r"[0-9]{10,}", head):
            raise InspectorError(f"{option} takes SITE:HEAD with the head's number at its site, from 0; head "
                                 f"{head[:20]}{'...' if len(head) > 20 else ''} of {site.strip()[:60]!r} is far too large "
                                 "(no model has a billion heads)")
        if sep and site.strip() and head and not head.isascii() and all(c.isdigit() for c in head):
            raise InspectorError(f"{option} takes SITE:HEAD with the head's number in ASCII digits (0-9), e.g. "
                                 f"{site.strip()[:60]}:3; got {item!r}")
        if not sep or not site.strip() or not re.fullmatch(r"[0-9]{1,9}", head):  # not str.isdigit: '²' passes it
            raise InspectorError(f"{option} takes SITE:HEAD[,SITE:HEAD...], e.g. encoder.layer.5.attention.self:9; got {item!r}")
        out.append((site.strip(), int(head)))
    if not out:
        raise InspectorError(f"{option} is empty: name at least one head as SITE:HEAD")
    return out


def check_thresholds(**values: float) -> None:
    """The split rule's thresholds (``min_split=...``, ``min_mass=...``, ``min_lift=...``): each a finite number
    >= 0, else InspectorError naming its option."""
    for name, value in values.items():
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise InspectorError(f"--{name.replace('_', '-')} must be a finite number >= 0, got {value!r}")


def site_patterns(sites: list[str] | None) -> list[re.Pattern] | None:
    """The ``--sites`` patterns compiled (shell-style globs over site names), or None for every site.

    Raises :class:`InspectorError` naming the bad pattern."""
    if not sites:
        return None
    out = []
    for p in sites:
        try:
            out.append(re.compile(p))
        except re.error as exc:
            raise InspectorError(f"--sites {p!r} is not a valid regular expression ({exc}): escape special characters") from None
    return out
