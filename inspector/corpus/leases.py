"""A demo corpus made offline: generated lease clauses with varying party names, each with a query
and the referents it competes between -- the seed's "whose indemnity?" question asked of many
contracts.

Every row has ``id``, ``text``, ``query`` (``indemnity``, once per clause) and ``referents`` (the two
parties, as a list). Half the clauses name the parties only by role ("the Lessee", "the Lessor"), half
by company name, in several sentence orders, so a head's split varies from document to document.
Two rows are bad on purpose and are recorded as such by a scan: one has an empty text, one names a
referent that is not in its text. The same ``n`` and ``seed`` give the same rows on every machine.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from inspector.store.files import write_atomic

_FIRST = ["Acme", "Northwind", "Globex", "Initech", "Umbrella", "Stark", "Wayne", "Hooli", "Vandelay", "Soylent",
          "Tyrell", "Cyberdyne", "Gringotts", "Wonka", "Oscorp", "Aperture", "Monarch", "Dunder", "Pied Piper", "Prestige"]
_SECOND = ["Storage", "Holdings", "Properties", "Logistics", "Estates", "Trading", "Foods", "Partners", "Industries", "Realty"]
_SUFFIX = ["Ltd", "LLC", "Inc", "GmbH", "plc", "SA"]
_PREMISES = ["the warehouse at 12 Dock Road", "the premises", "the ground floor office", "unit 4 of the business park",
             "the retail space on Market Street", "the storage yard"]
_TEMPLATES = [
    "{a} shall indemnify {b} against all claims arising from the use of {p}. Such indemnity survives termination.",
    "{b} leases {p} to {a}. {a} shall indemnify {b} against all claims. This indemnity survives termination of this lease.",
    "Against all claims arising from {p}, {a} shall indemnify {b}; the indemnity survives termination.",
    "{a} and {b} agree that {a} shall indemnify {b} for any loss at {p}. Such indemnity shall survive termination.",
    "{b} shall give {a} notice of any claim concerning {p}, and {a} shall indemnify {b}. The indemnity survives termination.",
]


def _company(rng: random.Random, taken: set[str]) -> str:
    while True:
        name = f"{rng.choice(_FIRST)} {rng.choice(_SECOND)} {rng.choice(_SUFFIX)}"
        if name not in taken:
            taken.add(name)
            return name


def iter_lease_rows(n: int = 300, seed: int = 13) -> Iterator[dict]:
    """The rows of :func:`lease_rows` one at a time (a corpus of millions of rows never held in memory)."""
    if n < 10:
        raise ValueError("make at least 10 rows")
    rng = random.Random(seed)
    for i in range(n):
        if i % 2 == 0:
            a, b = "the Lessee", "the Lessor"
            refs = ["Lessee", "Lessor"]
        else:
            taken: set[str] = set()
            a, b = _company(rng, taken), _company(rng, taken)
            refs = [a, b]
        text = rng.choice(_TEMPLATES).format(a=a, b=b, p=rng.choice(_PREMISES))
        text = text[0].upper() + text[1:]
        if i == 7:
            text = ""
        if i == 8:
            refs = [refs[0], "Guarantor"]
        yield {"id": f"lease-{i:04d}", "text": text, "query": "indemnity", "referents": refs}


def lease_rows(n: int = 300, seed: int = 13) -> list[dict]:
    """``n`` rows (``n >= 10``); rows 7 (empty text) and 8 (a referent not in the text) are bad on purpose."""
    return list(iter_lease_rows(n, seed))


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> Path:
    """Write rows as JSONL, atomically, one row at a time (``rows`` may be a generator)."""

    def lines(f: BinaryIO) -> None:
        for r in rows:
            f.write((json.dumps(r, ensure_ascii=False) + "\n").encode("utf-8"))

    def fill(tmp: str) -> None:
        with open(tmp, "wb") as f:
            lines(f)
            f.flush()
            os.fsync(f.fileno())

    return write_atomic(path, fill, lines)
