"""Scanning a corpus (`inspector scan`) and querying it (`inspector corpus`).

Tiny seeded models from fixtures/models/ with the MiniLM tokenizer; a few documents each. The
per-document rows are checked against inspector's own analyses of a capture of the document alone
(with the model's eager weights), padded batches against single documents, a resumed scan against an
uninterrupted one, the Ray engine against the local one, and DuckDB's aggregates against pandas'.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from inspector import cli
from inspector.analysis import rank_heads, split_heads
from inspector.analysis.question import Question
from inspector.capture import capture
from inspector.capture.models import LoadedModel
from inspector.corpus import queries as corpus
from inspector.corpus.documents import Corpus, Fields
from inspector.corpus.engine import Engine, ModelSpec
from inspector.corpus.folder import ScanFolder, committed_documents
from inspector.corpus.leases import lease_rows, write_jsonl
from inspector.corpus.reduce import Options, reduce_batch
from inspector.corpus.scan import scan
from inspector.errors import InspectorError

import tiny
from conftest import stop_at_commit
from helpers.scan import FIELDS, TOL, assert_same_rows, docs_of, read_heads

ROOT = Path(__file__).resolve().parent.parent

DOCS = [
    {"id": "a", "text": "The Lessee shall indemnify the Lessor. Such indemnity survives termination.",
     "query": "indemnity", "referents": ["Lessee", "Lessor"]},
    {"id": "b", "text": "Acme Ltd leases the yard to Globex Inc, and Globex Inc shall indemnify Acme Ltd; the indemnity survives.",
     "query": "indemnity", "referents": ["Acme Ltd", "Globex Inc"]},
    {"id": "c", "text": "A short clause without any query at all."},
    {"id": "d", "text": "The Lessor gives notice. The Lessee pays the rent, and its indemnity covers the Lessor.",
     "query": "indemnity", "referents": ["Lessee", "Lessor"]},
]


def loaded(name: str) -> LoadedModel:
    return LoadedModel(tiny.build(name), tiny.tokenizer(), f"tiny-{name}")


@pytest.fixture(scope="module")
def bert():
    return loaded("bert")


# ---- the per-document function ---------------------------------------------------------------------
def test_document_rows_equal_the_analyses_of_a_capture_of_the_document_alone(bert):
    """Lazy, batched, in memory -> the same numbers as rank_heads / split_heads on a full capture (eager weights)."""
    result = reduce_batch(bert.model, bert.tokenizer, docs_of(DOCS))
    assert result.documents["status"].tolist() == ["ok"] * 4
    for row in DOCS:
        cap = capture(bert.model, bert.tokenizer, row["text"], weights=True)
        got = result.heads[result.heads["id"] == row["id"]].reset_index(drop=True)
        rank = rank_heads(cap).sort_values(["site", "head"]).reset_index(drop=True)
        for col in ["entropy", "normalized_entropy", "sink_mass", "self_mass", "prev_mass", "top_key_weight"]:
            np.testing.assert_allclose(got[col], rank[col], atol=TOL, rtol=0, err_msg=col)
        assert got["top_key_index"].tolist() == rank["top_key_index"].tolist()
        assert got["label"].tolist() == rank["label"].tolist()
        assert result.documents.set_index("id").loc[row["id"], "tokens"] == len(cap.records("source").ids)
        if "query" not in row:
            assert "split_score" not in got or got["split_score"].isna().all()
            continue
        split = split_heads(cap, Question(row["query"], row["referents"])).sort_values(["site", "head"]).reset_index(drop=True)
        np.testing.assert_allclose(got["split_score"], split["split_score"], atol=TOL, rtol=0)
        np.testing.assert_allclose(got["referent_mass"], split["referent_mass"], atol=TOL, rtol=0)
        weights = np.array(got["referent_weights"].tolist(), dtype=float)
        np.testing.assert_allclose(weights, split[[f"weight:{r}" for r in row["referents"]]].to_numpy(), atol=TOL, rtol=0)
        assert got["flagged"].astype(bool).tolist() == split["flagged"].tolist()
        assert got["query_positions"].tolist() == split["query_positions"].tolist()
        assert all(list(r) == row["referents"] for r in got["referents"])


@pytest.mark.parametrize("name", ["bert", "gpt2", "bart"])
def test_padded_batches_give_the_rows_of_single_documents(name):
    """Right padding (BERT, BART) and left padding (GPT-2 batches): positions are reported as in the
    document alone, statistics over its own tokens only."""
    lm = loaded(name)
    rows = [dict(r) for r in DOCS]
    fields = FIELDS
    if name == "bart":
        fields = Fields(query="query", referents="referents", id="id", target="target")
        for i, r in enumerate(rows):
            r["target"] = ["The Lessee indemnifies.", "Globex Inc pays Acme Ltd for the yard and more.", "Short.",
                           "Rent."][i]
    docs = docs_of(rows, fields)
    together = reduce_batch(lm.model, lm.tokenizer, docs)
    alone = [reduce_batch(lm.model, lm.tokenizer, [d]) for d in docs]
    assert together.documents.equals(pd.concat([a.documents for a in alone], ignore_index=True))
    assert_same_rows(together.heads, pd.concat([a.heads for a in alone], ignore_index=True))
    # the padding really was there: the documents have different lengths
    assert together.documents["tokens"].nunique() > 1


# ---- bad documents ---------------------------------------------------------------------------------
def test_bad_documents_are_recorded_and_never_stop_the_scan(bert, tmp_path):
    data = tmp_path / "bad.jsonl"
    lines = [json.dumps(DOCS[0]),
             json.dumps({"id": "empty", "text": "   ", "query": "x", "referents": ["a", "b"]}),
             json.dumps({"id": "long", "text": "word " * 300}),
             json.dumps({"id": "missing", "text": "The Lessee shall indemnify. Such indemnity survives.",
                         "query": "indemnity", "referents": ["Lessee", "Guarantor"]}),
             "{not json",
             json.dumps({"id": "noref", "text": "The indemnity survives.", "query": "indemnity"}),
             json.dumps({"id": "number", "text": 42}),
             json.dumps(DOCS[1]),
             json.dumps(DOCS[1] | {"text": "A different text under a repeated id."}),
             json.dumps(DOCS[0] | {"id": "atword", "query": "@x1"}),
             json.dumps(DOCS[0] | {"id": "backwards", "query": "@3-1"})]
    data.write_text("\n".join(lines) + "\n")
    result = scan(data, tmp_path / "out", fields=FIELDS, engine=Engine(batch_size=4), loaded=bert, progress=False)
    assert (result.total, result.scanned, result.errors) == (11, 11, 9)
    docs = pd.read_parquet(tmp_path / "out" / "documents.parquet").set_index("id")
    assert docs.loc["a", "status"] == "ok" and docs.loc["b", "status"] == "ok"
    errors = docs[docs["status"] == "error"]["error"].to_dict()
    assert errors["empty"] == "the text is empty"
    assert "accepts at most 128" in errors["long"]
    assert "'Guarantor' is not in the source text" in errors["missing"]
    assert errors["#row4"].startswith("line 5 is not valid JSON")
    assert errors["noref"] == "give both a query and referents (or neither)"
    assert "not a string" in errors["number"]
    assert "repeats an earlier row's id" in errors["b#row8"]
    # a query that starts with @ but is no token index: refused per document, not read as the word "@x1"
    assert errors["atword"].startswith("query '@x1' is not a token index: write @I")
    assert errors["backwards"].startswith("query '@3-1' is not a token index")
    heads = read_heads(tmp_path / "out")
    assert sorted(heads["id"].unique()) == ["a", "b"]
    assert docs["row"].tolist() == list(range(11))


# ---- resuming --------------------------------------------------------------------------------------
def test_resume_after_an_interruption_equals_an_uninterrupted_scan(bert, tmp_path, monkeypatch, commit_per_batch):
    data = write_jsonl(tmp_path / "leases.jsonl", lease_rows(12))
    full = tmp_path / "full"
    scan(data, full, fields=FIELDS, engine=Engine(batch_size=3), loaded=bert, progress=False)

    # stop the second scan between the two writes of its third batch: its heads part is written, the
    # documents part (the commit record) is not -- what a kill at the worst moment leaves
    part = tmp_path / "part"
    original = stop_at_commit(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        scan(data, part, fields=FIELDS, engine=Engine(batch_size=3), loaded=bert, progress=False)
    monkeypatch.setattr(ScanFolder, "commit", original)
    assert len(list((part / "heads").glob("part-*.parquet"))) == 3  # two committed, one in flight
    assert len(committed_documents(part)) == 6
    # readers never see the in-flight part
    assert sorted(read_heads(part)["id"].unique()) == sorted(committed_documents(part).query("status == 'ok'")["id"])
    stopped = pd.read_parquet(part / "documents.parquet")
    assert len(stopped) == 6  # documents.parquet was written when the scan stopped

    result = scan(data, part, fields=FIELDS, engine=Engine(batch_size=3), loaded=bert, progress=False)
    assert (result.skipped, result.scanned) == (6, 6)
    a, b = pd.read_parquet(full / "documents.parquet"), pd.read_parquet(part / "documents.parquet")
    assert a.equals(b)
    assert_same_rows(read_heads(full), read_heads(part), tol=0.0)  # same batches: bit for bit
    # a third run has nothing left to do, and brings a documents.parquet that lags the parts (a hard kill
    # between a commit and the next rewrite) up to date
    from inspector.corpus.folder import write_parquet

    write_parquet(part / "documents.parquet", a.iloc[:3])
    again = scan(data, part, fields=FIELDS, engine=Engine(batch_size=3), loaded=bert, progress=False)
    assert (again.skipped, again.scanned) == (12, 0)
    assert pd.read_parquet(part / "documents.parquet").equals(a)


def test_a_scan_folder_refuses_other_options_and_foreign_folders(bert, tmp_path, capsys):
    data = write_jsonl(tmp_path / "leases.jsonl", lease_rows(10))
    scan(data, tmp_path / "out", fields=FIELDS, engine=Engine(batch_size=4), loaded=bert, progress=False)
    with pytest.raises(Exception, match="other options"):
        scan(data, tmp_path / "out", fields=FIELDS, options=Options(min_split=0.5), loaded=bert, progress=False)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert cli.main(["scan", str(data), "-o", str(tmp_path / "other"), "--query-field", "query"]) == 2
    err = capsys.readouterr().err
    assert "is not empty and holds no scan" in err
    assert "loading model" not in err  # refused before any model loads, and says nothing of one
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"
    assert cli.main(["scan", str(data), "-o", str(tmp_path / "x"), "--text-field", "body"]) == 2
    assert "has no field 'body' (no row has it)" in capsys.readouterr().err and not (tmp_path / "x").exists()
    # a misspelt optional field is refused up front too, naming its flag, not found wrong in every document
    assert cli.main(["scan", str(data), "-o", str(tmp_path / "x"), "--query-field", "query", "--referents-field",
                     "parties_"]) == 2
    err = capsys.readouterr().err
    assert "has no field 'parties_'" in err and "--referents-field" in err and not (tmp_path / "x").exists()
    # a field only some rows have is fine: those rows have no query (scanned for rank rows only)
    rows = lease_rows(10)[:4]
    rows[0] = {k: v for k, v in rows[0].items() if k not in ("query", "referents")}
    some = write_jsonl(tmp_path / "some.jsonl", rows[1:] + rows[:1])
    scan(some, tmp_path / "y", fields=FIELDS, engine=Engine(batch_size=4), loaded=bert, progress=False)
    docs = pd.read_parquet(tmp_path / "y" / "documents.parquet")
    assert (docs["status"] == "ok").all() and len(docs) == 4
    assert cli.main(["corpus", str(tmp_path)]) == 2
    assert "holds no scan" in capsys.readouterr().err


# ---- corpus formats --------------------------------------------------------------------------------
def test_jsonl_csv_parquet_and_datasets_folders_read_the_same_documents(tmp_path):
    rows = lease_rows(12)
    write_jsonl(tmp_path / "c.jsonl", rows)
    flat = pd.DataFrame(rows)
    flat.assign(referents=[",".join(r) for r in flat["referents"]]).to_csv(tmp_path / "c.csv", index=False)
    flat.to_parquet(tmp_path / "c.parquet")
    paths = [tmp_path / "c.jsonl", tmp_path / "c.csv", tmp_path / "c.parquet"]
    try:
        import datasets

        datasets.Dataset.from_pandas(flat).save_to_disk(str(tmp_path / "ds"))
        paths.append(tmp_path / "ds")
    except ImportError:  # pragma: no cover - datasets is in the corpus extra
        pass
    read = []
    for p in paths:
        c = Corpus(p, FIELDS)
        assert len(c) == 12
        read.append([(d.row, d.id, d.text, d.query, d.referents, d.problem) for d in c])
    assert all(r == read[0] for r in read[1:])
    assert read[0][8][4] == [rows[8]["referents"][0], "Guarantor"]


# ---- DuckDB ----------------------------------------------------------------------------------------
def _pandas_summary(heads: pd.DataFrame) -> pd.DataFrame:
    g = heads.groupby(corpus.KEYS, sort=False)
    out = g.agg(documents=("id", "size"), entropy_mean=("entropy", "mean"), entropy_std=("entropy", "std"),
                normalized_entropy_mean=("normalized_entropy", "mean"), normalized_entropy_std=("normalized_entropy", "std"),
                split_documents=("flagged", "count"),
                flagged_documents=("flagged", lambda s: int(s.fillna(False).astype(bool).sum())))
    out["share_flagged"] = out["flagged_documents"] / out["split_documents"].replace(0, np.nan)
    if "lift" in heads:
        out["lift_mean"] = g["lift"].mean()
    return out.reset_index()


def test_duckdb_summary_equals_pandas_aggregates_of_the_same_rows(bert, tmp_path, capsys):
    data = write_jsonl(tmp_path / "leases.jsonl", lease_rows(16) + [{"id": "plain", "text": "No query here."}])
    out = tmp_path / "out"
    scan(data, out, fields=FIELDS, engine=Engine(batch_size=4), loaded=bert, progress=False)
    heads = pd.concat([pd.read_parquet(p) for p in sorted((out / "heads").glob("part-*.parquet"))], ignore_index=True)
    got = corpus.summary(out)
    assert ("lift_mean" in got) == ("lift" in heads)  # mean lift only where the split columns carry lift
    want = _pandas_summary(heads)
    merged = got.merge(want, on=corpus.KEYS, suffixes=("", "_pd"))
    assert len(merged) == len(got) == len(want) == 2 * 3
    for col in ["documents", "entropy_mean", "entropy_std", "normalized_entropy_mean", "normalized_entropy_std",
                "split_documents", "flagged_documents", "share_flagged"]:
        np.testing.assert_allclose(merged[col].astype(float), merged[f"{col}_pd"].astype(float), atol=1e-12, err_msg=col)
    assert (got["documents"] == 15).all() and (got["split_documents"] == 14).all()  # 2 bad, 1 without a query
    order = list(zip(-got["flagged_documents"], -got["share_flagged"].fillna(-1), got["site"], got["head"], strict=True))
    assert order == sorted(order)
    # --sql over both views, and --csv
    assert cli.main(["corpus", str(out), "--sql", "SELECT status, count(*) AS n FROM documents GROUP BY status ORDER BY status",
                     "--csv", str(tmp_path / "s.csv")]) == 0
    assert pd.read_csv(tmp_path / "s.csv").to_dict("records") == [{"status": "error", "n": 2}, {"status": "ok", "n": 15}]
    assert cli.main(["corpus", str(out), "--sql", "SELECT nope FROM heads"]) == 2
    assert cli.main(["corpus", str(out), "--sql", "  "]) == 2
    # several statements: each result printed under its statement, in order; a view made by one is seen by the next
    capsys.readouterr()
    two = ("CREATE VIEW bad AS SELECT id FROM documents WHERE status = 'error'; SELECT count(*) AS n_bad FROM bad; "
           "SELECT count(*) AS n_ok FROM documents WHERE status = 'ok'")
    assert cli.main(["corpus", str(out), "--sql", two]) == 0
    printed = capsys.readouterr().out
    assert "-- SELECT count(*) AS n_bad FROM bad\n" in printed and "-- SELECT count(*) AS n_ok" in printed
    assert printed.index("n_bad") < printed.index("n_ok") and "CREATE VIEW" not in printed
    assert [r[1].iloc[0, 0] for r in corpus.queries(out, two)] == [2, 15] and corpus.query(out, two).iloc[0, 0] == 15
    # --csv writes one result: several are refused with one line, and the file is not written
    assert cli.main(["corpus", str(out), "--sql", two, "--csv", str(tmp_path / "two.csv")]) == 2
    assert "give one SELECT with --csv" in capsys.readouterr().err and not (tmp_path / "two.csv").exists()
    # --sql reads: a statement that could write a file or change settings is refused before anything runs
    target = tmp_path / "written.csv"
    for bad in (f"COPY (SELECT 1) TO '{target}'", f"EXPORT DATABASE '{tmp_path / 'db'}'", "DROP VIEW heads",
                f"PRAGMA profiling_output = '{target}'", "SET threads = 1", f"ATTACH '{tmp_path / 'x.db'}'",
                f"SELECT 1; COPY (SELECT 2) TO '{target}'"):
        assert cli.main(["corpus", str(out), "--sql", bad]) == 2, bad
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is refused" in err[0], (bad, err)
    assert not target.exists() and not (tmp_path / "db").exists() and not (tmp_path / "x.db").exists()
    # ... refused before any statement runs (the types say which statements give rows)
    with pytest.raises(Exception, match="writes one"):
        corpus.queries(out, "CREATE TABLE t AS SELECT 1 AS x; SELECT 1; SELECT 2", single=True)
    assert cli.main(["corpus", str(out), "--sql", "CREATE VIEW v AS SELECT 1 AS x; SELECT x FROM v",
                     "--csv", str(tmp_path / "one.csv")]) == 0
    assert pd.read_csv(tmp_path / "one.csv").to_dict("records") == [{"x": 1}]
    assert cli.main(["corpus", str(out), "--sql", "SELECT 1; SELEC 2"]) == 2
    assert "the query failed" in capsys.readouterr().err
    assert cli.main(["corpus", str(out), "--sql", "SELECT 1; SELECT nope FROM heads"]) == 2
    assert "at statement 2 of 2" in capsys.readouterr().err


def test_mean_lift_appears_when_the_split_rows_have_a_lift_column(tmp_path):
    """Issue 10 adds `lift` to split_heads; the scan stores whatever columns the analysis returns."""
    rng = np.random.default_rng(0)
    out = tmp_path / "out"
    meta = {"corpus": "x", "fields": FIELDS.to_dict(), "model": "m", "options": Options().to_dict()}
    ScanFolder(out, meta).open()
    rows = []
    for doc in range(6):
        for head in range(3):
            has_split = doc < 4
            rows.append({"id": f"d{doc}", "site": "s", "stack": "none", "kind": "self", "layer": 0, "head": head,
                         "entropy": rng.random(), "normalized_entropy": rng.random(),
                         "flagged": bool(rng.random() > 0.5) if has_split else None,
                         "split_score": rng.random() if has_split else None,
                         "lift": rng.random() * 3 if has_split else None})
    heads = pd.DataFrame(rows).astype({"flagged": "boolean"})
    docs = pd.DataFrame({"id": [f"d{i}" for i in range(6)], "row": range(6), "tokens": 5, "status": "ok", "error": ""})
    folder = ScanFolder(out, meta).open()
    folder.commit(docs.iloc[:3], heads[heads["id"].isin(["d0", "d1", "d2"])])
    folder.commit(docs.iloc[3:], heads[~heads["id"].isin(["d0", "d1", "d2"])])
    got = corpus.summary(out).sort_values("head").reset_index(drop=True)
    want = _pandas_summary(heads).sort_values("head").reset_index(drop=True)
    np.testing.assert_allclose(got["lift_mean"], want["lift_mean"], atol=1e-12)
    np.testing.assert_allclose(got["share_flagged"], want["share_flagged"], atol=1e-12)


# ---- engines ---------------------------------------------------------------------------------------
def test_the_local_engine_imports_nothing_from_ray(bert_folder, tmp_path):
    data = write_jsonl(tmp_path / "leases.jsonl", lease_rows(10))
    code = ("import sys; from inspector import cli; "
            f"rc = cli.main(['scan', {str(data)!r}, '-o', {str(tmp_path / 'out')!r}, '--model', {str(bert_folder)!r}, "
            "'--query-field', 'query', '--referents-field', 'referents', '--id-field', 'id']); "
            "assert rc == 0, rc; print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    assert len(pd.read_parquet(tmp_path / "out" / "documents.parquet")) == 10


def test_ray_engine_gives_the_rows_of_the_local_engine(bert_folder, tmp_path, monkeypatch, capfd):
    """The documents handed to Ray in windows of 8 (three Datasets, the actors loading the model for each);
    a successful run prints no error-tagged line (Ray's C++ log, ``[time E pid tid] core_worker...``)."""
    try:
        import ray
    except ImportError:
        pytest.skip("Ray is not installed (pip install -e .[ray])")
    from inspector.capture.models import load_model
    from inspector.corpus import ray_engine

    monkeypatch.setattr(ray_engine, "WINDOW", 8)

    data = write_jsonl(tmp_path / "leases.jsonl", lease_rows(20))
    local = tmp_path / "local"
    scan(data, local, fields=FIELDS, engine=Engine(batch_size=4), loaded=load_model(str(bert_folder)), progress=False)
    capfd.readouterr()
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False, configure_logging=False)
    try:
        on_ray = tmp_path / "ray"
        result = scan(data, on_ray, model=ModelSpec(str(bert_folder)), engine=Engine("ray", batch_size=4, workers=1),
                      fields=FIELDS, progress=False)
        assert ray.is_initialized()  # a Ray instance the caller started is left running
    finally:
        ray.shutdown()
    printed = capfd.readouterr()
    tagged = [line for line in (printed.out + printed.err).splitlines() if re.match(r"\[[^\]]* [EF] \d+ \d+\]", line)]
    assert not tagged, tagged
    assert (result.scanned, result.errors) == (20, 2)
    a = pd.read_parquet(local / "documents.parquet")
    b = pd.read_parquet(on_ray / "documents.parquet")
    pd.testing.assert_frame_equal(a, b)
    assert_same_rows(read_heads(local), read_heads(on_ray))


