"""Reducing documents to per-head statistics: each captured lazily in memory, then analysed.

The per-document statistics are exactly those inspector defines for one capture, computed by the
same functions: :func:`~inspector.analysis.rank_heads` for every document, and
:func:`~inspector.analysis.split_heads` when the document names a query and referents. Nothing is
written per document; a capture lives only while its batch is reduced.

:func:`reduce_batch` is *the* per-document function: the local engine (:func:`local_batches`) and
the Ray engine (:mod:`inspector.corpus.ray_engine`) both call it, so their rows are the same. Documents are
captured ``batch_size`` at a time, padded; every statistic is computed over the document's own
(non-padding) query rows and keys, and the positions reported (``top_key_index``,
``query_positions``) are shifted back by the padding in front of the document, so a document's rows
equal those of a capture of it alone (within float rounding of the padded matrix products).

Rows of the ``heads`` table: ``id`` (the document id), then the ``rank`` columns, then -- for documents
with a query -- the ``split`` columns with the per-referent ``weight:<referent>`` columns turned into
two list columns, ``referents`` and ``referent_weights`` (same order; every list column an Arrow list array
of :data:`inspector.store.schema.LIST_TYPES`, on both paths), since referents differ from
one document to the next (any other per-referent column ``<name>:<referent>`` likewise becomes a list
column ``referent_<name>``). Any further column the split analysis returns (e.g. ``lift``) is kept as
it comes. Rows of ``documents``: ``id``, ``row`` (position in the corpus file), ``tokens`` (real
tokens over all inputs, 0 when it could not be tokenized), ``status`` (``ok`` or ``error``),
``error`` (the error's one line; for an ok document empty, or a note on what could not be computed:
``no split: ...`` when every site's mask hides the referents from the query, whose rank rows stand).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from inspector.attribute.routes import THRESHOLD
from inspector.capture.inputs import TOKENIZER_LOCK
from inspector.corpus.documents import Document, error_line
from inspector.corpus.engine import check_workers
from inspector.corpus.forward_sums import ForwardSums, StopPlan
from inspector.store.masks import leading_padding

DOC_COLUMNS = ["id", "row", "tokens", "status", "error"]
_POSITION_COLUMNS = {"top_key_index": "key"}  # rank columns holding a position on a site's key axis


@dataclass(frozen=True)
class Options:
    """What to compute per document (the same meaning as in ``inspector rank`` / ``inspector split``)."""

    exclude_special: bool = False
    min_split: float = 0.2
    min_mass: float = 0.25
    min_lift: float = 2.0
    dtype: str = "float32"
    routes: bool = False  # per document with a query: the heads on the route of its query token (route_rows)
    routes_threshold: float = THRESHOLD  # the route's importance threshold

    def to_dict(self) -> dict:
        """The options as the scan's manifest stores them (a resumed scan must use the same ones). The route
        options appear only with ``routes`` on, so scans made before them resume unchanged."""
        out = {"exclude_special": self.exclude_special, "min_split": self.min_split, "min_mass": self.min_mass,
               "min_lift": self.min_lift, "dtype": self.dtype}
        if self.routes:
            out.update(routes=True, routes_threshold=self.routes_threshold)
        return out


class BatchResult:
    """What a batch of documents reduces to: one ``documents`` row per document, ``heads`` rows for the documents
    that succeeded, each given as a DataFrame or as the Arrow table a scan commits (its ``arrow_table``: schema
    and pandas metadata, :func:`~inspector.corpus.tables.table_of`). ``documents_table`` / ``heads_table`` are the
    tables (``heads_table`` has no columns when no document has rows), :attr:`documents` / :attr:`heads` the
    DataFrames (made once, on first use, from the tables). A scan commits the tables."""

    documents_table: object  # pyarrow.Table
    heads_table: object  # pyarrow.Table

    def __init__(self, documents, heads):
        self._frames: dict[str, pd.DataFrame] = {}
        self.documents_table = self._table("documents", documents)
        self.heads_table = self._table("heads", heads)

    def _table(self, name: str, rows):
        """``rows`` as a table; a DataFrame is also kept as the rows' DataFrame."""
        import pyarrow as pa

        from inspector.corpus.tables import arrow_table

        if not isinstance(rows, pd.DataFrame):
            return rows
        self._frames[name] = rows
        return arrow_table(rows) if len(rows.columns) else pa.table({})

    @property
    def documents(self) -> pd.DataFrame:
        """The ``documents`` rows (:data:`DOC_COLUMNS`)."""
        return self._frame("documents")

    @property
    def heads(self) -> pd.DataFrame:
        """The ``heads`` rows (an empty DataFrame without columns when no document has any)."""
        return self._frame("heads")

    def _frame(self, name: str) -> pd.DataFrame:
        from inspector.corpus.tables import frame_of

        if name not in self._frames:
            table = self.documents_table if name == "documents" else self.heads_table
            self._frames[name] = frame_of(table) if table.num_columns else pd.DataFrame()
        return self._frames[name]


