"""`inspector scan --routes`: which heads lie on the route of each document's query token, and how often
`inspector corpus` finds each head there.

Planted ground truth: the 2-layer GPT-2 of tests/helpers/routes.py whose layer-1 head copies "bob"
into the last word's position (the query token) in every document of the same shape, while layer 0's head
has zero values (idle). The scan's rows are checked against `inspector.routes` drawn per document by hand.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from inspector import cli
from inspector.attribute.routes import THRESHOLD, routes
from inspector.capture.models import LoadedModel
from inspector.corpus import queries as corpus
from inspector.corpus.engine import Engine, ModelSpec
from inspector.corpus.leases import lease_rows, write_jsonl
from inspector.corpus.reduce import Options
from inspector.corpus.scan import scan

import tiny
from helpers.routes import TEXT, planted_copy_gpt2
from helpers.scan import FIELDS, assert_same_rows, read_heads

COPY, IDLE = ("transformer.h.1.attn", 0), ("transformer.h.0.attn", 0)
# same tokens per document, bob at the same position, the query word last: the planted head copies bob into it
PLANTED = [{"id": f"d{i}", "text": t, "query": t.split()[-1], "referents": ["bob", "carol"]} for i, t in enumerate([
    TEXT, "dave met bob and carol near the lake", "erin saw bob and carol by the field", "alice met bob or carol at the river"])]
PLANTED.append({"id": "plain", "text": "alice met bob and carol near the sea"})  # no query: no route


@pytest.fixture(scope="module")
def planted(tokenizer):
    ids = tokenizer(TEXT)["input_ids"]
    model, bob, row = planted_copy_gpt2(tokenizer, row=len(ids) - 2)  # the last word, not [SEP]
    for d in PLANTED:
        assert len(tokenizer(d["text"])["input_ids"]) == len(ids)  # the planted positions fit every document
    return LoadedModel(model, tokenizer, "planted-copy-gpt2"), bob, row


def _parts(out) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(p) for p in sorted((out / "heads").glob("part-*.parquet"))], ignore_index=True)


def test_the_copying_head_is_on_the_route_in_every_document_and_the_idle_head_never(planted, tmp_path):
    lm, _, _ = planted
    data = write_jsonl(tmp_path / "docs.jsonl", PLANTED)
    scan(data, tmp_path / "out", fields=FIELDS, engine=Engine(batch_size=2), loaded=lm, options=Options(routes=True), progress=False)
    docs = pd.read_parquet(tmp_path / "out" / "documents.parquet")
    assert (docs["status"] == "ok").all(), docs
    heads = _parts(tmp_path / "out").set_index(["id", "site", "head"])
    for d in PLANTED[:-1]:
        copy, idle = heads.loc[(d["id"], *COPY)], heads.loc[(d["id"], *IDLE)]
        assert bool(copy["on_route"]) and copy["route_share"] > THRESHOLD, d["id"]
        assert not bool(idle["on_route"]) and idle["route_share"] == 0.0, d["id"]  # zero values: no share anywhere
    assert heads.loc["plain", "on_route"].isna().all() and heads.loc["plain", "route_share"].isna().all()
    info = json.loads((tmp_path / "out" / "scan.json").read_text())
    assert info["options"]["routes"] is True and info["options"]["routes_threshold"] == THRESHOLD
    summary = corpus.summary(tmp_path / "out").set_index(["site", "head"])
    assert summary.loc[COPY, "routes"] == 1.0 and summary.loc[IDLE, "routes"] == 0.0
    assert (summary["route_documents"] == 4).all()


def test_rows_equal_the_route_of_each_documents_query_token_drawn_by_hand(planted, tmp_path):
    """on_route <=> the route table of `inspector.routes` at the query word's last token lists the head's own
    row; route_share is then that head's largest listed importance, else at most the threshold."""
    lm, _, row = planted
    data = write_jsonl(tmp_path / "docs.jsonl", PLANTED)
    scan(data, tmp_path / "out", fields=FIELDS, engine=Engine(batch_size=4), loaded=lm, options=Options(routes=True), progress=False)
    heads = _parts(tmp_path / "out")
    for d in PLANTED[:-1]:
        enc = lm.tokenizer(d["text"], return_offsets_mapping=True)
        start = d["text"].rindex(d["query"])
        pos = max(i for i, (a, b) in enumerate(enc["offset_mapping"]) if b > start and a < len(d["text"]) and b > a)
        assert pos == row
        table = routes(lm.model, lm.tokenizer, d["text"], position=pos)
        own = table[table["head"] >= 0]
        best = own.groupby(["site", "head"])["importance"].max().to_dict()
        mine = heads[heads["id"] == d["id"]]
        assert len(mine) == 2
        for site, h, on, share in zip(mine["site"], mine["head"], mine["on_route"], mine["route_share"], strict=True):
            assert bool(on) == ((site, h) in best), (d["id"], site, h)
            if bool(on):
                assert share == pytest.approx(best[(site, h)], abs=1e-6)
            else:
                assert share <= THRESHOLD