def test_scan_demo_cli_writes_the_corpus_scans_it_and_resumes(bert_folder, tmp_path, capsys):
    out = tmp_path / "demo"
    argv = ["scan", "--demo", "12", "-o", str(out), "--model", str(bert_folder), "--batch-size", "5"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert "scanned 12 documents (2 with errors) in" in captured.err
    assert "flagged_documents" in captured.out
    docs = pd.read_parquet(out / "documents.parquet")
    assert docs.loc[docs["status"] == "error", "id"].tolist() == ["lease-0007", "lease-0008"]
    assert [json.loads(x)["id"] for x in (out / "demo-corpus.jsonl").read_text().splitlines()] == docs["id"].tolist()
    assert cli.main(argv) == 0
    assert "scanned 0 documents (0 with errors, 12 done before (2 with errors))" in capsys.readouterr().err
    assert cli.main(["scan", str(out / "demo-corpus.jsonl"), "--demo", "-o", str(tmp_path / "x")]) == 2
    assert "drop DATA" in capsys.readouterr().err


def test_the_split_verdict_columns_are_stored_and_lift_is_summarised(bert, tmp_path):
    """The scan stores split_heads' verdict columns (lift, chance_mass, the per-row rule, shared pieces) as
    the analysis defines them, and `inspector corpus` reports the mean lift."""
    data = write_jsonl(tmp_path / "leases.jsonl", lease_rows(10))
    scan(data, tmp_path / "out", fields=FIELDS, engine=Engine(batch_size=4), loaded=bert, progress=False)
    heads = read_heads(tmp_path / "out")
    assert {"lift", "chance_mass", "driving_row", "rows_flagged", "shared_pieces", "mostly_shared",
            "referent_pieces"} <= set(heads.columns)
    assert not any(c.startswith("weight:") or c.startswith("pieces:") for c in heads.columns)
    ok = heads["lift"].notna()
    assert ok.any()
    np.testing.assert_allclose(heads.loc[ok, "lift"], heads.loc[ok, "referent_mass"] / heads.loc[ok, "chance_mass"], rtol=1e-12)
    got = corpus.summary(tmp_path / "out")
    want = _pandas_summary(heads)
    merged = got.merge(want, on=corpus.KEYS, suffixes=("", "_pd"))
    np.testing.assert_allclose(merged["lift_mean"], merged["lift_mean_pd"], atol=1e-12)


def test_ray_address_joins_a_running_cluster_through_the_cli(bert_folder, tmp_path, capsys):
    """`--engine ray --ray-address HOST:PORT` joins a cluster started apart (`ray start --head`, as on a
    real cluster's head node, here on 127.0.0.1) and gives the local engine's rows; the cluster keeps
    running after the scan and is stopped by this test."""
    pytest.importorskip("ray")
    ray_bin = Path(sys.executable).with_name("ray")
    if not ray_bin.exists():
        pytest.skip("the `ray` command is not installed next to this Python")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: Ray keeps 127.0.0.1 as the node address (else it swaps a loopback
    # address for the machine's own IP, where this cluster does not listen)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": str(ROOT), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    start = [str(ray_bin), "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=2",
             "--include-dashboard=false", "--disable-usage-stats"]
    proc = subprocess.run(start, capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    try:
        data = write_jsonl(tmp_path / "leases.jsonl", lease_rows(10))
        argv = ["scan", str(data), "-o", str(tmp_path / "ray"), "--model", str(bert_folder), "--query-field", "query",
                "--referents-field", "referents", "--id-field", "id", "--batch-size", "4", "--engine", "ray",
                "--ray-address", f"127.0.0.1:{port}"]
        # a cluster started by `ray start` asks for its token (Ray >= 2.52; without it see the next test)
        code = subprocess.run([sys.executable, "-m", "inspector", *argv], capture_output=True, text=True,
                              env={**env, "RAY_AUTH_MODE": "token"}, timeout=300)
        assert code.returncode == 0, code.stderr[-3000:]
        status = subprocess.run([str(ray_bin), "status", f"--address=127.0.0.1:{port}"], capture_output=True, text=True,
                                env={**env, "RAY_AUTH_MODE": "token"}, timeout=60)
        assert status.returncode == 0, f"the cluster the scan joined is still running: {status.stderr[-1500:]}"
    finally:
        subprocess.run([str(ray_bin), "stop", "--force"], capture_output=True, env=env, timeout=120)
    from inspector.capture.models import load_model

    scan(data, tmp_path / "local", fields=FIELDS, engine=Engine(batch_size=4), loaded=load_model(str(bert_folder)), progress=False)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "local" / "documents.parquet"),
                                  pd.read_parquet(tmp_path / "ray" / "documents.parquet"))
    assert_same_rows(read_heads(tmp_path / "local"), read_heads(tmp_path / "ray"))