# split's flags as a scan's document gives them
def check_document(doc: Document) -> str | None:
    """The problem that keeps ``doc`` from being captured at all, or None."""
    if doc.problem:
        return doc.problem
    if doc.text is not None and not isinstance(doc.text, str):
        kind = type(doc.text).__name__
        return f"the text is {'an' if kind[:1] in 'aeiou' else 'a'} {kind}, not a string: check --text-field"
    if not isinstance(doc.text, str) or not doc.text.strip():
        return "the text is empty"
    if doc.target is not None and not (isinstance(doc.target, str) and doc.target.strip()):
        return "the target is empty"
    if (doc.query is None) != (not doc.referents):
        return "give both a query and referents (or neither)"
    if doc.referents is not None and len(doc.referents) < 2:
        return "give at least two referents"
    return None


def _real_tokens(capture, batch: int) -> int:
    return sum(sum(1 for p in r.padding if not p) for r in capture.inputs if r.batch == batch)


def document_rows(capture, batch: int, doc: Document, options: Options) -> pd.DataFrame:
    """The ``heads`` rows of batch row ``batch`` of ``capture``, which holds ``doc``.

    Calls :func:`~inspector.analysis.rank_heads` and (with a query) :func:`~inspector.analysis.split_heads`
    on that batch row. Raises :class:`InspectorError` when the split analysis cannot run (e.g. a referent
    is not in the document). A document whose referents no site lets the query see
    (:class:`~inspector.analysis.split.NoReferentVisible`) keeps its rank rows without split columns, and
    ``attrs["note"]`` says why.
    """
    from inspector.analysis.question import Question
    from inspector.analysis.rank import rank_heads
    from inspector.analysis.split import NoReferentVisible, SplitRule, clean_referents, site_splits

    order = {s.name: i for i, s in enumerate(capture.sites)}
    rank = rank_heads(capture, batch=batch, exclude_special=options.exclude_special)
    # columns assembled as arrays in site order, then one DataFrame (pandas merges and sorts per document
    # cost more than the analysis of a short one)
    sites = rank["site"].tolist()
    perm = np.lexsort((rank["head"].to_numpy(), np.array([order[x] for x in sites])))
    cols: dict[str, object] = {"id": [doc.id] * len(rank)}
    for c in rank.columns:
        cols[c] = rank[c].to_numpy()[perm]
    sites = [sites[i] for i in perm]
    key_shift = {s.name: int(leading_padding(capture.flags(s, "key", batch)[1])) for s in capture.sites}
    cols["top_key_index"] = cols["top_key_index"] - np.array([key_shift[x] for x in sites], dtype=np.int64)
    if doc.query is not None:
        refs = clean_referents(doc.referents)  # the names split_heads gives its columns
        rule = SplitRule(min_split=options.min_split, min_mass=options.min_mass, min_lift=options.min_lift)
        try:
            found, _ = site_splits(capture, Question(doc.query, tuple(refs), occurrence=doc.occurrence, rule=rule),
                                   batch=batch)
        except NoReferentVisible as exc:  # no split to measure: the rank rows stand, the split columns stay empty
            out = pd.DataFrame(cols)
            out.attrs["note"] = f"no split: {exc}"
            return out
        cols.update(_split_cells(capture, batch, found, sites))
    return pd.DataFrame(cols)


