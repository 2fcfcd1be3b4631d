"""Analysis on planted ground truth, the seed's worked example, and real models checked against eager."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from inspector import analysis
from inspector.analysis.explain import check_against_capture, explain
from inspector.analysis.question import Question
from inspector.capture import capture
from inspector.capture.inputs import encode
from inspector.cli import main
from inspector.errors import InspectorError
from inspector.store import load

import planted
import tiny
from conftest import LEGAL

TOL = 1e-5
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.fixture(params=[True, False], ids=["full", "lazy"])
def planted_capture(request, tmp_path):
    cap = planted.build(weights=request.param)
    return load(cap.save(tmp_path / "planted.safetensors"))


def test_lazy_planted_capture_recomputes_the_planted_weights():
    torch.testing.assert_close(planted.build(False).weights("planted.attention").double(), planted.patterns(), atol=1e-6, rtol=0)


def test_rank_entropies_match_hand_computation(planted_capture):
    df = analysis.rank_heads(planted_capture).set_index("head")
    n = planted.N
    others = n - 2
    h1 = -(0.9 * math.log(0.9) + others * (0.1 / others) * math.log(0.1 / others))
    assert df.loc[0, "entropy"] == pytest.approx(math.log(2), abs=TOL)
    assert df.loc[1, "entropy"] == pytest.approx(h1, abs=TOL)
    assert df.loc[2, "entropy"] == pytest.approx(math.log(n), abs=TOL)  # uniform: the maximum
    assert df.loc[3, "entropy"] == pytest.approx(0.0, abs=TOL)  # one-hot
    assert df.loc[2, "normalized_entropy"] == pytest.approx(1.0, abs=TOL)
    assert df.loc[0, "normalized_entropy"] == pytest.approx(math.log(2) / math.log(n), abs=TOL)
    assert df["entropy"].idxmax() == 2 and df.loc[3, "entropy"] == df["entropy"].min()
    assert ((df["entropy"] >= -TOL) & (df["entropy"] <= math.log(n) + TOL)).all()
    assert df.loc[3, "sink_mass"] == pytest.approx(1.0) and df.loc[3, "label"] == "sink"
    assert df.loc[4, "label"] == "previous-token" and df.loc[4, "prev_mass"] == pytest.approx(1.0, abs=TOL)
    assert df.loc[2, "label"] == "broad"
    assert df.loc[1, "top_key"] == "Bob"
    assert set(analysis.RANK_COLUMNS) <= set(df.reset_index().columns)


def test_exclude_special_renormalizes(planted_capture):
    df = analysis.rank_heads(planted_capture, exclude_special=True).set_index("head")
    n = planted.N
    assert df.loc[2, "entropy"] == pytest.approx(math.log(n - 1), abs=TOL)  # uniform over the n-1 real keys
    assert df.loc[2, "sink_mass"] == pytest.approx(1 / n, abs=TOL)  # still reported


def test_split_flags_the_planted_head_only(planted_capture):
    df = analysis.split_heads(planted_capture, Question("today", ["Bob", "Carol"])).set_index("head")
    assert df.loc[0, "split_score"] == pytest.approx(1.0, abs=TOL) and df.loc[0, "flagged"]
    assert df.loc[0, "weight:Bob"] == pytest.approx(0.5, abs=TOL) and df.loc[0, "weight:Carol"] == pytest.approx(0.5, abs=TOL)
    assert df.loc[1, "weight:Bob"] == pytest.approx(0.9, abs=TOL) and not df.loc[1, "flagged"]
    assert df["flagged"].sum() == 1
    assert df.index[0] == 0  # sorted by split score
    assert df.loc[3, "split_score"] == pytest.approx(0.0, abs=TOL)


def test_split_errors_name_the_fix(planted_capture):
    with pytest.raises(InspectorError, match="nearest: Carol"):
        analysis.split_heads(planted_capture, Question("today", ["Bob", "Caroll"]))
    with pytest.raises(InspectorError, match="'tomorrow' is not in the source text"):
        analysis.split_heads(planted_capture, Question("tomorrow", ["Bob", "Carol"]))
    with pytest.raises(InspectorError, match="at least two different referents"):
        analysis.split_heads(planted_capture, Question("today", ["Bob"]))
    df = analysis.split_heads(planted_capture, Question(f"@{planted.TODAY}", [f"@{planted.BOB}", f"@{planted.CAROL}"]))  # token indices
    assert df.set_index("head").loc[0, "split_score"] == pytest.approx(1.0, abs=TOL)


def test_worked_example_reproduces_the_seed():
    spec = json.loads((FIXTURES / "worked_example.json").read_text())
    cap = load(FIXTURES / "worked_example.safetensors")
    exp = explain(cap, Question(position=3), "example.attention", 0)  # "blocked"
    assert exp.table["dot"].round(6).tolist() == [1.0, 6.0, 0.4, 2.0]
    assert exp.table["scaled"].round(6).tolist() == [0.5, 3.0, 0.2, 1.0]
    assert exp.table["weight"].round(3).tolist() == spec["expected"]["blocked"]["weights"]
    assert [round(x, 2) for x in exp.output] == spec["expected"]["blocked"]["output"]
    assert exp.table["weight"].sum() == pytest.approx(1.0)
    card = explain(cap, Question(position=1), "example.attention", 0)
    assert card.table["weight"].tolist()[2:] == [0.0, 0.0]  # "was" and "blocked" exactly 0 under the causal mask
    assert card.table["mask"].tolist()[2:] == [-math.inf, -math.inf]
    assert check_against_capture(cap, exp) < 1e-7


def test_worked_example_file_is_built_by_its_script(tmp_path):
    import runpy

    runpy.run_path(str(FIXTURES / "make_worked_example.py"), run_name="not_main")["main"]([str(tmp_path / "w.safetensors")])
    a, b = load(tmp_path / "w.safetensors"), load(FIXTURES / "worked_example.safetensors")
    for name in b.tensors.keys():
        assert torch.equal(a.tensors[name], b.tensors[name])


def _positions(offsets, text, word, start=0):
    s = text.index(word, start)
    return [i for i, (a, b) in enumerate(offsets) if b > a and a < s + len(word) and b > s]


@pytest.mark.slow
def test_legal_split_on_minilm_equals_eager_attention(minilm, tmp_path):
    model, tok = minilm.model, minilm.tokenizer
    cap = capture(model, tok, LEGAL)
    df = analysis.split_heads(cap, Question("indemnity", ["Lessee", "Lessor"]))
    enc = tok(LEGAL, return_offsets_mapping=True)
    q = _positions(enc["offset_mapping"], LEGAL, "indemnity")
    lessee = _positions(enc["offset_mapping"], LEGAL, "Lessee")
    lessor = _positions(enc["offset_mapping"], LEGAL, "Lessor")
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(**encode(model, tok, LEGAL).model_kwargs, output_attentions=True)
    finally:
        model.set_attn_implementation("sdpa")
    for row in df.to_dict("records"):
        a = out.attentions[row["layer"]][0, row["head"]][q].mean(0)
        assert row["weight:Lessee"] == pytest.approx(float(a[lessee].sum()), abs=TOL)
        assert row["weight:Lessor"] == pytest.approx(float(a[lessor].sum()), abs=TOL)
    assert len(df) == 6 * 12 and df["flagged"].any()
    # the lazy capture gives the same table
    lazy = capture(model, tok, LEGAL, weights=False)
    dl = analysis.split_heads(lazy, Question("indemnity", ["Lessee", "Lessor"]))
    torch.testing.assert_close(torch.tensor(dl["split_score"].to_numpy()), torch.tensor(df["split_score"].to_numpy()), atol=1e-6, rtol=0)


def test_cross_attention_split_on_bart_equals_eager(tokenizer):
    target = "The Lessor shall indemnify the Lessee."
    model = tiny.build("bart")
    cap = capture(model, tokenizer, LEGAL, target)
    df = analysis.split_heads(cap, Question("indemnify", ["Lessee", "Lessor"]), sites="cross")
    assert set(df["kind"]) == {"cross"} and len(df) == 2 * 4
    eager = tiny.build("bart", attn="eager")
    enc = encode(eager, tokenizer, LEGAL, target)
    with torch.no_grad():
        out = eager(**enc.model_kwargs, output_attentions=True)
    src = tokenizer(LEGAL, return_offsets_mapping=True)["offset_mapping"]
    tgt = tokenizer(target, return_offsets_mapping=True)["offset_mapping"]
    q = [p + 1 for p in _positions(tgt, target, "indemnify")]  # +1: the decoder start token comes first
    for row in df.itertuples():
        a = out.cross_attentions[row.layer][0, row.head][q].mean(0)
        assert row.referent_mass == pytest.approx(float(a[_positions(src, LEGAL, "Lessee")].sum() + a[_positions(src, LEGAL, "Lessor")].sum()), abs=TOL)
    # a target-side phrase is only on the decoder's own axis: the encoder sites are left out
    own = analysis.split_heads(cap, Question("shall indemnify the Lessee", ["Lessee", "Lessor"]), sites="self")
    assert set(own["stack"]) == {"decoder"} and set(own["kind"]) == {"causal"}


def test_causal_site_explain_matches_capture(tokenizer):
    cap = capture(tiny.build("llama"), tokenizer, LEGAL, weights=False)
    site = cap.sites[1]
    for qi in (0, 5, site.query_len - 1):
        exp = explain(cap, Question(position=qi), site, 3)
        assert check_against_capture(cap, exp) < 1e-6
        assert (exp.table["weight"].iloc[qi + 1:] == 0).all()


# ---- CLI -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2")
    tiny.build("gpt2").save_pretrained(path)
    tiny.tokenizer().save_pretrained(path)
    return path


def test_cli_capture_rank_split_explain(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run.safetensors"
    assert main(["capture", "--model", str(tiny_model_dir), "--text", LEGAL, "--target", "The Lessor pays.", "-o", str(out)]) == 0
    assert main(["rank", str(out), "--top", "3", "--csv", str(tmp_path / "rank.csv")]) == 0
    import pandas as pd

    rank = pd.read_csv(tmp_path / "rank.csv")
    assert set(analysis.RANK_COLUMNS) <= set(rank.columns) and len(rank) == 2 * 4
    assert main(["split", str(out), "--query", "Lessor", "--occurrence", "2", "--referents", "Lessee,premises", "--csv", str(tmp_path / "split.csv")]) == 0
    split = pd.read_csv(tmp_path / "split.csv")
    assert {"weight:Lessee", "weight:premises", "split_score", "flagged", "query"} <= set(split.columns)
    assert main(["explain", str(out), "--site", "transformer.h.1.attn", "--head", "2", "--query", "pays", "--json", str(tmp_path / "e.json")]) == 0
    data = json.loads((tmp_path / "e.json").read_text())
    assert {"rows", "output"} <= set(data) and sum(r["weight"] for r in data["rows"]) == pytest.approx(1.0)
    assert {"key_index", "key_token", "dot", "scaled", "mask", "weight", "contribution"} <= set(data["rows"][0])
    assert "output = [" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["capture", "--model", "/no/such/model", "--text", "hi", "-o", "x.safetensors"], "does not exist"),
    (["capture", "--text", "   ", "-o", "x.safetensors"], "empty"),
    (["capture", "--text", "word " * 600, "-o", "x.safetensors"], "accepts at most 128"),
    (["capture", "--text", "hi", "--layers", "7", "-o", "x.safetensors"], "layer 7 does not exist"),
    (["capture", "--text", "hi", "--layers", "a", "-o", "x.safetensors"], "comma-separated integers"),
    (["capture", "--text", "hi", "-o", "x.pt"], "end in .safetensors"),
])
def test_cli_user_mistakes_get_one_line(argv, message, tiny_model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if "--model" not in argv:
        argv = argv[:1] + ["--model", str(tiny_model_dir)] + argv[1:]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("inspector: error:") and message in err[-1] and "Traceback" not in "\n".join(err)
    assert not list(tmp_path.glob("*.safetensors"))


def test_cli_bad_files(tmp_path, capsys):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    assert main(["rank", str(bad)]) == 2
    assert "not a readable capture" in capsys.readouterr().err
    good = planted.build().save(tmp_path / "good.safetensors")
    truncated = tmp_path / "trunc.safetensors"
    truncated.write_bytes(good.read_bytes()[:-100])
    assert main(["rank", str(truncated)]) == 2
    assert "truncated" in capsys.readouterr().err
    assert main(["explain", str(good), "--site", "nope", "--head", "0", "--query-index", "1"]) == 2
    assert "no site 'nope'" in capsys.readouterr().err
    assert main(["explain", str(good), "--site", "planted.attention", "--head", "9", "--query-index", "1"]) == 2
    assert "head 9 does not exist" in capsys.readouterr().err


def test_newer_schema_is_refused(tmp_path):
    from safetensors.torch import save_file

    cap = planted.build()
    header = cap.header()
    header["schema"] = 99
    path = tmp_path / "new.safetensors"
    save_file({k: v.contiguous() for k, v in cap.tensors.items()}, str(path), metadata={"inspector": json.dumps(header)})
    with pytest.raises(InspectorError, match="newer than this inspector"):
        load(path)


def test_atomic_save_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    path = planted.build().save(tmp_path / "keep.safetensors")
    before = path.read_bytes()
    import safetensors.torch

    def fail(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", fail)
    with pytest.raises(InspectorError, match="could not write .*disk full.*unchanged"):
        planted.build().save(path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["keep.safetensors"]


# ---- review findings: padded batches, index queries, byte-level output, reproducible commands -------------
def test_rank_on_a_left_padded_row_equals_the_single_text(tokenizer):
    model = tiny.build("gpt2")
    texts = ["The Lessee pays.", "Such indemnity survives termination of this lease for ever and ever."]
    batch = capture(model, tokenizer, texts)
    assert any(batch.records("source", 0).padding)  # row 0 is left-padded
    single = capture(model, tokenizer, texts[0])
    cols = ["entropy", "normalized_entropy", "sink_mass", "self_mass", "prev_mass", "top_key_weight"]
    a = analysis.rank_heads(batch, batch=0).sort_values(["site", "head"])[cols].to_numpy()
    b = analysis.rank_heads(single).sort_values(["site", "head"])[cols].to_numpy()
    assert abs(a - b).max() < 1e-5


def test_exclude_special_skips_rows_that_only_see_special_keys(tokenizer):
    cap = capture(tiny.build("gpt2"), tokenizer, LEGAL)  # row 0 ([CLS]) sees only itself
    site = cap.sites[0]
    w = cap.tensor(site, "weights")[0].double()
    special, _ = cap.flags(site, "key")
    p = w.masked_fill(special, 0)
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-300)
    ent = -(torch.where(p > 0, p * p.clamp_min(1e-300).log(), torch.zeros(()))).sum(-1)[:, 1:].mean(-1)
    got = analysis.rank_heads(cap, exclude_special=True, sites=[site]).sort_values("head")["entropy"].to_numpy()
    assert abs(got - ent.numpy()).max() < 1e-6


def test_both_rankings_in_one_pass_equal_renormalizing_by_hand(minilm):
    """rank_heads with both special-token choices (the app's toggle) on MiniLM, whose sink heads put most weight on [CLS] and [SEP]:
    the excluded entropies equal rows renormalized by hand in float64; the kept ones equal rank_heads."""
    cap = capture(minilm.model, minilm.tokenizer, LEGAL)
    both = analysis.rank_heads(cap, exclude_special=(False, True))
    pd_kept = analysis.rank_heads(cap)
    assert both[False].equals(pd_kept)
    for site in cap.sites:
        w = cap.tensor(site, "weights")[0].double()
        special, _ = cap.flags(site, "key")
        p = w.masked_fill(special, 0)
        p = p / p.sum(-1, keepdim=True)
        ent = -(torch.where(p > 0, p * p.clamp_min(1e-300).log(), torch.zeros(()))).sum(-1)
        n = (~special).sum()
        got = both[True][both[True]["site"] == site.name].sort_values("head")
        assert abs(got["entropy"].to_numpy() - ent.mean(-1).numpy()).max() < 1e-5
        assert abs(got["normalized_entropy"].to_numpy() - (ent / math.log(n)).mean(-1).numpy()).max() < 1e-5


def test_split_by_query_index_skips_sites_whose_axis_is_shorter(tokenizer):
    cap = capture(tiny.build("bart"), tokenizer, LEGAL, "The Lessor pays.")
    df = analysis.split_heads(cap, Question(position=12, referents=["Lessee", "Lessor"]))
    assert set(df["stack"]) == {"encoder"}  # the target has fewer than 13 tokens
    assert df["query"].iloc[0] == f"@12 {cap.tokens(cap.sites[0], 'query')[12]}"


def test_byte_level_generated_text_keeps_every_word_findable():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from inspector.capture.inputs import records_from_ids

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(["The Lessee shall indemnify the Lessor."] * 10, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<eos>"]))
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>")
    text = " The Lessor said \u201cyes\u201d \U0001f600 to the  Lessee."
    rec = records_from_ids(tok, [tok(text, add_special_tokens=False)["input_ids"]], "target")[0]
    assert rec.text == text and all(o is not None for o in rec.offsets)
    # the tokenizer's own offsets for the same text given as a source: byte pieces of one character share its span
    assert rec.offsets == [list(o) for o in tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]]
    for word in ("Lessee", "Lessor", "\u201c", "\U0001f600"):
        s = text.index(word)
        covering = [(a, b) for a, b in rec.offsets if a < s + len(word) and b > s]
        assert min(a for a, _ in covering) <= s and max(b for _, b in covering) == s + len(word)


def test_kind_of_a_bidirectional_encoder_ignores_padding(tokenizer):
    from transformers import SplinterConfig, SplinterModel  # its attention has no is_causal attribute

    torch.manual_seed(0)
    model = SplinterModel(SplinterConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                         intermediate_size=64)).eval()
    for texts in (["Short.", "The Lessee shall indemnify the Lessor."], ["The Lessee shall indemnify the Lessor.", "Short."]):
        assert [s.kind for s in capture(model, tokenizer, texts).sites] == ["self"]


def test_layers_of_a_deeper_decoder_can_be_chosen(tokenizer):
    from transformers import BartConfig, BartForConditionalGeneration

    config = tiny.config_for("bart")
    config = BartConfig(**{**config.to_dict(), "encoder_layers": 1, "decoder_layers": 3})
    torch.manual_seed(0)
    model = BartForConditionalGeneration(config).eval()
    cap = capture(model, tokenizer, LEGAL, "The Lessor pays.", layers=[2])
    assert {(s.stack, s.layer) for s in cap.sites} == {("decoder", 2)}


def test_inconsistent_header_is_refused(tmp_path):
    from safetensors.torch import save_file

    cap = planted.build()
    header = cap.header()
    header["inputs"][0]["tokens"] = header["inputs"][0]["tokens"][:-2]
    path = tmp_path / "bad.safetensors"
    save_file({k: v.contiguous() for k, v in cap.tensors.items()}, str(path), metadata={"inspector": json.dumps(header)})
    with pytest.raises(InspectorError, match=r"input .source.\[0\]: field .tokens. has"):
        load(path)


def test_written_files_get_normal_permissions(tmp_path):
    import os
    import stat

    old = os.umask(0o022)
    try:
        path = planted.build().save(tmp_path / "p.safetensors")
        assert main(["rank", str(path), "--csv", str(tmp_path / "r.csv")]) == 0
    finally:
        os.umask(old)
    for f in (path, tmp_path / "r.csv"):
        assert stat.S_IMODE(f.stat().st_mode) == 0o644


@pytest.mark.parametrize("argv, message", [
    (["rank", "{cap}", "--csv", "{tmp}"], "is a folder"),
    (["capture", "--model", "{model}", "--text", "hi", "--sites", "(", "-o", "{tmp}/x.safetensors"], "not a valid regular expression"),
    (["capture", "--model", "{model}", "--text", "hi", "--device", "bogus", "-o", "{tmp}/x.safetensors"], "cannot move the model"),
])
def test_more_user_mistakes_get_one_line(argv, message, tiny_model_dir, tmp_path, capsys):
    cap = planted.build().save(tmp_path / "c.safetensors")
    argv = [a.format(cap=cap, tmp=tmp_path, model=tiny_model_dir) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("inspector: error:") and message in err[-1]


@pytest.mark.parametrize("name", ["gpt2", "bart"])
def test_batch_with_targets_matches_single_captures(name, tokenizer):
    model = tiny.build(name)
    texts = ["The Lessee pays.", "Such indemnity survives termination of this lease for ever and ever."]
    targets = ["The Lessor shall indemnify the Lessee.", "It survives."]
    batch = capture(model, tokenizer, texts, targets)
    cols = ["entropy", "normalized_entropy", "sink_mass", "self_mass", "prev_mass", "top_key_weight"]
    for b in range(2):
        single = capture(model, tokenizer, texts[b], targets[b])
        a = analysis.rank_heads(batch, batch=b).sort_values(["site", "head"])[cols].fillna(-1).to_numpy()
        s = analysis.rank_heads(single).sort_values(["site", "head"])[cols].fillna(-1).to_numpy()
        assert abs(a - s).max() < 1e-5
    sa = analysis.split_heads(batch, Question("indemnify", ["Lessee", "pays"]), batch=0).sort_values(["site", "head"])
    ss = analysis.split_heads(capture(model, tokenizer, texts[0], targets[0]), Question("indemnify", ["Lessee", "pays"])).sort_values(["site", "head"])
    assert len(sa) == len(ss) > 0
    assert abs(sa["split_score"].to_numpy() - ss["split_score"].to_numpy()).max() < 1e-5


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_lazy_rank_from_logits_equals_the_full_capture(tokenizer, family, tmp_path):
    """A lazy capture ranks from the recomputed logits (no log of every weight; value-weighted attention as
    softmax(logits + log value norm)): the same table as the stored weights give, padded batch of two."""
    model = tiny.build(family)
    texts = [LEGAL, "The Lessee pays."]
    full = load(capture(model, tokenizer, texts).save(tmp_path / "full.safetensors"))
    lazy = load(capture(model, tokenizer, texts, weights=False).save(tmp_path / "lazy.safetensors"))
    assert "weights" not in lazy.sites[0].parts
    for batch in (0, 1):
        for weighting in analysis.WEIGHTINGS:
            for excluded in (False, True):
                a, b = (analysis.rank_heads(c, batch=batch, weighting=weighting, exclude_special=excluded)
                        .sort_values(["site", "head"]).reset_index(drop=True) for c in (full, lazy))
                num = ["entropy", "normalized_entropy", "sink_mass", "self_mass", "prev_mass", "top_key_weight"]
                torch.testing.assert_close(torch.tensor(b[num].to_numpy()), torch.tensor(a[num].to_numpy()),
                                           atol=1e-6, rtol=0, equal_nan=True)
                assert (a["top_key_index"] == b["top_key_index"]).all() and (a["label"] == b["label"]).all()


def test_lazy_rank_with_a_zero_value_norm_takes_the_weights(tokenizer):
    """A zero value norm has no logarithm: those sites are ranked from the reweighted weights, and a head whose
    value norms are all zero is NaN, as in a full capture."""
    model = tiny.build("bert")
    lazy, full = (capture(model, tokenizer, LEGAL, weights=w) for w in (False, True))
    for cap in (lazy, full):
        name = cap.sites[0].tensor_name("value_norm")
        cap.tensors[name][:, 1] = 0.0  # head 1 sends nothing
        cap.tensors[name][:, 2, 0] = 0.0  # head 2: key 0 sends nothing
    a, b = (analysis.rank_heads(c, weighting="value-norm", sites=[c.sites[0]]) .sort_values("head").reset_index(drop=True)
            for c in (full, lazy))
    assert a["entropy"].isna().tolist() == b["entropy"].isna().tolist() == [h == 1 for h in range(len(a))]
    torch.testing.assert_close(torch.tensor(b["entropy"].to_numpy()), torch.tensor(a["entropy"].to_numpy()),
                               atol=1e-6, rtol=0, equal_nan=True)


def test_a_query_that_sees_no_referent_names_the_mask_that_hides_them(tokenizer):
    """split and explain say which mask hides every referent from the query: on a causal LM, the causal mask;
    the words come from the mask spec (store.masks.describe), one definition for every kind of site."""
    from inspector.store import masks

    cap = capture(tiny.build("gpt2"), tokenizer, "Such indemnity binds the Lessee and the Lessor.")
    with pytest.raises(InspectorError, match=r"cannot see any referent \(causal mask\)"):
        analysis.split_heads(cap, Question("indemnity", ["Lessee", "Lessor"]))
    with pytest.raises(InspectorError, match=r"cannot see any referent \(causal mask\)"):
        explain(cap, Question("indemnity", referents=["Lessee", "Lessor"]), cap.sites[0], 0)
    flags = torch.zeros(1, 8, dtype=torch.bool)
    assert masks.describe(masks.band_spec("b", (4, 0, 0), 8, flags, padding=flags)[0]).startswith("block-local mask (blocks of 4")
    assert masks.describe(masks.band_spec("b", (1, 2, 0), 8, flags, padding=flags)[0]).startswith("band mask")
    assert masks.describe({"visible": "sliding", "window": 16}) == "sliding-window mask (the last 16 keys)"
    assert masks.describe(None) == "mask"
