"""The app's bound on the work a capture may ask for (:func:`check_app_work`, refused before any work) and its
one-line error messages without server paths (:func:`app_error`)."""

from __future__ import annotations

import re
from pathlib import Path

from inspector.errors import InspectorError
from inspector.store.capture_file import Capture

# the app recomputes a lazy capture's weights and expands a banded (long-document) site's compact band to every
# key (Overview ranks every head): a crafted file of 2 MB can declare 2.4e9 of them and hold the server for
# minutes, so the app refuses more than this many before any work
APP_MAX_RECOMPUTED = 1_000_000_000


# the Head page lists a head's Q, K and V entry by entry and Step by step charts its output vector; real heads have
# 64 to 256 entries: a crafted header declaring 300,000 held the server for seconds and the browser for minutes
APP_MAX_HEAD_DIM = 4096


def check_head_dims(site, limit: int | None = None) -> None:
    """Refuse, in one line naming the fix, a site whose Q/K (``d_head``) or V (``d_v``) vectors have more than
    ``limit`` entries a head (default :data:`APP_MAX_HEAD_DIM`, read when called), where the site stores them:
    the views that list or chart them entry by entry are not drawn. Read from the header alone."""
    limit = APP_MAX_HEAD_DIM if limit is None else limit
    sizes = {"d_head": site.d_head if {"q", "k"} & set(site.parts) else 0, "d_v": site.d_v if "v" in site.parts else 0}
    over = [f"{k} {v:,}" for k, v in sizes.items() if v > limit]
    if over:
        raise InspectorError(f"site {site.name} has vectors of {' and '.join(over)} entries a head, more than the app "
                             f"lists ({limit:,}): use the CLI (inspector explain FILE --site SITE --head H --query-index I "
                             "--csv -)")


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


# an absolute path starts the message or follows a space, a quote, a bracket or "=": a "/" inside a word (the
# "</script>" of a hostile site name, "out/lease") is the user's own text, shown as it is
_PATH = re.compile(r"(?:^|(?<=[\s'\"(\[=`]))(?:[A-Za-z]:)?(?:[\\/][^\s'\"\\/:,;)]+)+[\\/]?")


def app_error(exc: BaseException) -> str:
    """One line for an error box: the message without server paths (each absolute path shortened to
    its last component) and never a traceback; exceptions that are not :class:`InspectorError` are
    named by their type."""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    msg = _PATH.sub(lambda m: Path(m.group(0).rstrip("/\\")).name or "/", msg)[:300]
    if isinstance(exc, InspectorError):
        return msg
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