def _split_cells(capture, batch: int, found: list, sites: list[str]) -> dict[str, object]:
    """The split columns of one document's heads rows (``sites``: each row's site, the rank rows' order, every
    site's heads in order) from its per-site splits (:func:`~inspector.analysis.split.site_splits`), written by
    the fast path's writer (:class:`~inspector.corpus.batch_reduce.SplitWriter`), one block per site: query
    positions shifted back by the document's leading padding."""
    from inspector.corpus.batch_reduce import SplitBlock, SplitWriter

    first = {}
    for i, name in enumerate(sites):
        first.setdefault(name, i)
    writer = SplitWriter(len(sites))
    for f in found:
        rs, h = f.split, f.site.num_heads
        shift = int(leading_padding(capture.flags(f.site, "query", batch)[1]))
        writer.write(SplitBlock(dst=np.arange(h) + first[f.site.name], src_d=np.zeros(h, dtype=np.int64),
                                src_h=np.arange(h), positions=np.asarray([rs.query_positions], dtype=np.int64) - shift,
                                n_rows=[len(rs.query_positions)], stats=rs.stats, layouts=[rs.layout],
                                texts=[(f.query, list(rs.referents))]))
    return writer.columns()

def _doc_row(doc: Document, tokens: int, error: str | None, note: str | None = None) -> dict:
    """A ``documents`` row: ``status`` error with ``error`` its line, else ok with ``error`` empty or the note on
    what could not be computed (e.g. no split: no site lets the query see a referent)."""
    return {"id": doc.id, "row": doc.row, "tokens": tokens, "status": "error" if error else "ok",
            "error": error or note or ""}


def _capture(model, tokenizer, docs: list[Document], options: Options, plan: StopPlan | None):
    from inspector.capture.recorder import capture

    targets = [d.target for d in docs]
    return capture(model, tokenizer, [d.text for d in docs], None if all(t is None for t in targets) else targets,
                   weights=False, dtype=options.dtype, value_norms=False,
                   forward_sums=lambda records: ForwardSums(records, (bool(options.exclude_special),), plan))


def reduce_batch(model, tokenizer, docs: list[Document], options: Options = Options(),
                 *, plan: StopPlan | None = None) -> BatchResult:
    """Capture ``docs`` together (padded) and reduce each to its ``heads`` rows; never raises for a bad
    document: its ``documents`` row carries the error instead. ``plan`` (a
    :class:`~inspector.corpus.forward_sums.StopPlan` kept across the batches of one model) ends each forward
    pass after its last attention call once a first full pass has shown where that is.

    Documents that cannot be captured together (one too long for the model, targets on some but not
    all, a tokenizer without a padding token) are captured one at a time, so one bad document costs its batch only speed.
    """
    return _analysed(_captured(model, tokenizer, docs, options, plan))


def _captured(model, tokenizer, docs: list[Document], options: Options, plan: StopPlan | None) -> Captured:
    """:func:`capture_batch` in inference mode: nothing of a scan's passes is differentiated, so no autograd
    bookkeeping per operation (the prefetching thread calls it too)."""
    with torch.inference_mode():
        return capture_batch(model, tokenizer, docs, options, plan=plan)


def _analysed(captured: Captured) -> BatchResult:
    """:func:`analyse` in inference mode (the capture's tensors were made in it)."""
    with torch.inference_mode():
        return analyse(captured)


@dataclass
class Captured:
    """The first stage of :func:`reduce_batch`: the batch's captures (each with the documents it
    holds, in batch order) and the ``documents`` rows of documents that could not be captured."""

    docs: list[Document]
    options: Options
    captures: list[tuple[object, list[tuple[int, Document]]]]
    doc_rows: dict[int, dict]
    routes: dict[int, pd.DataFrame | str] | None = None  # with options.routes: per document with a query, rows or error