def test_a_cluster_that_cannot_be_joined_is_one_line_naming_the_fix(monkeypatch):
    """Ray's errors when joining (here: the token a `ray start` cluster asks for, and an unreachable
    address) become one line naming the fix, exit 2 in the CLI."""
    from inspector.corpus import ray_engine
    from inspector.corpus.ray_engine import _join
    from inspector.errors import InspectorError

    monkeypatch.setattr(ray_engine, "_reachable", lambda address: None)  # these addresses answer; Ray refuses

    class FakeRay:
        def __init__(self, exc):
            self.exc = exc

        def init(self, **kw):
            raise self.exc

    auth = RuntimeError("Failed to connect to GCS")
    auth.__cause__ = RuntimeError("ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: missing")
    try:
        raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from auth
    except ConnectionError as exc:
        wrapped = exc
    with pytest.raises(InspectorError, match="RAY_AUTH_MODE=token") as info:
        _join(FakeRay(wrapped), "10.0.0.1:6379")
    assert "\n" not in str(info.value)
    with pytest.raises(InspectorError, match="check --ray-address") as info:
        _join(FakeRay(ConnectionError("Failed to connect to Ray cluster at 10.0.0.9:1")), "10.0.0.9:1")
    assert "\n" not in str(info.value)


def test_a_ray_address_where_nothing_listens_fails_at_once_through_the_cli(tmp_path):
    """ray.init retries such an address for minutes, deaf to Ctrl-C: the scan checks it first (one line, exit 2)."""
    pytest.importorskip("ray")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    data = write_jsonl(tmp_path / "leases.jsonl", lease_rows(10))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "inspector", "scan", str(data), "-o", str(tmp_path / "out"),
                           "--engine", "ray", "--ray-address", f"127.0.0.1:{port}"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert f"nothing answers at the Ray address 127.0.0.1:{port}" in last and "--ray-address" in last


