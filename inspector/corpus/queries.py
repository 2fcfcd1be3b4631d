"""Querying a scan folder with DuckDB: per-head statistics over a whole corpus.

:func:`connect` opens an in-memory DuckDB database with two views over the committed Parquet parts
of a scan (see :mod:`inspector.corpus.folder`): ``heads`` (one row per document, site and head: the
``rank`` columns, and the ``split`` columns for documents with a query) and ``documents`` (``id, row,
tokens, status, error``). Nothing is copied; DuckDB reads the files.

:func:`summary` is the default answer of ``inspector corpus``, one row per site and head:

* ``documents``: documents with a row for the head (documents scanned without error);
* ``entropy_mean``, ``entropy_std``, ``normalized_entropy_mean``, ``normalized_entropy_std``: mean and
  sample standard deviation over those documents of the per-document ``entropy`` and
  ``normalized_entropy`` (nats; see :mod:`inspector.analysis`), documents where the value is undefined
  left out;
* ``split_documents``: documents where the split analysis reached the head (a query and referents
  given, and visible to the query at that site); ``flagged_documents``: of those, how many flagged it;
  ``share_flagged = flagged_documents / split_documents``;
* ``lift_mean``: mean ``lift`` over the split documents, only when the scan's split rows have a
  ``lift`` column;
* only for a scan with ``--routes`` (:mod:`inspector.corpus.route_rows`): ``route_documents``, documents
  whose query token's route was traced (those with a query); ``on_route_documents``, of those, how many
  have the head on the route; ``routes = on_route_documents / route_documents``, how often the head
  carries the query token; ``route_share_mean``, the mean of its ``route_share``.

Sorted so the heads that split most often come first (``flagged_documents``, then ``share_flagged``,
both descending), then by site and head.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from inspector.corpus.folder import check_parts, committed_heads, read_info
from inspector.errors import InspectorError
from inspector.store.schema import HEAD_KEY

KEYS = list(HEAD_KEY)


_GLOB = str.maketrans({c: f"[{c}]" for c in "[*?"})  # DuckDB reads each path as a glob: its wildcards as literals


def _quote_paths(paths: list[Path]) -> str:
    """A DuckDB list literal naming exactly these files (quotes doubled, glob characters bracketed)."""
    return "[" + ", ".join("'" + str(p).translate(_GLOB).replace("'", "''") + "'" for p in paths) + "]"


def connect(out: str | os.PathLike):
    """An in-memory DuckDB connection with the views ``heads`` and ``documents`` over the scan in ``out``.
    Raises InspectorError (one line) for a folder without a scan, a damaged ``scan.json`` or a damaged part
    (:func:`~inspector.corpus.folder.read_info`, :func:`~inspector.corpus.folder.check_parts`)."""
    import duckdb

    out = Path(out).expanduser()
    read_info(out)
    check_parts(out)
    con = duckdb.connect(":memory:")
    heads = committed_heads(out)
    docs = sorted(p for p in (out / "_documents").glob("part-*.parquet") if p.name.startswith("part-"))
    if heads:
        con.execute(f"CREATE VIEW heads AS SELECT * FROM read_parquet({_quote_paths(heads)}, union_by_name = true)")
    else:
        con.execute("CREATE VIEW heads AS SELECT * FROM (SELECT ''::VARCHAR AS id, ''::VARCHAR AS site, ''::VARCHAR AS stack, "
                    "''::VARCHAR AS kind, 0::BIGINT AS layer, 0::BIGINT AS head, 0::DOUBLE AS entropy, "
                    "0::DOUBLE AS normalized_entropy) WHERE false")
    if docs:
        con.execute(f"CREATE VIEW documents AS SELECT id, \"row\", tokens, status, error FROM read_parquet({_quote_paths(docs)})")
    else:
        con.execute("CREATE VIEW documents AS SELECT * FROM (SELECT ''::VARCHAR AS id, 0::BIGINT AS \"row\", 0::BIGINT AS tokens, "
                    "''::VARCHAR AS status, ''::VARCHAR AS error) WHERE false")
    return con


def columns(con, view: str = "heads") -> list[str]:
    """The column names of ``view`` (``heads``, ``documents``, ...) in the DuckDB connection ``con``."""
    return [r[0] for r in con.execute(f"DESCRIBE {view}").fetchall()]


def summary_sql(cols: list[str]) -> str:
    """The SQL of :func:`summary` for a ``heads`` view with these columns."""
    has_split = "flagged" in cols
    parts = [
        "count(*) AS documents",
        "avg(entropy) AS entropy_mean", "stddev_samp(entropy) AS entropy_std",
        "avg(normalized_entropy) AS normalized_entropy_mean", "stddev_samp(normalized_entropy) AS normalized_entropy_std",
    ]
    if has_split:
        parts += ["count(flagged) AS split_documents", "count(*) FILTER (WHERE flagged) AS flagged_documents",
                  "CAST(count(*) FILTER (WHERE flagged) AS DOUBLE) / nullif(count(flagged), 0) AS share_flagged"]
    else:
        parts += ["0::BIGINT AS split_documents", "0::BIGINT AS flagged_documents", "NULL::DOUBLE AS share_flagged"]
    if "lift" in cols:
        parts.append("avg(CASE WHEN flagged IS NOT NULL THEN lift END) AS lift_mean")
    if "on_route" in cols:
        parts += ["count(on_route) AS route_documents", "count(*) FILTER (WHERE on_route) AS on_route_documents",
                  "CAST(count(*) FILTER (WHERE on_route) AS DOUBLE) / nullif(count(on_route), 0) AS routes",
                  "avg(route_share) AS route_share_mean"]
    keys = ", ".join(KEYS)
    return (f"SELECT {keys}, {', '.join(parts)} FROM heads GROUP BY {keys} "
            "ORDER BY flagged_documents DESC, share_flagged DESC NULLS LAST, site, head")


def summary(out_or_con) -> pd.DataFrame:
    """Per site and head over the corpus (columns and order in the module docstring)."""
    con = connect(out_or_con) if isinstance(out_or_con, (str, os.PathLike)) else out_or_con
    return _run(con, summary_sql(columns(con)))


def _run(con, sql: str, params: list | None = None) -> pd.DataFrame:
    """``sql``'s result; a DuckDB error (a part damaged past its footer, parts whose columns disagree) as one line."""
    import duckdb

    try:
        return con.execute(sql, params).df() if params is not None else con.execute(sql).df()
    except duckdb.Error as exc:
        raise InspectorError(f"the scan's parts cannot be read together ({str(exc).strip().splitlines()[0][:200]}): "
                             "scan into a new folder") from None