def capture_batch(model, tokenizer, docs: list[Document], options: Options = Options(),
                  *, plan: StopPlan | None = None) -> Captured:
    """Capture ``docs`` (lazily, in memory): together, or one at a time where they cannot be together; ``plan``
    as :func:`reduce_batch` takes it."""
    doc_rows: dict[int, dict] = {}
    captures: list[tuple[object, list[tuple[int, Document]]]] = []
    good: list[tuple[int, Document]] = []
    for i, doc in enumerate(docs):
        problem = check_document(doc)
        if problem:
            doc_rows[i] = _doc_row(doc, 0, problem)
        else:
            good.append((i, doc))
    groups = [good] if good else []
    if len(good) > 1 and getattr(tokenizer, "pad_token", None) is None:  # no padding: one document at a time
        groups = [[g] for g in good]
    elif len(good) > 1:
        try:
            captures.append((_capture(model, tokenizer, [d for _, d in good], options, plan), good))
        except Exception:  # noqa: BLE001 - retried one by one, where the culprit gets the error
            groups = [[g] for g in good]
        else:
            groups = []
    for group in groups:
        (i, doc), = group
        try:
            captures.append((_capture(model, tokenizer, [doc], options, plan), group))
        except Exception as exc:  # noqa: BLE001 - a bad document never stops the scan
            doc_rows[i] = _doc_row(doc, 0, error_line(exc))
    found = _routes(model, tokenizer, [(i, d) for _, g in captures for i, d in g], options) if options.routes else None
    return Captured(docs=docs, options=options, captures=captures, doc_rows=doc_rows, routes=found)


def _routes(model, tokenizer, docs: list[tuple[int, Document]], options: Options) -> dict[int, pd.DataFrame | str]:
    """:func:`~inspector.corpus.route_rows.document_route` of every captured document with a query (its error
    line where it fails); one forward pass each."""
    from inspector.corpus.route_rows import document_route

    out: dict[int, pd.DataFrame | str] = {}
    for i, doc in docs:
        if doc.query is None:
            continue
        try:
            out[i] = document_route(model, tokenizer, doc, options.routes_threshold)
        except Exception as exc:  # noqa: BLE001 - a bad document never stops the scan
            out[i] = error_line(exc)
    return out


def analyse(captured: Captured) -> BatchResult:
    """The second stage of :func:`reduce_batch`: every captured document to its rows. Where the fast path
    (:func:`~inspector.corpus.batch_reduce.batch_tables`) gave the whole batch's rows as one Arrow table, that is
    the heads table, with no DataFrame in between; else the rows are merged as DataFrames."""
    from inspector.corpus.tables import frame_of, table_of

    doc_rows = dict(captured.doc_rows)
    frames: list = []  # DataFrames, or Arrow tables from the fast path
    for cap, group in captured.captures:
        _reduce(cap, group, captured.options, doc_rows, frames)
    if len(frames) == 1 and not isinstance(frames[0], pd.DataFrame) and captured.routes is None:
        heads = frames[0]
    else:
        frames = [f if isinstance(f, pd.DataFrame) else frame_of(f) for f in frames]
        heads = (frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)) if frames else pd.DataFrame()
        if captured.routes is not None:
            heads = _with_routes(heads, captured, doc_rows)  # may turn documents into errors
        if "driving_row" in heads and heads["driving_row"].dtype != "Int64":  # a position, missing where the split did
            heads["driving_row"] = heads["driving_row"].astype("Int64")  # not reach a site (or a document has no query)
    rows = [doc_rows[i] for i in range(len(captured.docs))]
    documents = table_of({c: [r[c] for r in rows] for c in DOC_COLUMNS}) if rows else pd.DataFrame([], columns=DOC_COLUMNS)
    return BatchResult(documents, heads)