def test_list_referents_are_stripped_and_an_occurrence_must_be_whole(bert, tmp_path):
    """Referents given as a list with spaces read as the words (as the A,B text form does); an occurrence of
    1.5 is the document's error, not occurrence 1."""
    rows = [dict(DOCS[0], id="spaced", referents=[" Lessee ", "Lessor "]),
            dict(DOCS[0], id="half", occurrence=1.5), dict(DOCS[0], id="plain-list")]
    data = write_jsonl(tmp_path / "c.jsonl", rows)
    fields = Fields(query="query", referents="referents", id="id", occurrence="occurrence")
    scan(data, tmp_path / "out", fields=fields, engine=Engine(batch_size=4), loaded=bert, progress=False)
    docs = pd.read_parquet(tmp_path / "out" / "documents.parquet").set_index("id")
    assert docs.loc["half", "status"] == "error" and "not a whole number" in docs.loc["half", "error"]
    heads = read_heads(tmp_path / "out")
    assert not any(":" in c for c in heads.columns)
    spaced, plain = (heads[heads["id"] == i].sort_values(["site", "head"]).reset_index(drop=True)
                     for i in ("spaced", "plain-list"))
    assert all(list(r) == ["Lessee", "Lessor"] for r in spaced["referents"])
    np.testing.assert_allclose(np.array(spaced["referent_weights"].tolist(), float),
                               np.array(plain["referent_weights"].tolist(), float), atol=1e-12)


