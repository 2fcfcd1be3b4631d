"""inspector.ui.views: the data behind the app's views, on tiny seeded models (no Streamlit)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from inspector.analysis.explain import explain
from inspector.analysis.question import Question
from inspector.capture import capture
from inspector.errors import InspectorError
from inspector.ui import views

import tiny
from helpers.browser import CHROMIUM, launch

VENDOR = Path(__file__).resolve().parent.parent / "apps" / "vendor" / "node_modules"
HTML_TEXT = 'The <b>Lessee</b> & "Lessor" agree: Lessee pays.'


@pytest.fixture(scope="module")
def bert(tokenizer):
    return capture(tiny.build("bert"), tokenizer, HTML_TEXT)


@pytest.fixture(scope="module")
def bart(tokenizer):
    return capture(tiny.build("bart"), tokenizer, "The Lessee pays the Lessor.", "Der Mieter zahlt.")


def test_window():
    assert views.window(0, 8, 100) == slice(0, 8)
    assert views.window(50, 8, 100) == slice(46, 54)
    assert views.window(99, 8, 100) == slice(92, 100)
    assert views.window(3, 64, 10) == slice(0, 10)


def test_heatmap_frame_reads_a_window_or_top_k(bert):
    site = bert.sites[1]
    full = bert.weights(site, heads=[2])[0]
    df = views.heatmap_frame(bert, site, 2, slice(2, 5), keys=slice(1, 4))
    assert len(df) == 3 * 3
    for r in df.to_dict("records"):
        assert r["weight"] == pytest.approx(float(full[r["query_index"], r["key_index"]]))
    top = views.heatmap_frame(bert, site, 2, slice(0, 4), top_k=2)
    assert len(top) == 4 * 2
    for q, rows in top.groupby("query_index"):
        assert sorted(rows["key_index"]) == sorted(full[q].topk(2).indices.tolist())
    assert top["key_label"].iloc[0].startswith(f"{top['key_index'].iloc[0]} · ")


def test_query_row_and_qkv(bert):
    site = bert.sites[0]
    row = views.query_row(bert, site, 1, 3)
    assert row["weight"].sum() == pytest.approx(1.0, abs=1e-5)
    assert row["special"].iloc[0] and row["key_token"].iloc[0] == "[CLS]"
    vec = views.qkv_frame(bert, site, 1, 3, key_index=5)
    q, k = bert.tensor(site, "q")[0, 1, 3], bert.tensor(site, "k")[0, 1, 5]
    assert vec["q"].tolist() == pytest.approx(q.tolist()) and vec["k"].tolist() == pytest.approx(k.tolist())
    assert vec["q*k"].sum() == pytest.approx(float(q @ k), abs=1e-5)


def test_explain_frame_marks_masked_keys(tokenizer):
    cap = capture(tiny.build("gpt2"), tokenizer, "my card was blocked")
    exp = explain(cap, Question(position=1), cap.sites[0], 0)
    df = views.explain_frame(exp)
    assert df["visible"].tolist() == [True, True, False, False, False, False]  # [CLS] my | card was blocked [SEP]
    assert df["contribution"].iloc[0].startswith("[") and df["contribution"].iloc[0].endswith("…]")
    assert list(exp.table.columns)[-1] == "contribution" and isinstance(exp.table["contribution"].iloc[0], list)


def test_shaded_html_escapes_and_marks(bert):
    site = bert.sites[0]
    w = views.query_weights(bert, site, 0, [1])
    page = views.shaded_html(bert, site, w, query_positions=[1], referent_positions=[4])
    assert "<b>" not in page and "</b>" not in page
    assert "&lt;" in page and "&gt;" in page and "&amp;" in page and "&#34;" in page  # markupsafe writes " as &#34;
    text = re.sub(r"<[^>]+>", "", page.split("</style>", 1)[1])
    assert "[CLS]" in text and "agree" in text
    assert page.count('class="q"') == 1 and page.count('class="r"') == 1
    # every character of the text is there, in order
    import html as _html

    body = re.sub(r'<span class="chip"[^>]*>.*?</span>', "", page.split("</style>", 1)[1])
    assert _html.unescape(re.sub(r"<[^>]+>", "", body)).strip() == HTML_TEXT


def test_split_bars_long_form():
    import pandas as pd

    df = pd.DataFrame({"site": ["s", "s"], "stack": "none", "kind": "self", "layer": [1, 2], "head": [3, 4],
                       "query": "q", "query_positions": "5", "weight:A": [0.3, 0.1], "weight:B": [0.2, 0.0],
                       "referent_mass": [0.5, 0.1], "split_score": [0.4, 0.0], "flagged": [True, False]})
    bars = views.split_bars(df, top=1)
    assert bars[["head_label", "referent", "weight"]].values.tolist() == [["L1 H3", "A", 0.3], ["L1 H3", "B", 0.2]]


def test_bertviz_kwargs_single_stack_and_encoder_decoder(bert, bart):
    kw = views.bertviz_kwargs(bert, 2, 4)
    assert len(kw["attention"]) == 2 and kw["attention"][0].shape == (1, 3, 4, 4)
    assert kw["tokens"] == bert.tokens(bert.sites[0])[2:6]
    kw = views.bertviz_kwargs(bart, 0, 64)
    assert set(kw) == {"encoder_attention", "encoder_tokens", "decoder_attention", "decoder_tokens", "cross_attention"}
    enc_n, dec_n = len(kw["encoder_tokens"]), len(kw["decoder_tokens"])
    assert kw["cross_attention"][0].shape == (1, 4, dec_n, enc_n)
    with pytest.raises(InspectorError, match="at most 64"):
        views.bertviz_kwargs(bert, 0, 65)


def test_offline_bertviz_inlines_scripts(bert, bart, tmp_path):
    with pytest.raises(InspectorError, match="make assets"):
        views.bertviz_html(bert, "head", 0, 8, vendor_dir=tmp_path)
    if not (VENDOR / "d3").is_dir():
        pytest.skip("bertviz's scripts are not installed: run `make assets`")
    for cap, view in ((bert, "head"), (bert, "model"), (bart, "head"), (bart, "model")):
        page = views.bertviz_html(cap, view, 0, 16, vendor_dir=VENDOR)
        assert "cdnjs" not in page and not re.search(r"""src=["']https?:""", page)
        assert page.count("</script>") == 7  # require.js, guard, d3, jQuery, names, fit to width, bertviz
        assert "define('d3'" in page and "requirejs(['jquery', 'd3']" in page
    assert views.html_size("x" * 2000) == "2 kB"
    with pytest.raises(InspectorError, match="at most 32 tokens"):  # one SVG line per weight of every head
        views.bertviz_html(bert, "model", 0, views.MODEL_VIEW_MAX_TOKENS + 1, vendor_dir=VENDOR)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's Chromium is not at /usr/bin/chromium: run `make chromium`")