def _with_routes(heads: pd.DataFrame, captured: Captured, doc_rows: dict) -> pd.DataFrame:
    """``heads`` with ``on_route`` (nullable bool) and ``route_share`` (float) per row: missing for documents
    without a query; a document whose route failed gets its error and loses its rows."""
    failed = set()
    for i, found in captured.routes.items():
        if isinstance(found, str) and doc_rows[i]["status"] == "ok":
            doc_rows[i] = {**doc_rows[i], "status": "error", "error": found}
            failed.add(captured.docs[i].id)
    if not len(heads):
        return heads
    if failed:
        heads = heads[~heads["id"].isin(failed)].reset_index(drop=True)
    tables = [t.assign(id=captured.docs[i].id) for i, t in captured.routes.items() if not isinstance(t, str)]
    keys = ["id", "site", "head"]
    if tables:
        found = pd.concat(tables, ignore_index=True).set_index(keys)
        where = pd.MultiIndex.from_frame(heads[keys].astype({"head": "int64"}))
        on = found["on_route"].reindex(where)
        share = found["route_share"].reindex(where)
    else:
        on = share = pd.Series([None] * len(heads))
    heads["on_route"] = pd.array(on.tolist(), dtype="boolean")
    heads["route_share"] = pd.to_numeric(pd.Series(share.tolist(), dtype="float64")).to_numpy()
    return heads


def _reduce(cap, group: list[tuple[int, Document]], options: Options, doc_rows: dict, frames: list) -> None:
    """The rows of every document in ``cap``: all at once (:mod:`inspector.corpus.batch_reduce`) where that applies,
    else one by one with :func:`document_rows`; in batch order either way."""
    from inspector.corpus.batch_reduce import batch_tables
    from inspector.corpus.tables import frame_of

    fast = batch_tables(cap, [d for _, d in group], options)
    done, errors = fast if fast is not None else ({}, {})
    parts: list = []  # Arrow tables from the fast path, DataFrames from the per-document one
    for b, (i, doc) in enumerate(group):
        tokens = _real_tokens(cap, b)
        if b in errors:
            doc_rows[i] = _doc_row(doc, tokens, errors[b])
            continue
        if b in done:
            if not any(p is done[b] for p in parts):
                parts.append(done[b])
            doc_rows[i] = _doc_row(doc, tokens, None)
            continue
        try:
            rows = document_rows(cap, b, doc, options)
        except Exception as exc:  # noqa: BLE001 - a bad document never stops the scan
            doc_rows[i] = _doc_row(doc, tokens, error_line(exc))
        else:
            parts.append(rows)
            doc_rows[i] = _doc_row(doc, tokens, None, rows.attrs.get("note"))
    if len(parts) == 1:
        frames.append(parts[0])
    elif parts:
        heads = pd.concat([p if isinstance(p, pd.DataFrame) else frame_of(p) for p in parts], ignore_index=True)
        order = heads["id"].map({doc.id: k for k, (_, doc) in enumerate(group)}).to_numpy()
        frames.append(heads.iloc[np.argsort(order, kind="stable")].reset_index(drop=True))


def batched(docs: Iterable[Document], size: int) -> Iterator[list[Document]]:
    """The documents in lists of at most ``size`` (the last may be shorter), in order."""
    batch: list[Document] = []
    for doc in docs:
        batch.append(doc)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


LENGTH_WINDOW = 16  # batches read ahead and sorted by length together (length_batches) ...
WINDOW_CHARS = 1 << 22  # ... unless their texts reach this many characters first (4 MiB of text held at most, plus one)


def length_of(doc: Document) -> int:
    """A document's length in characters (text plus target): the order :func:`length_batches` batches in without a
    fast tokenizer (and the Ray engine's driver, which loads none), read without tokenizing. A text that is not a
    string counts 0."""
    return sum(len(x) for x in (doc.text, doc.target) if isinstance(x, str))