_ASKING = {"SELECT", "EXPLAIN", "PRAGMA", "CALL"}  # DuckDB statement types that return rows (DESCRIBE, SHOW are SELECTs)
# what --sql may run over the in-memory views: reading and deriving, never COPY / EXPORT (files), ATTACH (databases),
# SET / PRAGMA (settings, e.g. a profiling output file), INSTALL / LOAD (extensions) or DROP
_ALLOWED = {"SELECT", "EXPLAIN", "CREATE", "INSERT", "UPDATE", "DELETE"}


def query(out_or_con, sql: str) -> pd.DataFrame:
    """Run ``sql`` (over the views ``heads`` and ``documents``) and return the last statement's result (an
    empty frame for a statement without one); :func:`queries` gives every statement's. A DuckDB error
    becomes one line (``InspectorError``)."""
    results = queries(out_or_con, sql)
    return results[-1][1] if results else pd.DataFrame()


def queries(out_or_con, sql: str, *, single: bool = False) -> list[tuple[str, pd.DataFrame]]:
    """Run each statement of ``sql`` in order (a ``CREATE VIEW`` is seen by the next ones): ``(statement
    text, result)`` for each statement that asks for rows (``SELECT``, ``DESCRIBE``, ``EXPLAIN``, ...; a lone
    statement of another kind gives what DuckDB answers, e.g. a row count). Raises
    ``InspectorError`` (one line) on a DuckDB error, naming the statement when there are several, before running
    anything for a statement that could write files or change settings (COPY, EXPORT, ATTACH, SET, PRAGMA,
    INSTALL, LOAD, DROP: only SELECT, EXPLAIN, CREATE, INSERT, UPDATE and DELETE run), and, with
    ``single``, before running anything when more than one statement asks for rows."""
    import duckdb

    con = connect(out_or_con) if isinstance(out_or_con, (str, os.PathLike)) else out_or_con

    def failed(exc: Exception, where: str = "") -> InspectorError:
        first = str(exc).strip().splitlines()[0]
        return InspectorError(f"the query failed{where} ({first[:300]}): query the views heads and documents")

    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise failed(exc) from None
    refused = [st for st in statements if st.type.name not in _ALLOWED]
    if refused:
        kind = refused[0].type.name
        raise InspectorError(f"--sql reads the scan: a {kind} statement is refused (it could write or change files or "
                             "settings); use SELECT (and CREATE VIEW), and write a result with --csv FILE")
    asking = [st for st in statements if st.type.name in _ASKING]
    if single and len(asking) > 1:
        raise InspectorError(f"--sql gives {len(asking)} results and --csv writes one: give one SELECT with --csv, or "
                             "drop --csv to print them all")
    out: list[tuple[str, pd.DataFrame]] = []
    for i, statement in enumerate(statements):
        try:
            result = con.execute(statement)
        except duckdb.Error as exc:
            raise failed(exc, f" at statement {i + 1} of {len(statements)}" if len(statements) > 1 else "") from None
        # of several statements, those that ask for rows; a CREATE or INSERT answers only its row count
        if result.description is not None and (len(statements) == 1 or statement.type.name in _ASKING):
            out.append((statement.query.strip().rstrip(";").rstrip(), result.df()))
    return out