def test_model_view_shows_every_head_in_a_narrow_frame(tokenizer, tmp_path):
    """bertviz draws the model view 970 px wide: in the app's 700 px frame the last heads were cut off. Every
    head's thumbnail now lies inside the frame, and there is one per captured layer and head."""
    pw = pytest.importorskip("playwright.sync_api")
    if not (VENDOR / "d3").is_dir():
        pytest.skip("bertviz's scripts are not installed: run `make assets`")
    model = tiny.build("bert")  # 2 layers x 3 heads
    cap = capture(model, tokenizer, "The Lessee shall indemnify the Lessor.")
    page = tmp_path / "model.html"
    page.write_text(views.bertviz_html(cap, "model", 0, 16, vendor_dir=VENDOR), encoding="utf-8")
    with pw.sync_playwright() as p:
        browser = launch(p)
        try:
            tab = browser.new_page(viewport={"width": 700, "height": 900})
            tab.goto(page.as_uri())
            tab.wait_for_function("document.querySelectorAll('rect.attn_background').length > 0", timeout=60_000)
            rects = tab.evaluate("[...document.querySelectorAll('rect.attn_background')].map(r => "
                                 "{const b = r.getBoundingClientRect(); return [r.id, b.left, b.right]})")
            width = tab.evaluate("document.documentElement.clientWidth")
        finally:
            browser.close()
    assert sorted(r[0] for r in rects) == sorted(f"attn_background_{i}_{j}" for i in range(2) for j in range(3))
    assert all(0 <= left and right <= width for _, left, right in rects), (width, rects)


def test_bertviz_tokens_cannot_close_the_script(tokenizer):
    cap = capture(tiny.build("bert"), tokenizer, "a </script> b")
    kw = views.bertviz_kwargs(cap, 0, 16)
    assert not any("</" in t for t in kw["tokens"])


def test_grid_frame_adds_split_score(bert):
    from inspector.analysis import rank_heads

    rank = rank_heads(bert)
    grid = views.grid_frame(rank)
    assert grid["split_score"].isna().all() and set(grid["group"]) == {"self"}
    assert torch.isfinite(torch.tensor(grid["normalized_entropy"].to_numpy())).all()


def test_search_labels_name_the_word_of_each_piece(tokenizer, bart):
    cap = capture(tiny.build("bert"), tokenizer, "The Lessee shall indemnify the Lessor.")
    site = cap.sites[0]
    tokens = cap.tokens(site, "query")
    labels = views.search_labels(cap, site)
    assert len(labels) == len(tokens) == site.query_len
    pieces = [i for i, t in enumerate(tokens) if t.startswith("##")]
    assert pieces, tokens  # the tokenizer split a word: its pieces carry the word, from the text's offsets
    for i, t in enumerate(tokens):
        assert labels[i].startswith(views.token_label(i, t))
    word_of = {i: labels[i].split(" (")[-1].rstrip(")") for i in range(len(tokens)) if labels[i].endswith(")")}
    assert set(pieces) <= set(word_of)
    assert "indemnify" in word_of.values() and "Lessee" in word_of.values()
    assert labels[0] == "0 · [CLS]" and labels[-1].endswith("[SEP]")  # special tokens: no word
    assert labels[tokens.index("the")] == f"{tokens.index('the')} · the"  # a one-token word: no brackets
    # a sentence pair: word ids start again at 0 in the second text; each label names its own word only
    pair = capture(tiny.build("bert"), tokenizer, ("The Lessee shall indemnify the Lessor.",
                                                   "Such indemnity survives termination of the lease."))
    toks, labels = pair.tokens(pair.sites[0], "query"), views.search_labels(pair, pair.sites[0])
    assert all("\n" not in lab for lab in labels)
    for i, t in enumerate(toks):
        if t in ("the", "of", "such", "lease", "."):
            assert labels[i] == views.token_label(i, t), labels[i]  # one-token words: no brackets
    assert {lab.split(" (")[1] for lab in labels if "(" in lab} >= {"indemnify)", "indemnity)"}
    # a token that does not spell its text (an unknown character) carries the text
    unk = capture(tiny.build("bert"), tokenizer, "He paid \u2603 twice.")
    labels = views.search_labels(unk, unk.sites[0])
    assert any(lab.endswith("(\u2603)") for lab in labels), labels
    # an encoder-decoder's decoder axis reads the target's own record
    dec = next(s for s in bart.sites if s.kind == "cross")
    assert views.search_labels(bart, dec, "query")[1].startswith("1 · ")
    assert len(views.search_labels(bart, dec, "key")) == dec.key_len
