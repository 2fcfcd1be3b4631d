"""How every view names a head: one function, three forms (the verdict's sentences and the app's culprit list, the
why paragraph, the bar charts)."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["head_label"]


def head_label(row: Mapping, form: str = "site") -> str:
    """A head's name from a table row (``layer``, ``head``, ``site``, ``kind``).

    ``form="site"``: ``layer 5 head 9 (encoder.layer.5.attention.self)``, how the verdict and its views name a
    culprit; ``"plain"``: ``layer 5 head 9``, where the site is said already; ``"short"``: ``L5 H9`` in bar charts
    (``L5 H9 cross`` for cross-attention; the site name when the row has no layer)."""
    if form == "short":
        where = f"L{row['layer']}" if "layer" in row else str(row.get("site", ""))
        return f"{where} H{row['head']}" + (f" {row['kind']}" if row.get("kind") == "cross" else "")
    plain = f"layer {int(row['layer'])} head {int(row['head'])}"
    if form == "plain":
        return plain
    if form == "site":
        return f"{plain} ({row['site']})"
    raise ValueError(f"head_label's form is site, plain or short, not {form!r}")