def test_a_scan_folder_copied_with_its_corpus_resumes(bert, tmp_path, monkeypatch, commit_per_batch):
    """A scan folder moved or copied together with its corpus (another path, the same content) resumes where it
    stopped, and scan.json then names the corpus where it now is; another corpus at the new path is refused."""
    import shutil

    here = tmp_path / "here"
    here.mkdir()
    data = write_jsonl(here / "leases.jsonl", lease_rows(10))
    full = tmp_path / "full"
    scan(data, full, fields=FIELDS, engine=Engine(batch_size=3), loaded=bert, progress=False)

    original = ScanFolder.commit

    def stop_after_one(self, documents, heads):
        if self.next_part == 1:
            raise KeyboardInterrupt
        return original(self, documents, heads)

    monkeypatch.setattr(ScanFolder, "commit", stop_after_one)
    with pytest.raises(KeyboardInterrupt):
        scan(data, here / "out", fields=FIELDS, engine=Engine(batch_size=3), loaded=bert, progress=False)
    monkeypatch.setattr(ScanFolder, "commit", original)
    there = tmp_path / "there"
    shutil.copytree(here, there)
    shutil.rmtree(here)
    result = scan(there / "leases.jsonl", there / "out", fields=FIELDS, engine=Engine(batch_size=3), loaded=bert, progress=False)
    assert (result.skipped, result.scanned) == (3, 7)
    assert_same_rows(read_heads(full), read_heads(there / "out"), tol=0.0)
    assert json.loads((there / "out" / "scan.json").read_text())["corpus"] == str((there / "leases.jsonl").resolve())
    assert corpus.find_document(there / "out", 4).row == 4  # read from the corpus where it now is
    # the same path holding other documents is another corpus
    write_jsonl(there / "leases.jsonl", lease_rows(11))
    with pytest.raises(InspectorError, match="changed since this scan"):
        scan(there / "leases.jsonl", there / "out", fields=FIELDS, engine=Engine(batch_size=3), loaded=bert, progress=False)


