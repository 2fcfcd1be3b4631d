"""A scan's rows as Arrow tables: what its Parquet parts hold, and how they read back.

:func:`arrow_table` is the table a part is written from (a DataFrame's, without its index, list columns recorded
as object columns in the pandas metadata); :func:`table_of` builds the same table straight from a batch's columns
(the scan's fast path: no DataFrame in between); :func:`frame_of` reads one back as the scan holds it (list
columns Arrow-backed); :func:`concat_rows` merges a commit group's batches.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd


def arrow_table(df: pd.DataFrame):
    """``df`` as an Arrow table without its index, each list column's pandas ``numpy_type`` recorded as
    ``object`` (see :func:`~inspector.corpus.folder.write_parquet`); the Ray engine sends rows this way too (:func:`frame_of` reads them)."""
    import pyarrow as pa

    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    if b"pandas" not in meta:
        return table
    pandas_meta = json.loads(meta[b"pandas"])
    changed = False
    for col in pandas_meta.get("columns", []):
        if str(col.get("pandas_type", "")).startswith("list[") and col.get("numpy_type") != "object":
            col["numpy_type"] = "object"
            changed = True
    if not changed:
        return table
    meta[b"pandas"] = json.dumps(pandas_meta).encode()
    return table.replace_schema_metadata(meta)


_TABLE_SCHEMAS: dict[tuple, Any] = {}  # table_of: per column signature, the schema arrow_table gave (types, pandas metadata)


_NESTED = (list, tuple, dict, set, np.ndarray)


def _signature(name: str, column: Any) -> tuple | None:
    """What decides the Arrow type pandas and :func:`arrow_table` give a column: its container and dtype, and for
    Python objects the set of their types (``[1, 2]``, ``[1, 2.5]`` and ``[1, None]`` differ; an empty column has
    none). None where the values nest (lists of lists: their element types are not read), so that such a column
    always goes through pandas."""
    if isinstance(column, list) or (isinstance(column, np.ndarray) and column.dtype == object):
        kinds = frozenset(map(type, column))
        if any(issubclass(k, _NESTED) for k in kinds):
            return None
        return name, type(column).__name__, tuple(sorted(k.__qualname__ for k in kinds))
    if isinstance(column, np.ndarray):
        return name, column.dtype.str
    return name, type(column).__name__, str(getattr(column, "dtype", getattr(column, "type", "")))


def _pandas_column(column: Any) -> Any:
    """A column as ``pd.DataFrame`` takes it: an Arrow array as an Arrow-backed extension array."""
    import pyarrow as pa

    if isinstance(column, (pa.Array, pa.ChunkedArray)):
        return pd.arrays.ArrowExtensionArray(column)
    return column


def table_of(columns: dict[str, Any]):
    """``arrow_table(pd.DataFrame(columns))`` without the DataFrame: the same Arrow table, schema and pandas
    metadata included (so the part reads back the same), built straight from the columns. ``columns``: equal-length
    NumPy arrays, lists of Python values, pandas ``BooleanArray`` / ``IntegerArray`` or Arrow arrays, in order. The
    first table of a column signature (names, containers, dtypes, the types of Python values) is built through pandas
    and its schema kept (:data:`_TABLE_SCHEMAS`); later ones convert each column to that schema's type
    (``from_pandas``: NaN is missing, as pandas gives it), and go through pandas again where a value does not fit
    it. tests/test_scan_batching.py checks it against :func:`arrow_table`."""
    import pyarrow as pa

    key = tuple(_signature(n, c) for n, c in columns.items())
    schema = None if None in key else _TABLE_SCHEMAS.get(key)
    if schema is None:
        table = arrow_table(pd.DataFrame({n: _pandas_column(c) for n, c in columns.items()}))
        if None not in key and len(_TABLE_SCHEMAS) < 256:  # a scan has a handful of signatures; never grows without bound
            _TABLE_SCHEMAS[key] = table.schema
        return table
    arrays = []
    try:
        for field, column in zip(schema, columns.values(), strict=True):
            if isinstance(column, (pa.Array, pa.ChunkedArray)):
                arrays.append(column if column.type == field.type else column.cast(field.type))
            else:
                arrays.append(pa.array(column, type=field.type, from_pandas=True))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # values the kept type cannot hold (an int past int64): as pandas reads them
        return arrow_table(pd.DataFrame({n: _pandas_column(c) for n, c in columns.items()}))
    return pa.Table.from_arrays(arrays, schema=schema)


def frame_of(table) -> pd.DataFrame:
    """The DataFrame of an :func:`arrow_table`: list columns as Arrow-backed lists, as the scan holds them, and a
    column the pandas metadata records as ``object`` (e.g. booleans with missing values, ``mostly_shared``) as an
    object column even where this table's values have no missing one, so that ``frame_of(arrow_table(df))``
    has ``df``'s dtypes."""
    import pyarrow as pa

    df = table.to_pandas(types_mapper=lambda t: pd.ArrowDtype(t) if pa.types.is_list(t) else None)
    meta = (table.schema.metadata or {}).get(b"pandas")
    if meta is not None:
        for col in json.loads(meta).get("columns", []):
            name = col.get("name")
            if (col.get("numpy_type") == "object" and not str(col.get("pandas_type", "")).startswith("list[")
                    and name in df.columns and df[name].dtype != object):
                df[name] = df[name].astype(object)
    return df


def concat_rows(parts: list):
    """Batches' rows as one: Arrow tables of one schema (pandas metadata included) concatenated as they are, anything
    else (DataFrames, tables of different columns) as ``pd.concat`` of their DataFrames (missing columns empty)."""
    import pyarrow as pa

    if all(isinstance(p, pa.Table) for p in parts) and all(p.schema.equals(parts[0].schema, check_metadata=True)
                                                           for p in parts):
        return pa.concat_tables(parts)
    return pd.concat([p if isinstance(p, pd.DataFrame) else frame_of(p) for p in parts], ignore_index=True)
