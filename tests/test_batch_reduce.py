"""The corpus scan's fast path (every document of a batch at once, inspector.corpus.batch_reduce) against the
per-document path (reduce.document_rows: rank_heads and split_heads on each batch row).

Both read the same capture; every column must agree, on bidirectional, left-padded causal and
encoder-decoder models, with documents that exercise the split's edges: a multi-token query, a query
that occurs twice (with and without --occurrence), a referent not in the text, a query before its
referents under a causal mask, shared word pieces, and special-token exclusion.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from inspector.analysis.question import Question
from inspector.capture.models import LoadedModel
from inspector.corpus import reduce
from inspector.corpus.batch_reduce import batch_rows
from inspector.corpus.documents import Fields
from inspector.corpus.reduce import Options, capture_batch

import tiny
from helpers.scan import assert_same_rows, docs_of

ROWS = [
    {"id": "one", "text": "The Lessee shall indemnify the Lessor. Such indemnity survives termination.",
     "query": "indemnity", "referents": ["Lessee", "Lessor"]},
    {"id": "multi", "text": "Acme Ltd leases the yard to Globex Inc, and the indemnity clause binds Globex Inc to Acme Ltd.",
     "query": "indemnity clause", "referents": ["Acme Ltd", "Globex Inc"]},
    {"id": "plain", "text": "A short clause without any query at all."},
    {"id": "twice", "text": "The indemnity of the Lessee and the indemnity of the Lessor differ.",
     "query": "indemnity", "referents": ["Lessee", "Lessor"], "occurrence": 2},
    {"id": "ambiguous", "text": "The indemnity of the Lessee and the indemnity of the Lessor differ.",
     "query": "indemnity", "referents": ["Lessee", "Lessor"]},
    {"id": "missing", "text": "The Lessee pays the rent; the indemnity is void.", "query": "indemnity",
     "referents": ["Lessee", "Landlord"]},
    {"id": "early", "text": "Indemnity is owed by the Lessee to the Lessor under this lease.", "query": "Indemnity",
     "referents": ["Lessee", "Lessor"]},
    {"id": "spaced", "text": "The Lessor gives notice. The Lessee pays, and its indemnity covers the Lessor.",
     "query": "indemnity", "referents": [" Lessee", "Lessor "]},
]
TARGETS = ["The Lessee indemnifies.", "Globex Inc pays Acme Ltd for the yard and the indemnity clause.", "Short.",
           "The Lessor.", "Rent.", "The indemnity is void.", "Indemnity by the Lessee.", "Notice."]


def per_document(cap, group, options):
    """The rows and errors of the per-document path on the same capture."""
    frames, errors = [], {}
    for b, (_, doc) in enumerate(group):
        try:
            frames.append(reduce.document_rows(cap, b, doc, options))
        except Exception as exc:  # noqa: BLE001
            errors[b] = reduce.error_line(exc)
    return frames, errors


@pytest.mark.parametrize("name,exclude_special", [
    ("bert", False), ("bert", True), ("gpt2", False), ("gpt2", True), ("bart", False), ("bart", True),
    ("t5", False),  # a position bias in the mask, three kinds of site
    ("gemma2", False),  # soft-capping and sliding windows
    ("llama", True),  # grouped-query attention
    ("mistral", False),
])
def test_the_fast_path_gives_the_rows_of_the_per_document_path(name, exclude_special):
    lm = LoadedModel(tiny.build(name), tiny.tokenizer(), name)
    rows = [dict(r) for r in ROWS]
    fields = Fields(query="query", referents="referents", id="id", occurrence="occurrence")
    if name in ("bart", "t5"):
        fields = Fields(query="query", referents="referents", id="id", occurrence="occurrence", target="target")
        for r, t in zip(rows, TARGETS, strict=True):
            r["target"] = t
    options = Options(exclude_special=exclude_special)
    docs = docs_of(rows, fields)
    captured = capture_batch(lm.model, lm.tokenizer, docs, options)
    assert len(captured.captures) == 1, "the documents were captured together"
    cap, group = captured.captures[0]
    assert set(cap.forward_sums.sums) == {s.name for s in cap.sites}, "every site was summed during the forward"
    fast = batch_rows(cap, [d for _, d in group], options)
    assert fast is not None
    done, errors = fast
    slow_frames, slow_errors = per_document(cap, group, options)
    # every document is decided by the fast path or handed to the per-document one; what it decides agrees
    slow_ids = {f["id"].iloc[0] for f in slow_frames}
    got = []
    for b, (_, doc) in enumerate(group):
        if b in errors:
            assert errors[b] == slow_errors.get(b), doc.id
        elif b in done:
            assert doc.id in slow_ids, doc.id
            got.append(done[b][done[b]["id"] == doc.id])
    fast_ids = {f["id"].iloc[0] for f in got}
    assert "plain" in fast_ids and len(fast_ids - {"plain"}) >= 2, f"the fast path took the usual documents: {fast_ids}"
    assert "ambiguous" in {group[b][1].id for b in errors}
    want = pd.concat([f for f in slow_frames if f["id"].iloc[0] in {g["id"].iloc[0] for g in got}], ignore_index=True)
    mine = pd.concat(got, ignore_index=True)
    assert_same_rows(mine[want.columns], want)
    assert list(mine.columns) == list(want.columns)


@pytest.mark.parametrize("name", ["gpt2", "mistral"])
def test_a_scan_batch_equals_documents_reduced_one_by_one_through_the_per_document_path(name, monkeypatch):
    """reduce_batch with the fast path on equals reduce_batch with it off, documents and rows (mistral's
    4-token window hides the referents from most queries: those documents take the per-document path)."""
    lm = LoadedModel(tiny.build(name), tiny.tokenizer(), name)
    docs = docs_of(ROWS, Fields(query="query", referents="referents", id="id", occurrence="occurrence"))
    fast = reduce.reduce_batch(lm.model, lm.tokenizer, docs)
    import inspector.corpus.batch_reduce as br

    monkeypatch.setattr(br, "fast_path_applies", lambda capture: False)
    slow = reduce.reduce_batch(lm.model, lm.tokenizer, docs_of(ROWS, Fields(query="query", referents="referents", id="id",
                                                                          occurrence="occurrence")))
    assert fast.documents.equals(slow.documents)
    assert fast.heads["id"].tolist() == slow.heads["id"].tolist()
    assert fast.heads["driving_row"].dtype == slow.heads["driving_row"].dtype == "Int64"  # the same Parquet type
    assert_same_rows(fast.heads, slow.heads)


def test_a_non_finite_weight_leaves_the_batch_to_the_per_document_path_which_reports_it():
    """A NaN in one document's Q, made by the model's forward (a hook on layer 1's query projection): the sums
    taken during the forward see it, the fast path declines the capture, and the per-document path records
    that document's error (site, head, row) while the others are reduced as usual."""
    lm = LoadedModel(tiny.build("bert"), tiny.tokenizer(), "bert")
    docs = docs_of(ROWS[:3], Fields(query="query", referents="referents", id="id"))

    def poison(_module, _args, out):
        out[1, 2, 0] = float("nan")
        return out

    handle = lm.model.encoder.layer[1].attention.self.query.register_forward_hook(poison)
    try:
        captured = capture_batch(lm.model, lm.tokenizer, docs)
    finally:
        handle.remove()
    cap = captured.captures[0][0]
    site = cap.sites[1]
    assert cap.forward_sums.finite == {s.name: s is cap.sites[0] for s in cap.sites}  # NaN from layer 1 on
    assert_second_document_reported(captured, site)


def assert_second_document_reported(captured, site) -> None:
    """The fast path declines the batch; the per-document path records document 1's error at ``site``."""
    cap, group = captured.captures[0]
    assert batch_rows(cap, [d for _, d in group], Options()) is None
    result = reduce.analyse(captured)
    assert result.documents["status"].tolist() == ["ok", "error", "ok"]
    assert site.name in result.documents["error"][1]
    assert set(result.heads["id"]) == {"one", "plain"}


def test_a_non_finite_weight_in_a_recomputed_site_leaves_the_batch_to_the_per_document_path():
    """The same where the weights are recomputed from the stored Q and K (no sums taken in the forward)."""
    lm = LoadedModel(tiny.build("bert"), tiny.tokenizer(), "bert")
    docs = docs_of(ROWS[:3], Fields(query="query", referents="referents", id="id"))
    captured = capture_batch(lm.model, lm.tokenizer, docs)
    cap = captured.captures[0][0]
    cap.forward_sums = None
    site = cap.sites[1]
    cap.tensors[site.tensor_name("q")][1, 0, 2, 0] = float("nan")
    assert_second_document_reported(captured, site)


def test_documents_made_in_python_with_spaced_referents_give_the_rows_of_clean_ones():
    """reduce_batch called with Document objects directly (no corpus reader to strip them): the referent
    columns are the words', on the fast path and on the per-document path alike."""
    from inspector.corpus.documents import Document

    lm = LoadedModel(tiny.build("gpt2"), tiny.tokenizer(), "gpt2")
    text = ROWS[0]["text"]
    docs = [Document(row=0, id="spaced", text=text, query="indemnity", referents=[" Lessee", "Lessor "]),
            Document(row=1, id="clean", text=text, query="indemnity", referents=["Lessee", "Lessor"])]
    for fast in (True, False):
        import inspector.corpus.batch_reduce as br

        original = br.fast_path_applies
        br.fast_path_applies = original if fast else (lambda capture: False)
        try:
            heads = reduce.reduce_batch(lm.model, lm.tokenizer, docs).heads
        finally:
            br.fast_path_applies = original
        assert not any(":" in c for c in heads.columns)
        a, b = (heads[heads["id"] == i].reset_index(drop=True) for i in ("spaced", "clean"))
        assert all(list(r) == ["Lessee", "Lessor"] for r in a["referents"])
        assert a["referent_weights"].tolist() == b["referent_weights"].tolist()


@pytest.mark.parametrize("case", ["bert:False", "bert:True", "gpt2:False"])
def test_a_scan_batch_gives_the_rows_the_code_before_issue_21_gave(case):
    """The rows of fixtures/scan_rows.json, made by the scan at commit 2d02920 (per-document split, separate
    per-weight passes) on the same tiny models and documents: today's batched split and passes change no
    number (floats within 1e-6) and no text, type or order of rows. One text was edited in the fixture since:
    "occurs 2 times" reads "occurs twice" (issue 28's wording of counts, inspector.store.words.times)."""
    import json
    import sys

    sys.path.insert(0, str(tiny.FIXTURES))
    from make_scan_rows import rows_of

    saved = json.loads((tiny.FIXTURES / "scan_rows.json").read_text())["cases"][case]
    name, excluded = case.split(":")
    result = rows_of(name, excluded == "True")
    heads = result.heads
    assert list(heads.columns) == saved["columns"]
    # one change on purpose since (issue 20): a document whose referents no site lets the query see is no longer an
    # error; it keeps its rank rows (split columns empty), and its error line became the note of an ok document
    documents = [list(r) for r in result.documents.itertuples(index=False)]
    noted = {d[0]: d for d in documents if d[3] == "ok" and d[4].startswith("no split: ")}
    for d in saved["documents"]:
        # and one wording since (e44c5de, store.words.times): a query found twice "occurs twice", not "occurs 2 times"
        d[4] = d[4].replace("occurs 2 times", "occurs twice") if isinstance(d[4], str) else d[4]
        if d[0] in noted:
            assert d[3:] == ["error", noted[d[0]][4].removeprefix("no split: ")] and d[:3] == noted[d[0]][:3]
            d[3:] = noted[d[0]][3:]
    assert heads.loc[heads["id"].isin(list(noted)), "split_score"].isna().all()
    heads = heads[~heads["id"].isin(list(noted))].reset_index(drop=True)
    want = pd.DataFrame(saved["heads"], columns=saved["columns"])
    for c in ("flagged", "driving_row"):  # JSON keeps None for a missing value: back to the scan's nullable types
        want[c] = want[c].astype(heads[c].dtype)
    # 2d02920 wrote the list columns as text (positions space-joined, row scores to 4 decimals); they are lists now
    # (one definition of a query's positions): the reference's text is compared with the lists written as it was
    heads = heads.copy()
    for c in ("query_positions", "rows_flagged"):
        heads[c] = heads[c].map(lambda v: " ".join(map(str, v)) if isinstance(v, (list, tuple, np.ndarray)) else v)
        want[c] = want[c].map(lambda v: " ".join(map(str, v)) if isinstance(v, (list, tuple, np.ndarray)) else v)
    for c in ("row_split_scores",):  # the reference's 4 decimals: compared to half a unit in the last place
        got = heads.pop(c).tolist()
        ref = want.pop(c).tolist()
        for x, y in zip(got, ref, strict=True):
            if isinstance(y, str):
                np.testing.assert_allclose(np.asarray(x, float), [float(t) for t in y.split()], atol=5e-5 + 1e-6, rtol=0)
            else:
                assert x is None or x is pd.NA or (isinstance(x, float) and np.isnan(x)), (x, y)
    assert heads["id"].tolist() == want["id"].tolist()  # rows in the same order
    assert_same_rows(heads, want, tol=1e-6)
    assert documents == saved["documents"]
    assert len(want) > 0 and want["split_score"].notna().any(), "the reference holds split rows"


# ---- one split: the scan computes it with inspector.analysis.split's code, and nowhere else -------------
SPLIT_NAMES = {"referent_mass", "chance_mass", "lift", "split_score", "shared_share", "split_unshared", "mostly_shared",
               "flagged", "row_split", "row_lift", "row_mass", "row_chance", "per_row", "chance_row", "per_key", "agg",
               "unshared", "by_piece", "driving", "rows_flagged"}


def test_no_corpus_module_computes_the_split_statistics():
    """corpus/ holds no second copy of the split's math: no ``topk`` (the split score's second largest weight), no
    ``passes_all`` (the rule on tensors), no ``clamp_min`` (the lift's guard), no assignment to a name or attribute
    named after a split statistic, and no function or class of its own named after one (``_GroupSplit``,
    ``_second``, ...): such numbers come from :func:`inspector.analysis.split.split_statistics`."""
    import ast
    from pathlib import Path

    import inspector.corpus

    found = []
    for path in sorted(Path(inspector.corpus.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            where = f"{path.name}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Attribute) and node.attr in ("topk", "passes_all", "passes", "clamp_min", "kthvalue"):
                found.append(f"{where} .{node.attr}")
            targets = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    name = sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(sub, ast.Attribute) else None
                    if name in SPLIT_NAMES:
                        found.append(f"{where} assigns {name}")
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and any(
                    w in node.name.lower() for w in ("groupsplit", "doclayout", "second", "lift", "split_score", "chance")):
                found.append(f"{where} defines {node.name}")
    assert not found, f"corpus/ computes split statistics itself (use inspector.analysis.split): {found}"


def test_the_scan_and_split_heads_compute_the_split_through_split_statistics(monkeypatch):
    """The fast path's split goes through the one function of split.py: counted, it is called (once per axis
    pair of the batch, not per document) and the rows stand; made to raise, the fast path raises. split_heads
    goes through it too."""
    import inspector.analysis.split as split

    lm = LoadedModel(tiny.build("bert"), tiny.tokenizer(), "bert")
    docs = docs_of(ROWS, Fields(query="query", referents="referents", id="id", occurrence="occurrence"))
    cap, group = capture_batch(lm.model, lm.tokenizer, docs, Options()).captures[0]
    before = batch_rows(cap, [d for _, d in group], Options())
    calls = []
    original = split.split_statistics

    def counted(w, *args, **kw):
        calls.append(tuple(w.shape))
        return original(w, *args, **kw)

    monkeypatch.setattr(split, "split_statistics", counted)
    done, _ = batch_rows(cap, [d for _, d in group], Options())
    assert len(calls) == 1 and calls[0][0] >= 3, f"one call for the batch's documents on BERT's one axis pair: {calls}"
    for b, frame in before[0].items():
        pd.testing.assert_frame_equal(done[b], frame)
    calls.clear()
    split.split_heads(cap, Question("indemnity", ["Lessee", "Lessor"]), batch=0)
    assert len(calls) == len(cap.sites) and all(c[0] == 1 for c in calls), "split_heads: a batch of one per site"

    def refuse(*args, **kw):
        raise RuntimeError("the split computed by split.split_statistics")

    monkeypatch.setattr(split, "split_statistics", refuse)
    with pytest.raises(RuntimeError, match="split.split_statistics"):
        batch_rows(cap, [d for _, d in group], Options())


def test_both_paths_write_the_split_columns_with_one_writer(monkeypatch):
    """The per-document path (here forced for every document) and the fast path write the heads rows' split
    columns through the same :class:`~inspector.corpus.batch_reduce.SplitWriter`: one block per site with a split on
    the per-document path, one per axis pair on the fast path; the column types are the same either way."""
    import inspector.corpus.batch_reduce as br

    lm = LoadedModel(tiny.build("bert"), tiny.tokenizer(), "bert")
    fields = Fields(query="query", referents="referents", id="id", occurrence="occurrence")
    blocks: list[tuple[int, int]] = []  # (documents, rows) per block written
    original = br.SplitWriter.write

    def counted(self, block):
        blocks.append((len(block.layouts), len(block.dst)))
        return original(self, block)

    monkeypatch.setattr(br.SplitWriter, "write", counted)
    fast = reduce.reduce_batch(lm.model, lm.tokenizer, docs_of(ROWS[:2], fields))
    assert len(blocks) == 1 and blocks[0][0] == 2, blocks  # BERT: one axis pair, both documents in one block
    blocks.clear()
    monkeypatch.setattr(br, "fast_path_applies", lambda capture: False)
    slow = reduce.reduce_batch(lm.model, lm.tokenizer, docs_of(ROWS[:2], fields))
    sites = lm.model.config.num_hidden_layers
    assert len(blocks) == 2 * sites and all(d == 1 for d, _ in blocks), blocks  # per document, one block per site
    assert fast.heads.dtypes.to_dict() == slow.heads.dtypes.to_dict()
    assert_same_rows(fast.heads, slow.heads)


# ---- the rows straight to Arrow (corpus.tables.table_of) ----------------------------------------------------------
@pytest.mark.parametrize("name", ["bert", "bart"])
def test_the_fast_paths_tables_are_the_arrow_tables_of_its_dataframes(name, monkeypatch):
    """Every table the fast path builds without pandas (heads of plain documents, heads with split columns,
    documents) is, schema and pandas metadata included, the table of the DataFrame the code built before
    (``arrow_table(pd.DataFrame(columns))``), for the first batch of a signature and for later ones (kept schema);
    and BatchResult's DataFrames have that DataFrame's dtypes (``mostly_shared`` an object column)."""
    from inspector.corpus import batch_reduce, tables

    lm = LoadedModel(tiny.build(name), tiny.tokenizer(), name)
    fields = Fields(query="query", referents="referents", id="id", occurrence="occurrence")
    if name == "bart":
        fields = Fields(query="query", referents="referents", id="id", occurrence="occurrence", target="target")
    rows = [dict(r, target="The Lessee pays.") for r in ROWS]
    seen: list[dict] = []
    real = tables.table_of

    def spy(columns):
        seen.append(dict(columns))
        return real(columns)

    monkeypatch.setattr(batch_reduce, "table_of", spy)
    monkeypatch.setattr(tables, "table_of", spy)
    tables._TABLE_SCHEMAS.clear()
    results = [reduce.reduce_batch(lm.model, lm.tokenizer, docs_of(rows, fields)) for _ in range(2)]
    assert len(seen) >= 4 and any("split_score" in c for c in seen) and any("row" in c for c in seen)
    for columns in seen:
        want = tables.arrow_table(pd.DataFrame({n: tables._pandas_column(c) for n, c in columns.items()}))
        assert real(columns).equals(want, check_metadata=True), list(columns)
    heads = results[1].heads
    built = pd.DataFrame({n: tables._pandas_column(c) for n, c in seen[-2 if "row" in seen[-1] else -1].items()})
    if "mostly_shared" in built:
        assert heads["mostly_shared"].dtype == built["mostly_shared"].dtype == object
    assert results[1].heads is heads  # made once: a change to it stays


def test_table_of_reads_each_columns_values_not_the_first_ones():
    """A kept schema is reused only for columns of the same value types: ints then floats, ints with None, nested
    lists and an int past int64 each give what pandas gives."""
    from inspector.corpus import tables

    tables._TABLE_SCHEMAS.clear()
    cases = [[1, 2], [1, 2.5], [1, None], [[1]], [[1.5]], [1], [2 ** 63], [], ["a", None], [True, None]]
    for values in cases:
        want = tables.arrow_table(pd.DataFrame({"x": values}))
        got = tables.table_of({"x": values})
        assert got.equals(want, check_metadata=True), (values, got.schema, want.schema)
        assert got.column("x").to_pylist() == want.column("x").to_pylist()


def test_the_sites_of_one_mask_share_their_gathered_rows():
    """The forward keeps a site's visible keys as the one tensor of its mask, so the split's rows of BERT's six
    sites share one ``vis`` (gathered once) and the split reads it once for every head."""
    from inspector.corpus import batch_reduce

    lm = LoadedModel(tiny.build("bert"), tiny.tokenizer(), "bert")
    docs = docs_of(ROWS, Fields(query="query", referents="referents", id="id", occurrence="occurrence"))
    cap, group = capture_batch(lm.model, lm.tokenizer, docs, Options()).captures[0]
    axes = cap.forward_sums.axes
    queries, _ = batch_reduce._queries(cap, [d for _, d in group], cap.sites)
    _, rows = batch_reduce._site_passes(cap, list(cap.sites), axes, queries, (False,))
    assert len(rows) == len(cap.sites) > 1 and all(r is not None for r in rows)
    assert all(r.vis is rows[0].vis for r in rows), "one gathered vis for the sites of one mask"