def head_documents(out_or_con, site: str, head: int, limit: int = 20) -> pd.DataFrame:
    """The documents where one head splits most: its split rows, highest ``split_score`` first, with
    the document's row number in the corpus and its token count."""
    con = connect(out_or_con) if isinstance(out_or_con, (str, os.PathLike)) else out_or_con
    cols = columns(con)
    if "split_score" not in cols:
        return pd.DataFrame(columns=["id", "row", "tokens", "query", "referents", "referent_weights", "split_score", "flagged"])
    extra = ", h.lift" if "lift" in cols else ""
    return _run(con,
        "SELECT h.id, d.row, d.tokens, h.query, h.referents, h.referent_weights, h.referent_mass, h.split_score, "
        f"h.flagged{extra} FROM heads h JOIN documents d USING (id) "
        "WHERE h.site = ? AND h.head = ? AND h.split_score IS NOT NULL "
        "ORDER BY h.split_score DESC, d.row LIMIT ?", [site, int(head), int(limit)])


def scan_info(out: str | os.PathLike) -> dict:
    """The scan's ``scan.json``: corpus path, fields, model and options."""
    return read_info(out)


def find_document(out: str | os.PathLike, row: int):
    """The :class:`~inspector.corpus.documents.Document` at position ``row`` of the scanned corpus (read again
    from the corpus file the scan names, so its text, target, query and referents are as scanned)."""
    from inspector.corpus.documents import Corpus, Fields

    info = scan_info(out)
    fields = Fields(**{k: v for k, v in info.get("fields", {}).items() if k in Fields.__dataclass_fields__})
    source = Corpus(info["corpus"], fields)
    for doc in source:
        if doc.row == row:
            return doc
    raise InspectorError(f"row {row} is not in {source.path}: the corpus changed since the scan")