def test_corpus_counts_equal_pandas_counts_over_the_parts(planted, tmp_path):
    lm, _, _ = planted
    rows = PLANTED + [{"id": "bad", "text": "alice met bob and carol near the river", "query": "nowhere",
                       "referents": ["bob", "carol"]}]
    data = write_jsonl(tmp_path / "docs.jsonl", rows)
    scan(data, tmp_path / "out", fields=FIELDS, engine=Engine(batch_size=3), loaded=lm, options=Options(routes=True), progress=False)
    heads = _parts(tmp_path / "out")
    g = heads.groupby(["site", "head"])
    want = pd.DataFrame({"route_documents": g["on_route"].count(),
                         "on_route_documents": g["on_route"].apply(lambda s: int(s.fillna(False).astype(bool).sum())),
                         "route_share_mean": g["route_share"].mean()})
    want["routes"] = want["on_route_documents"] / want["route_documents"]
    got = corpus.summary(tmp_path / "out").set_index(["site", "head"]).loc[want.index]
    for col in want.columns:
        np.testing.assert_allclose(got[col].astype(float), want[col].astype(float), atol=1e-12, err_msg=col)
    docs = pd.read_parquet(tmp_path / "out" / "documents.parquet").set_index("id")
    assert docs.loc["bad", "status"] == "error" and "bad" not in set(heads["id"])


def test_a_resume_with_other_routes_is_refused_and_a_plain_scan_keeps_no_route_columns(tmp_path, capsys):
    lm = LoadedModel(tiny.build("bert"), tiny.tokenizer(), "tiny-bert")
    data = write_jsonl(tmp_path / "leases.jsonl", lease_rows(10)[:6])
    scan(data, tmp_path / "plain", fields=FIELDS, engine=Engine(batch_size=3), loaded=lm, progress=False)
    assert "on_route" not in corpus.summary(tmp_path / "plain") and "on_route" not in _parts(tmp_path / "plain")
    assert "routes" not in json.loads((tmp_path / "plain" / "scan.json").read_text())["options"]  # older scans resume
    with pytest.raises(Exception, match="other options"):
        scan(data, tmp_path / "plain", fields=FIELDS, loaded=lm, options=Options(routes=True), progress=False)
    scan(data, tmp_path / "routed", fields=FIELDS, engine=Engine(batch_size=3), loaded=lm, options=Options(routes=True), progress=False)
    with pytest.raises(Exception, match="other options"):
        scan(data, tmp_path / "routed", fields=FIELDS, loaded=lm, progress=False)
    again = scan(data, tmp_path / "routed", fields=FIELDS, loaded=lm, options=Options(routes=True), progress=False)
    assert again.skipped == 6 and again.scanned == 0
    # the refusal names each option that differs and the flag that brings it back, in one whole line
    fields = ["--model", "tiny-bert", "--query-field", "query", "--referents-field", "referents", "--id-field", "id"]
    capsys.readouterr()
    for folder, argv, said in [
        ("routed", [], "routes: true in the folder, false now: add --routes"),
        ("plain", ["--routes"], "routes: false in the folder, true now: drop --routes"),
        ("routed", ["--routes", "--min-split", "0.3", "--min-lift", "3"],
         "min_lift: 2.0 in the folder, 3.0 now: give --min-lift 2.0; min_split: 0.2 in the folder, 0.3 now: give --min-split 0.2"),
        ("plain", ["--id-field", "text"], "id: \"id\" in the folder, \"text\" now: give --id-field id"),
        ("routed", ["--model", "other", "--exclude-special"],  # every difference at once
         'another model ("tiny-bert" in the folder, "other" now) and other options (exclude_special: false in the '
         "folder, true now: drop --exclude-special; routes: true in the folder, false now: add --routes)"),
    ]:
        assert cli.main(["scan", str(data), "-o", str(tmp_path / folder), *fields, *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("inspector: error:") and said in err[0], err
        assert err[0].endswith("resume with the same options, or scan into a new folder") and "loading" not in err[0]


def test_a_model_routes_cannot_decompose_is_refused_before_scanning(tmp_path, capsys):
    model_dir = tmp_path / "tiny-opt"
    tiny.build("opt").save_pretrained(model_dir)
    tiny.tokenizer().save_pretrained(model_dir)
    data = write_jsonl(tmp_path / "leases.jsonl", lease_rows(10)[:4])
    argv = ["scan", str(data), "-o", str(tmp_path / "out"), "--model", str(model_dir), "--query-field", "query",
            "--referents-field", "referents", "--routes"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("inspector: error: --routes cannot trace") and str(model_dir) in err[-1]
    assert "'opt' is not among them" in err[-1] and "scan without --routes" in err[-1]
    assert not (tmp_path / "out" / "heads").exists()  # nothing scanned
    with pytest.raises(Exception, match="--routes cannot trace"):  # the Ray engine's check reads the config alone
        scan(data, tmp_path / "ray", model=ModelSpec(str(model_dir)), engine=Engine("ray"), fields=FIELDS,
             options=Options(routes=True), progress=False)


def test_ray_engine_gives_the_route_rows_of_the_local_engine(bert_folder, tmp_path):  # noqa: F811 - the fixture
    ray = pytest.importorskip("ray")
    from inspector.capture.models import load_model

    data = write_jsonl(tmp_path / "leases.jsonl", lease_rows(10)[:6])
    opts = Options(routes=True)
    scan(data, tmp_path / "local", fields=FIELDS, engine=Engine(batch_size=3), loaded=load_model(str(bert_folder)), options=opts,
         progress=False)
    # address="local": a new instance even where a stopped cluster left /tmp/ray/ray_current_cluster behind
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             configure_logging=False)
    try:
        scan(data, tmp_path / "ray", model=ModelSpec(str(bert_folder)), engine=Engine("ray", batch_size=3, workers=1),
             fields=FIELDS, options=opts, progress=False)
    finally:
        ray.shutdown()
    local, on_ray = read_heads(tmp_path / "local"), read_heads(tmp_path / "ray")
    assert "on_route" in local and local["route_share"].notna().any()
    assert_same_rows(local, on_ray)