def test_a_broken_line_does_not_take_a_documents_id(bert, tmp_path):
    """With an id column, a line that cannot be read is '#row<N>', not '<N>': a corpus numbered from 0 keeps
    its document '1' (it was reported as repeating the broken line's id, and left unscanned)."""
    data = tmp_path / "numbered.jsonl"
    rows = [json.dumps(DOCS[0] | {"id": str(i)}) for i in range(3)]
    rows[1] = "{broken"
    data.write_text("\n".join(rows + [json.dumps(DOCS[0] | {"id": "1"})]) + "\n")
    scan(data, tmp_path / "out", fields=FIELDS, engine=Engine(batch_size=4), loaded=bert, progress=False)
    docs = pd.read_parquet(tmp_path / "out" / "documents.parquet").set_index("id")
    assert docs["status"].to_dict() == {"0": "ok", "#row1": "error", "2": "ok", "1": "ok"}
    assert sorted(read_heads(tmp_path / "out")["id"].unique()) == ["0", "1", "2"]


def test_a_document_whose_referents_no_site_can_see_keeps_its_rank_rows(tmp_path):
    """On a causal LM a query before both referents sees neither at any site: there is no split to measure (a
    property of the text, as for a windowed encoder's query far from its referents). The document is ok, its
    rank rows equal a document without a query, its split columns are empty and `error` notes why."""
    lm = loaded("gpt2")
    rows = [{"id": "before", "text": "Such indemnity binds the Lessee and the Lessor.", "query": "indemnity",
             "referents": ["Lessee", "Lessor"]},
            {"id": "plain", "text": "Such indemnity binds the Lessee and the Lessor."},
            {"id": "after", "text": "The Lessee and the Lessor agree; such indemnity binds them.", "query": "indemnity",
             "referents": ["Lessee", "Lessor"]}]
    for batch_size in (1, 3):  # one by one, and the batched path
        out = tmp_path / f"out{batch_size}"
        scan(write_jsonl(tmp_path / "docs.jsonl", rows), out, fields=FIELDS, engine=Engine(batch_size=batch_size), loaded=lm, progress=False)
        docs = pd.read_parquet(out / "documents.parquet").set_index("id")
        assert (docs["status"] == "ok").all()
        assert docs.loc["before", "error"].startswith("no split: at ") and "(causal mask)" in docs.loc["before", "error"]
        assert docs.loc["after", "error"] == docs.loc["plain", "error"] == ""
        heads = read_heads(out).set_index(["id", "site", "head"]).sort_index()
        before, plain = heads.loc["before"], heads.loc["plain"]
        pd.testing.assert_series_equal(before["entropy"], plain["entropy"])
        assert before["split_score"].isna().all() and before["flagged"].isna().all()
        assert heads.loc["after", "split_score"].notna().all()


