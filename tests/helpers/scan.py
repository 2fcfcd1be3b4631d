"""The rows of a scan as the scan tests compare them: documents from dicts, the heads table read back, two tables
equal to float rounding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from inspector.corpus import queries as corpus
from inspector.corpus.documents import Fields, to_document

TOL = 1e-5  # padded batches and single documents differ by float rounding of the padded matrix products
FIELDS = Fields(query="query", referents="referents", id="id")


def docs_of(rows, fields=FIELDS):
    return [to_document(i, r, fields) for i, r in enumerate(rows)]


def sort_heads(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(["id", "site", "head"], kind="stable").reset_index(drop=True)


def assert_same_rows(a: pd.DataFrame, b: pd.DataFrame, tol: float = TOL) -> None:
    a, b = sort_heads(a), sort_heads(b)
    assert list(a.columns) == list(b.columns)
    assert len(a) == len(b)
    for col in a.columns:
        if pd.api.types.is_float_dtype(a[col]):
            np.testing.assert_allclose(a[col].to_numpy(float), b[col].to_numpy(float), atol=tol, rtol=0, err_msg=col)
        elif col in ("referent_weights", "row_split_scores"):  # lists of floats
            for x, y in zip(a[col], b[col], strict=True):
                if isinstance(x, float) or x is None or x is pd.NA:  # missing (NaN, None or NA)
                    assert y is None or y is pd.NA or isinstance(y, float)
                else:
                    np.testing.assert_allclose(np.asarray(x, float), np.asarray(y, float), atol=tol, rtol=0)
        else:
            for x, y in zip(map(cell_text, a[col]), map(cell_text, b[col]), strict=True):
                assert same_text(x, y), (col, x, y)


def cell_text(v) -> str:
    """A cell as text, the same whatever holds it: a list, tuple, NumPy array or Arrow list's element as a Python
    list; None, NaN and NA as ``None``."""
    if isinstance(v, (list, tuple, np.ndarray)):
        return str([x.item() if isinstance(x, np.generic) else x for x in v])
    if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)):
        return "None"
    return str(v.item() if isinstance(v, np.generic) else v)


def same_text(x: str, y: str) -> bool:
    """Equal texts, where numbers printed to 4 decimals may differ in the last one (a value a float rounding
    away from a rounding boundary, e.g. 0.00725 computed two ways, prints 0.0072 or 0.0073)."""
    if x == y:
        return True
    xs, ys = x.split(), y.split()
    if len(xs) != len(ys):
        return False
    for u, v in zip(xs, ys, strict=True):
        if u == v:
            continue
        try:
            if abs(float(u) - float(v)) > 1.5e-4:
                return False
        except ValueError:
            return False
    return True


def read_heads(out: Path) -> pd.DataFrame:
    con = corpus.connect(out)
    return con.execute("SELECT * FROM heads").df()
