"""Text from a capture (tokens, site and model names) carried into an Altair chart as data, never as markup.

Wherever Altair emits HTML (``chart.save("x.html")``, ``chart.to_html()``, the notebook's ``html`` renderer) it
writes the chart's spec with ``json.dumps`` into an inline ``<script>``, and ``json.dumps`` leaves ``<``, ``>`` and
``&`` as they are: a token ``</script><script>...`` (a tokenizer file may hold any string as a token) would end
that script and run its own. So the charts of :mod:`inspector.ui.show` and :mod:`inspector.ui.routes_figure`
carry every text column of their data, and every title made from such text, with ``%``, ``<``, ``>`` and ``&``
written as ``%25``, ``%3C``, ``%3E`` and ``%26`` (:func:`encode`), and undo it inside Vega: a ``calculate``
transform per text column (:func:`decode_columns`), an expression for a title (:func:`title`). Vega then draws
the text as it is, while no serialisation of the spec, by any renderer or ``json_kwds``, holds a markup
character of it. Numbers and booleans are untouched; the chart's ``data`` holds the encoded text.
"""

from __future__ import annotations

import json

import pandas as pd

_ENCODE = str.maketrans({"%": "%25", "<": "%3C", ">": "%3E", "&": "%26"})
# undone in this order: every % of the encoded text starts one code, so %25 goes last
_DECODE = (("3C", "\\u003c"), ("3E", "\\u003e"), ("26", "\\u0026"), ("25", "%"))


def encode(text: str) -> str:
    """``text`` with ``%``, ``<``, ``>`` and ``&`` written as ``%25``, ``%3C``, ``%3E``, ``%26``."""
    return text.translate(_ENCODE)


def decoded(expr: str) -> str:
    """A Vega expression: the string ``expr`` evaluates to, with :func:`encode` undone."""
    for code, char in _DECODE:
        expr = f"replace({expr}, /%{code}/g, '{char}')"
    return expr


def text_columns(df: pd.DataFrame) -> list[str]:
    """The columns of ``df`` that hold strings (object or string dtype with a string value)."""
    return [c for c in df.columns if (pd.api.types.is_object_dtype(df[c]) or pd.api.types.is_string_dtype(df[c]))
            and df[c].map(lambda v: isinstance(v, str)).any()]


def encode_frame(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """A copy of ``df`` with the strings of its text columns encoded, and those columns' names."""
    cols = text_columns(df)
    out = df.copy()
    for c in cols:
        out[c] = df[c].map(lambda v: encode(v) if isinstance(v, str) else v)
    return out, cols


def decode_columns(chart, columns: list[str]):
    """``chart`` with one ``calculate`` transform per column of ``columns`` that undoes :func:`encode`."""
    if not columns:
        return chart
    return chart.transform_calculate(**{c: decoded(f"datum[{json.dumps(c)}]") for c in columns})


def chart(df: pd.DataFrame):
    """``alt.Chart`` over ``df`` with its text encoded in the spec and decoded by the chart's own transforms."""
    import altair as alt

    data, cols = encode_frame(df)
    return decode_columns(alt.Chart(data), cols)


def title(text: str):
    """A chart title (``alt.TitleParams``) showing ``text`` as it is, carried encoded in an expression."""
    import altair as alt

    return alt.TitleParams(text=alt.ExprRef(expr=decoded(json.dumps(encode(text)))))


def order_column(df: pd.DataFrame, column: str, order: list | None = None) -> tuple[pd.DataFrame, str]:
    """A copy of ``df`` with a column ``<column>_order`` holding each value's place in ``order`` (default: the
    order the values first appear in), and that column's name, to sort a channel with
    ``alt.EncodingSortField(name, op="min")``.

    Never sort a channel by a list of capture text: Vega-Lite writes such a list into a Vega expression, and Vega's
    expression parser refuses a string holding U+2028 or U+2029 ("Unexpected token ILLEGAL"), so a token or a
    name with one would leave the chart undrawn. A sort by a number field carries no text into an expression."""
    values = list(dict.fromkeys(df[column])) if order is None else list(order)
    place = {v: i for i, v in enumerate(values)}
    name = f"{column}_order"
    out = df.copy()
    out[name] = [place.get(v, len(values)) for v in df[column]]
    return out, name
