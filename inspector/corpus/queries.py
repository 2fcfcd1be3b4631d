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


def _literal(path: Path) -> str:
    """A DuckDB string literal of ``path`` as it is (quotes doubled, no glob brackets)."""
    return "'" + str(path).replace("'", "''") + "'"


def _lock(con, files: list[Path], allow_external: bool) -> None:
    """Close DuckDB to everything but ``files`` (issue 40: a ``SELECT`` over ``read_json('https://...')`` had DuckDB
    install httpfs under ``~/.duckdb`` and, with a network, load native code): no file, folder or URL outside
    them (``enable_external_access = false`` with ``allowed_paths``, each path as written and as the views' glob
    spells it), and ``lock_configuration``, so that no statement turns a setting back. ``allow_external`` leaves
    the file system and URLs open (the extensions' automatic loading is set when the connection opens)."""
    if not allow_external:
        named = [_quote_paths([p])[1:-1] for p in files] + [_literal(p) for p in files]
        con.execute(f"SET allowed_paths = [{', '.join(named)}]")
        con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def connect(out: str | os.PathLike, *, allow_external: bool = False):
    """An in-memory DuckDB connection with the views ``heads`` and ``documents`` over the scan in ``out``, locked
    down: it reads the scan's committed Parquet parts and nothing else (no other file, folder or URL), installs and
    loads no extension, and no statement can change a setting (``lock_configuration``). ``allow_external=True``
    (``inspector corpus --allow-external``) lets queries read other files and URLs, and DuckDB install and load the
    extensions they need (httpfs for ``https://``). Raises InspectorError (one line) for a folder without a scan, a
    damaged ``scan.json`` or a damaged part (:func:`~inspector.corpus.folder.read_info`,
    :func:`~inspector.corpus.folder.check_parts`)."""
    import duckdb

    from inspector.corpus.verdicts import is_evaluation

    out = Path(out).expanduser()
    info = read_info(out)
    check_parts(out)
    # no spilling to disk: DuckDB's spill folder (./.tmp by default) would be a folder queries may read from
    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": allow_external,
                                             "autoload_known_extensions": allow_external, "temp_directory": ""})
    heads = [p.absolute() for p in committed_heads(out)]  # the paths the views name are the paths allowed
    docs = sorted(p.absolute() for p in (out / "_documents").glob("part-*.parquet") if p.name.startswith("part-"))
    _lock(con, [*heads, *docs], allow_external)
    if heads:
        con.execute(f"CREATE VIEW heads AS SELECT * FROM read_parquet({_quote_paths(heads)}, union_by_name = true)")
    else:
        con.execute("CREATE VIEW heads AS SELECT * FROM (SELECT ''::VARCHAR AS id, ''::VARCHAR AS site, ''::VARCHAR AS stack, "
                    "''::VARCHAR AS kind, 0::BIGINT AS layer, 0::BIGINT AS head, 0::DOUBLE AS entropy, "
                    "0::DOUBLE AS normalized_entropy) WHERE false")
    con.execute(f"CREATE VIEW documents AS {_documents_sql(con, docs, is_evaluation(info))}")
    return con


_SQL_TYPES = {"string": "VARCHAR", "int": "BIGINT", "float": "DOUBLE", "bool": "BOOLEAN"}


def _documents_sql(con, docs: list[Path], evaluation: bool) -> str:
    """The ``documents`` view's query: ``id, row, tokens, status, error``; for an evaluation scan the columns of
    ``--view documents`` (:func:`inspector.corpus.verdict_columns.document_columns`), NULL where no part holds one."""
    from inspector.corpus.verdict_columns import SCAN_DOC_TYPES, document_columns

    source = f"read_parquet({_quote_paths(docs)}, union_by_name = true)" if docs else None
    present = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()] if source else []
    wanted = document_columns(present) if evaluation else list(SCAN_DOC_TYPES.items())

    def quoted(name: str) -> str:
        return '"' + name.replace('"', '""') + '"'

    cols = ", ".join(quoted(c) if c in present else f"NULL::{_SQL_TYPES[k]} AS {quoted(c)}" for c, k in wanted)
    return f"SELECT {cols} FROM {source}" if source else f"SELECT * FROM (SELECT {cols}) WHERE false"


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
_SPELT = {"LOAD": "INSTALL or LOAD"}  # DuckDB gives INSTALL the type of LOAD


def query(out_or_con, sql: str) -> pd.DataFrame:
    """Run ``sql`` (over the views ``heads`` and ``documents``) and return the last statement's result (an
    empty frame for a statement without one); :func:`queries` gives every statement's. A DuckDB error
    becomes one line (``InspectorError``)."""
    results = queries(out_or_con, sql)
    return results[-1][1] if results else pd.DataFrame()