def test_a_resumed_scan_gives_an_older_parts_null_lists_their_type(bert, tmp_path, commit_per_batch):
    """Scans before the list columns had one Arrow type wrote ``list<null>`` where no row of a part had a value
    (``rows_flagged`` where no head was flagged), so ``pandas.read_parquet`` of ``heads/`` could not merge the
    parts. Resuming the scan (here with nothing left to do) rewrites such a part with the column's type
    (``store.schema.LIST_TYPES``), its rows unchanged, and the folder reads as one table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = write_jsonl(tmp_path / "leases.jsonl", lease_rows(10))
    out = tmp_path / "out"
    scan(data, out, fields=FIELDS, engine=Engine(batch_size=4), loaded=bert, progress=False)
    first, *rest = sorted((out / "heads").glob("part-*.parquet"))
    assert rest  # two parts at least: the first one is made old below
    table = pq.read_table(first)
    i = table.schema.get_field_index("rows_flagged")
    old = table.set_column(i, pa.field("rows_flagged", pa.list_(pa.null())), pa.array([[]] * len(table), pa.list_(pa.null())))
    pq.write_table(old.replace_schema_metadata(table.schema.metadata), first)
    with pytest.raises(Exception, match="cast"):
        pd.read_parquet(out / "heads")
    untouched = {p: p.stat().st_mtime_ns for p in rest}
    summary = scan(data, out, fields=FIELDS, engine=Engine(batch_size=4), loaded=bert, progress=False)
    assert summary.scanned == 0 and summary.skipped == 10
    assert pq.read_schema(first).field("rows_flagged").type == pa.list_(pa.int64())
    assert pq.read_table(first).drop_columns("rows_flagged").equals(table.drop_columns("rows_flagged"))
    assert all(v == [] for v in pq.read_table(first).column("rows_flagged").to_pylist())
    assert {p: p.stat().st_mtime_ns for p in rest} == untouched  # parts of one type are not rewritten
    heads = pd.read_parquet(out / "heads")
    assert len(heads) == sum(pq.read_metadata(p).num_rows for p in [first, *rest])