def token_lengths(docs: list[Document], tokenizer) -> list[int] | None:
    """Each document's length in tokens (text plus target, without special tokens), from one call of a fast
    tokenizer's Rust batch encoder over all of them (about 0.07 ms per short text), or None where there is no
    tokenizer, it is not a fast one, or it fails (callers then sort by :func:`length_of`). A text or target that
    is not a string counts 0."""
    if tokenizer is None or not getattr(tokenizer, "is_fast", False) or not docs:
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)

    def count(texts: list[str]) -> list[int]:
        if hasattr(backend, "encode_batch_fast"):  # the Rust encoder without offsets: half the wrapper's time
            # real tokens, whatever padding the wrapper's last call left set on the backend
            return [sum(e.attention_mask) for e in backend.encode_batch_fast(texts, add_special_tokens=False)]
        return [len(ids) for ids in tokenizer(texts, add_special_tokens=False, return_attention_mask=False,
                                              return_token_type_ids=False)["input_ids"]]

    try:
        with TOKENIZER_LOCK:  # the scan's worker threads tokenize their batches meanwhile
            lengths = count([d.text if isinstance(d.text, str) else "" for d in docs])
            if any(isinstance(d.target, str) for d in docs):
                targets = count([d.target if isinstance(d.target, str) else "" for d in docs])
                lengths = [n + t for n, t in zip(lengths, targets, strict=True)]
    except Exception:  # noqa: BLE001 - only the order depends on it: sorted by characters instead
        return None
    return lengths


def length_batches(docs: Iterable[Document], size: int, window: int | None = None,
                   tokenizer=None) -> Iterator[list[Document]]:
    """The documents in batches of ``size`` (the last of each window may be shorter) whose members have similar
    lengths: ``size * window`` documents are read ahead (fewer where their texts reach :data:`WINDOW_CHARS`
    characters: long documents are not held many at a time), sorted by length (stable: equal lengths keep the
    corpus's order) and cut into batches, so a padded batch spends little of its forward pass on padding. The
    length is in tokens where ``tokenizer`` is a fast one (:func:`token_lengths`: one batch call per window), else
    in characters (:func:`length_of`, read without tokenizing). On the demo's clauses, batches of 8, padded
    tokens fall from 1.22 of the real ones in corpus order to 1.07 by characters and 1.02 by tokens. Each
    document is in exactly one batch; memory holds one window of documents, not their captures. What a
    document's rows hold does not depend on its batch but for float32 rounding (:mod:`inspector.corpus.reduce`
    computes every statistic over the document's own tokens, but a padded matrix product may round differently:
    a ratio such as ``lift`` moves by up to about 1e-5); the order in which batches are committed follows the length.
    ``window`` defaults to :data:`LENGTH_WINDOW`; 1 is :func:`batched`."""
    window = LENGTH_WINDOW if window is None else window
    if window <= 1:
        yield from batched(docs, size)
        return
    chunk: list[Document] = []
    chars = 0
    for doc in docs:
        chunk.append(doc)
        chars += length_of(doc)
        # a window ends at its count, or once its texts hold WINDOW_CHARS (long documents are not read ahead)
        if len(chunk) >= size * window or chars >= WINDOW_CHARS:
            yield from _cut(chunk, size, tokenizer)
            chunk, chars = [], 0
    yield from _cut(chunk, size, tokenizer)


def _cut(chunk: list[Document], size: int, tokenizer=None) -> Iterator[list[Document]]:
    lengths = token_lengths(chunk, tokenizer) or [length_of(d) for d in chunk]
    ordered = [chunk[i] for i in sorted(range(len(chunk)), key=lengths.__getitem__)]
    for i in range(0, len(ordered), size):
        yield ordered[i:i + size]


def _on_cpu(model) -> bool:
    """Whether ``model`` runs on the CPU (read from its first parameter; a model without any counts as on the CPU)."""
    first = next(iter(model.parameters()), None)
    return first is None or first.device.type == "cpu"


WORKERS = 2  # the local engine's worker threads on a CPU by default (each with half the torch threads)


def default_workers(model, options: Options = Options(), prefetch: bool | None = None) -> int:
    """The local engine's worker threads when none are asked for: on a CPU, two (each batch's forward pass on half
    the torch threads, two batches at once) where torch has two threads or more; one on a GPU, with route rows
    (their intervention passes run one at a time) or with ``prefetch`` asked for. Measured in
    ``benchmarks/scan.py``: on 2 CPUs, short clauses run faster two at a time on one thread each than one at a
    time on both (the per-batch work outside the matrix products, which one thread does, overlaps the other
    batch's forward pass)."""
    if not _on_cpu(model) or options.routes or prefetch:
        return 1
    return max(1, min(WORKERS, torch.get_num_threads()))