def _failed(exc: Exception, where: str = "") -> InspectorError:
    """A DuckDB error as one line: a file, folder or URL outside the scan (the connection's lock) says how to
    allow it; any other names the views."""
    import duckdb

    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, duckdb.PermissionException) or "disabled by configuration" in first:
        return InspectorError(f"--sql reads only the scan's own files{where} ({first[:300]}): query the views heads "
                              "and documents, or pass --allow-external to let it read other files and URLs")
    if "configuration has been locked" in first:
        return InspectorError(f"--sql cannot change DuckDB's settings{where} ({first[:300]}): query the views heads "
                              "and documents")
    return InspectorError(f"the query failed{where} ({first[:300]}): query the views heads and documents")


def _frame(result, limit: int | None) -> pd.DataFrame:
    """The rows of a DuckDB result: all of them, or with ``limit`` the first ``limit + 1`` only, fetched as they
    stream (the rest never computed where the plan allows: ``SELECT * FROM range(10^8)`` reads 4 rows, not 10^8),
    so that a caller printing ``limit`` rows knows whether more follow."""
    if limit is None:
        return result.df()
    rows = result.fetchmany(limit + 1)
    return pd.DataFrame(rows, columns=[d[0] for d in result.description])


def _execute(con, statement, limit: int | None):
    """Run one statement; with ``limit``, a query is wrapped as ``SELECT * FROM (query) LIMIT limit + 1`` so that the
    LIMIT is pushed down into DuckDB's plan (a streamed fetch alone lets its threads compute rows ahead: 1.4 GB seen
    for ``--top 3`` over ``range(10^8)``). A query that cannot stand as a subquery runs as it is."""
    import duckdb

    if limit is not None and statement.type.name == "SELECT":
        text = statement.query.strip().rstrip(";")
        try:
            return con.execute(f"SELECT * FROM (\n{text}\n) LIMIT {int(limit) + 1}")
        except duckdb.ParserException:
            pass
    return con.execute(statement)


def queries(out_or_con, sql: str, *, single: bool = False, limit: int | None = None,
            allow_external: bool = False) -> list[tuple[str, pd.DataFrame]]:
    """Run each statement of ``sql`` in order (a ``CREATE VIEW`` is seen by the next ones): ``(statement
    text, result)`` for each statement that asks for rows (``SELECT``, ``DESCRIBE``, ``EXPLAIN``, ...; a lone
    statement of another kind gives what DuckDB answers, e.g. a row count); with ``limit``, each result holds its
    first ``limit + 1`` rows at most (:func:`_frame`: fetched as they stream, so a huge result costs what is
    printed). A folder is opened by :func:`connect` (``allow_external`` passed on: by default nothing outside the
    scan is read). Raises ``InspectorError`` (one line) on a DuckDB error, naming the statement when there are
    several (a file or URL outside the scan: how to allow it), before running anything for a statement that could
    write files or change settings (COPY, EXPORT, ATTACH, SET, PRAGMA, INSTALL, LOAD, DROP: only SELECT, EXPLAIN,
    CREATE, INSERT, UPDATE and DELETE run), and, with ``single``, before running anything when more than one
    statement asks for rows."""
    import duckdb

    con = connect(out_or_con, allow_external=allow_external) if isinstance(out_or_con, (str, os.PathLike)) else out_or_con
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise _failed(exc) from None
    refused = [st for st in statements if st.type.name not in _ALLOWED]
    if refused:
        kind = _SPELT.get(refused[0].type.name, refused[0].type.name)
        raise InspectorError(f"--sql reads the scan: the {kind} statement is refused (it could write or change files or "
                             "settings); use SELECT (and CREATE VIEW), and write a result with --csv FILE")
    asking = [st for st in statements if st.type.name in _ASKING]
    if single and len(asking) > 1:
        raise InspectorError(f"--sql gives {len(asking)} results and --csv writes one: give one SELECT with --csv, or "
                             "drop --csv to print them all")
    out: list[tuple[str, pd.DataFrame]] = []
    for i, statement in enumerate(statements):
        try:
            result = _execute(con, statement, limit)
            # of several statements, those that ask for rows; a CREATE or INSERT answers only its row count
            if result.description is not None and (len(statements) == 1 or statement.type.name in _ASKING):
                out.append((statement.query.strip().rstrip(";").rstrip(), _frame(result, limit)))
        except duckdb.Error as exc:
            raise _failed(exc, f" at statement {i + 1} of {len(statements)}" if len(statements) > 1 else "") from None
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
