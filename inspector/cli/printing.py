"""Printing on the terminal: a table fitted to its width, wrapped lines and status lines."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def format_table(df: pd.DataFrame, digits: int = 4, *, width: int | None = None, lead: tuple[str, ...] = (),
                 full: str | None = None, by: str | None = None) -> str:
    """``df`` as text at most ``width`` characters wide (default: the terminal's,
    :func:`inspector.ui.terminal.terminal_width`): the ``lead`` columns (the answer) first, floats to ``digits``
    places, strings escaped; columns that do not fit are left out, named on a last line (``full``: where they are)."""
    import pandas as pd

    if df.empty:
        return "(no rows)"
    from inspector.ui.terminal import escape, fit_table, terminal_width, wrap

    width = terminal_width() if width is None else width
    names = [str(c) for c in df.columns]
    first = [names.index(c) for c in dict.fromkeys(lead) if c in names]
    order = first + [i for i in range(len(names)) if i not in first]

    def cell(x) -> str:
        if x is None or (not isinstance(x, (list, tuple, dict)) and not hasattr(x, "__len__") and pd.isna(x)):
            return ""
        return escape(x if isinstance(x, str) else str(x))

    header, numeric, columns = [], [], []
    for i in order:
        col = df.iloc[:, i]
        header.append(escape(names[i]))
        if pd.api.types.is_float_dtype(col):
            columns.append(["" if pd.isna(x) else f"{x:.{digits}f}" for x in col])
        else:
            columns.append([cell(x) for x in col])
        numeric.append(pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col))
    lines, left = fit_table(header, [list(r) for r in zip(*columns, strict=True)], numeric, width, lead=len(first),
                            keep=tuple(i for i, c in enumerate(order) if names[c] == by))  # the rows' order stays
    if left:
        lines += wrap(f"({len(left)} column{'s' if len(left) != 1 else ''} left out to fit {width} characters: "
                      + ", ".join(left) + (f"; {full} has every column" if full else "") + ")", width)
    return "\n".join(lines)


def say(text: str, width: int | None = None, indent: str = "") -> None:
    """Print ``text`` wrapped to ``width`` characters (default: the terminal's), continuation lines after ``indent``."""
    from inspector.ui.terminal import terminal_width, wrap

    print("\n".join(wrap(text, terminal_width() if width is None else width, indent)))


def say_lines(text: str = "", width: int | None = None) -> None:
    """Print ``text`` line by line, each line that is wider than ``width`` characters (default: the terminal's)
    wrapped at spaces, its continuation lines indented two more than it; lines that fit (a table's, which
    :func:`format_table` fits already) are printed as they are. A word wider than the line is broken."""
    from inspector.ui.terminal import terminal_width, wrap

    width = terminal_width() if width is None else width
    for line in str(text).split("\n"):
        if len(line) <= width:
            print(line)
            continue
        lead = line[:len(line) - len(line.lstrip())]
        print("\n".join(wrap(line, width, lead + "  ")))


def print_table(df: pd.DataFrame, rows: int | None = None, *, digits: int = 4, lead: tuple[str, ...] = (),
                by: str | None = None, what: str = "rows", full: str | None = "--csv FILE",
                width: int | None = None) -> None:
    """Print ``df`` as :func:`format_table` does, at most ``rows`` rows (None: every row): the first ones, or with
    ``by`` those of largest ``|by|``, largest first; then a line saying how many there are and how to see them all."""
    from inspector.ui.terminal import terminal_width, wrap

    width = terminal_width() if width is None else width
    shown = df
    if rows is not None and len(df) > rows:
        shown = df.loc[df[by].abs().sort_values(ascending=False, kind="stable").index[:rows]] if by else df.head(rows)
    print(format_table(shown, digits, width=width, lead=lead, full=full, by=by))
    if len(shown) < len(df):
        order = f", those of largest |{by}| first" if by else ""
        print("\n".join(wrap(f"… {len(shown):,} of {len(df):,} {what} shown{order}; --all prints every one"
                              + (f", {full} writes them all" if full else ""), width)))


def status(msg: str) -> None:
    from inspector.ui.terminal import escape

    print(escape(msg), file=sys.stderr, flush=True)