def local_batches(model, tokenizer, docs: Iterable[Document], *, batch_size: int = 8,
                  options: Options = Options(), prefetch: bool | None = None,
                  workers: int | None = None) -> Iterator[BatchResult]:
    """The local engine: :func:`reduce_batch` over ``docs``, ``batch_size`` documents of similar length in tokens at a
    time (:func:`length_batches`), yielded in that order.

    ``workers`` (default :func:`default_workers`) above 1 reduces that many batches at once, each in a thread of
    its own: the model is shared (:func:`~inspector.capture.interface.concurrent_captures`), the torch threads are
    divided between the workers for the scan (``torch.set_num_threads``, restored after; on a CPU) and at most
    ``workers`` batches are in memory beside the one being committed. The rows are those of one worker. Each
    worker gets ``torch.get_num_threads() // workers`` threads (at least one: 3 threads make 2 workers of 1).
    With route rows (``options.routes``) each document's route pass changes the model (hooks) and runs alone
    (:func:`~inspector.capture.interface.model_alone`), so more workers gain little there. Until the generator is
    exhausted or closed (also while it is paused between batches) the model is held as
    :func:`~inspector.capture.interface.concurrent_captures` says (its configs name the recording attention,
    evaluation mode) and torch has the divided thread count: exhaust or ``close()`` it before using the model or
    torch otherwise. Raises :class:`InspectorError` for a ``workers`` that is not a whole number of at least 1.

    With one worker and ``prefetch`` the next batch is captured in a background thread while this one is analysed
    (torch releases the GIL in its kernels; on a GPU the forward pass then overlaps the analysis, which
    runs on the CPU), holding at most two batches' captures. The rows are the same either way. By default
    (None) it is on for a model on a GPU and off on the CPU, where the two threads share the cores and
    their torch thread pool (measured slower: ``benchmarks/scan.py``), and the rank sums are taken in the
    forward pass anyway (:mod:`inspector.corpus.forward_sums`).
    """
    workers = default_workers(model, options, prefetch) if workers is None else check_workers(workers)
    if prefetch is None:
        prefetch = not _on_cpu(model)
    plan = StopPlan.of(model)  # kept per model: a shape learned by an earlier scan of this model is not learned again
    if workers > 1:
        yield from _threaded(model, tokenizer, length_batches(docs, batch_size, tokenizer=tokenizer), options, plan,
                             workers)
        return
    if not prefetch:
        for batch in length_batches(docs, batch_size, tokenizer=tokenizer):
            yield reduce_batch(model, tokenizer, batch, options, plan=plan)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="inspector-capture") as pool:
        pending = None
        for batch in length_batches(docs, batch_size, tokenizer=tokenizer):
            submitted = pool.submit(_captured, model, tokenizer, batch, options, plan)
            if pending is not None:
                yield _analysed(pending.result())
            pending = submitted
        if pending is not None:
            yield _analysed(pending.result())


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's intra-op threads set to ``n`` for the block (threads started in it take that many), restored after."""
    before = torch.get_num_threads()
    if n != before:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def _threaded(model, tokenizer, batches: Iterable[list[Document]], options: Options, plan: StopPlan,
              workers: int) -> Iterator[BatchResult]:
    """:func:`reduce_batch` of ``batches`` in ``workers`` threads, yielded in order; at most ``workers`` batches
    submitted ahead. On leaving (done, an error, the caller closing), batches not started are cancelled and the
    running ones finish before the model and the torch threads are given back."""
    from concurrent.futures import ThreadPoolExecutor

    from inspector.capture.interface import concurrent_captures

    per = max(1, torch.get_num_threads() // workers) if _on_cpu(model) else torch.get_num_threads()
    pending: collections.deque = collections.deque()
    with concurrent_captures(model), torch_threads(per):
        pool = ThreadPoolExecutor(workers, thread_name_prefix="inspector-scan")
        try:
            for batch in batches:
                pending.append(pool.submit(reduce_batch, model, tokenizer, batch, options, plan=plan))
                if len(pending) >= workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
