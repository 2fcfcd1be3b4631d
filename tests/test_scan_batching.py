"""What makes the scan cheaper per document without changing a number (issue 30): batches of documents of similar
length (less padding in each forward pass), batches grouped into fewer commits, forward passes that end after their
last attention call, and the split's query rows read from the weights the forward pass computed."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest
import torch

from inspector.corpus import folder as folder_mod
from inspector.corpus import reduce
from inspector.corpus.documents import Document, Fields
from inspector.corpus.engine import Engine
from inspector.corpus.folder import Committer, ScanFolder, committed_documents
from inspector.corpus.leases import lease_rows, write_jsonl
from inspector.corpus.scan import scan

import tiny
from helpers.commits import META
from helpers.commits import batch as _batch  # the writer tests' batch of three documents
from helpers.scan import read_heads

FIELDS = Fields(query="query", referents="referents", id="id")


def _docs(n: int) -> list[Document]:
    return [Document(row=i, id=r["id"], text=r["text"]) for i, r in enumerate(lease_rows(n, seed=3))]


@pytest.fixture(scope="module")
def bert():
    from inspector.capture.models import LoadedModel

    return LoadedModel(model=tiny.build("bert"), tokenizer=tiny.tokenizer(), name="tiny-bert")


# ---- batches of similar length ---------------------------------------------------------------------------
def test_length_batches_hold_every_document_once_sorted_within_each_window():
    docs = _docs(50)
    batches = list(reduce.length_batches(docs, 4, window=3))
    assert sorted(d.row for b in batches for d in b) == list(range(50))  # each document exactly once
    assert all(len(b) == 4 for b in batches[:-1]) and 1 <= len(batches[-1]) <= 4
    for w in range(0, 50, 12):  # each window of 12 documents: its batches in length order, ties in corpus order
        window = [d for b in batches if w <= min(d.row for d in b) < w + 12 for d in b]
        assert [d.row for d in window] == [d.row for d in sorted(docs[w:w + 12], key=reduce.length_of)]
    assert [[d.row for d in b] for b in reduce.length_batches(docs, 4, window=1)] == \
        [[d.row for d in b] for b in reduce.batched(docs, 4)]
    assert reduce.length_of(Document(row=0, id="x", text="abc", target="de")) == 5
    assert reduce.length_of(Document(row=0, id="x", text=None, problem="no text")) == 0


def test_length_batches_cut_the_padding_of_the_demo_clauses(tokenizer):
    """Padded tokens per real token on 128 generated clauses, batches of 8: in corpus order about 1.2, by length
    (characters, read without tokenizing) close to 1: at least two thirds of the padding gone."""
    docs = _docs(128)
    n_tokens = {d.row: len(tokenizer(d.text)["input_ids"]) for d in docs}

    def padded(batches):
        return sum(max(n_tokens[d.row] for d in b) * len(b) for b in batches) / sum(n_tokens.values())

    before, after = padded(reduce.batched(docs, 8)), padded(reduce.length_batches(docs, 8))
    assert before > 1.1 and after - 1 < (before - 1) / 3, (before, after)
    # with the (fast) tokenizer the batches follow the token counts: no more padding than by characters, and each
    # window's documents in token order (ties in corpus order)
    by_tokens = list(reduce.length_batches(docs, 8, tokenizer=tokenizer))
    assert padded(by_tokens) <= after, (padded(by_tokens), after)
    assert sorted(d.row for b in by_tokens for d in b) == list(range(128))
    window = [d for b in by_tokens for d in b]  # 128 documents: one window of 16 batches of 8
    keys = [(len(tokenizer(d.text, add_special_tokens=False)["input_ids"]), d.row) for d in window]
    assert keys == sorted(keys)


def test_token_lengths_count_text_and_target_and_give_way_to_characters(tokenizer):
    docs = [Document(row=0, id="a", text="The Lessor shall pay.", target="Yes."),
            Document(row=1, id="b", text=None, problem="no text"), Document(row=2, id="c", text="indemnify")]
    want = [len(tokenizer(d.text or "", add_special_tokens=False)["input_ids"])
            + len(tokenizer(d.target or "", add_special_tokens=False)["input_ids"]) for d in docs]
    assert reduce.token_lengths(docs, tokenizer) == want and want[1] == 0 and want[2] > 1  # "indemnify": word pieces
    backend = tokenizer.backend_tokenizer
    backend.enable_padding(length=64)  # what a padded call may leave set on the Rust tokenizer: real tokens still counted
    try:
        assert reduce.token_lengths(docs, tokenizer) == want
    finally:
        backend.no_padding()
    assert reduce.token_lengths(docs, None) is None  # no tokenizer: length_batches sorts by characters

    class Broken:
        is_fast = True

        def __call__(self, *a, **k):
            raise RuntimeError("no")

    assert reduce.token_lengths(docs, Broken()) is None
    ordered = [d.id for b in reduce.length_batches(docs, 2, tokenizer=Broken()) for d in b]
    assert ordered == ["b", "c", "a"]  # by characters: 0, 9, 25


def test_a_scans_rows_do_not_depend_on_how_its_documents_were_batched(bert, tmp_path, monkeypatch):
    data = write_jsonl(tmp_path / "leases.jsonl", lease_rows(20, seed=5))
    scan(data, tmp_path / "by_length", fields=FIELDS, engine=Engine(batch_size=4), loaded=bert, progress=False)
    monkeypatch.setattr(reduce, "LENGTH_WINDOW", 1)  # corpus order
    scan(data, tmp_path / "in_order", fields=FIELDS, engine=Engine(batch_size=4), loaded=bert, progress=False)
    a, b = (read_heads(tmp_path / x).sort_values(["id", "site", "head"]).reset_index(drop=True)
            for x in ("by_length", "in_order"))
    assert len(a) == len(b) > 0 and a["split_score"].notna().any()
    assert a.columns.tolist() == b.columns.tolist()
    for c in a.columns:
        if pd.api.types.is_float_dtype(a[c]):
            np.testing.assert_allclose(a[c].to_numpy(float), b[c].to_numpy(float), atol=1e-6, rtol=0, err_msg=c)
        else:
            assert [str(v) for v in a[c]] == [str(v) for v in b[c]], c
    docs = [pd.read_parquet(tmp_path / x / "documents.parquet") for x in ("by_length", "in_order")]
    assert docs[0].equals(docs[1])  # sorted by corpus row either way


# ---- fewer, larger commits --------------------------------------------------------------------------------
def test_the_writer_groups_batches_into_commits_of_at_least_n_documents(tmp_path):
    out = tmp_path / "out"
    folder = ScanFolder(out, META).open()
    with Committer(folder, group_documents=6, group_seconds=60.0) as c:
        for k in range(5):
            c.commit(*_batch(k))
    folder.flush()
    docs = committed_documents(out)
    assert docs.groupby("part").size().tolist() == [6, 6, 3]  # the last group is committed when the writer closes
    assert list(docs["id"]) == [f"d{k}-{i}" for k in range(5) for i in range(3)]  # in the order handed over
    heads = read_heads(out)
    assert list(heads["entropy"][::3]) == [0.5 + k for k in range(5)]


def test_the_writer_commits_a_group_once_its_time_is_up(tmp_path):
    out = tmp_path / "out"
    folder = ScanFolder(out, META).open()
    with Committer(folder, group_documents=1000, group_seconds=0.05) as c:
        c.commit(*_batch(0))
        deadline = time.monotonic() + 30
        while not list((out / "_documents").glob("part-*.parquet")) and time.monotonic() < deadline:
            time.sleep(0.01)  # waiting on the condition (the part appears), not a fixed time
        assert [p.name for p in (out / "_documents").glob("part-*.parquet")] == ["part-00000.parquet"]
        c.commit(*_batch(1))
    assert committed_documents(out).groupby("part").size().tolist() == [3, 3]


def test_a_scan_groups_its_batches_and_reads_as_when_each_batch_was_a_part(bert, tmp_path, monkeypatch):
    data = write_jsonl(tmp_path / "leases.jsonl", lease_rows(12, seed=2))
    grouped = scan(data, tmp_path / "grouped", fields=FIELDS, engine=Engine(batch_size=3), loaded=bert, progress=False)
    assert len(list((tmp_path / "grouped" / "heads").glob("part-*.parquet"))) == 1  # 12 documents < GROUP_DOCUMENTS
    monkeypatch.setattr(folder_mod, "GROUP_DOCUMENTS", 1)
    monkeypatch.setattr(folder_mod, "GROUP_SECONDS", 0.0)
    scan(data, tmp_path / "each", fields=FIELDS, engine=Engine(batch_size=3), loaded=bert, progress=False)
    assert len(list((tmp_path / "each" / "heads").glob("part-*.parquet"))) == 4
    a, b = (read_heads(tmp_path / x).sort_values(["id", "site", "head"]).reset_index(drop=True) for x in ("grouped", "each"))
    pd.testing.assert_frame_equal(a, b)
    assert grouped.scanned == 12
    assert pd.read_parquet(tmp_path / "grouped" / "documents.parquet").equals(pd.read_parquet(tmp_path / "each" / "documents.parquet"))


# ---- a scan's pass ends after its last attention call -----------------------------------------------------
def _lease_docs(n: int, targets: bool = False) -> list[Document]:
    rows = lease_rows(max(n, 10), seed=4)[:n]
    return [Document(row=i, id=r["id"], text=r["text"], query=r.get("query"), referents=r.get("referents"),
                     target=("The tenant pays." if targets else None)) for i, r in enumerate(rows)]


def _leaf_calls(model) -> tuple[list, list[int]]:
    """Hooks counting the calls of every leaf module (projections, norms, activations) into ``calls[0]``."""
    calls = [0]
    hooks = [m.register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
             for m in model.modules() if not list(m.children())]
    return hooks, calls


@pytest.mark.parametrize("name,targets", [("bert", False), ("gpt2", False), ("bart", True), ("t5", True)])
def test_a_scan_pass_ends_after_its_last_attention_call_with_the_same_rows(name, targets):
    from inspector.corpus.forward_sums import StopPlan

    model, tok = tiny.build(name), tiny.tokenizer()
    docs = _lease_docs(6, targets)
    plan = StopPlan()
    hooks, linear = _leaf_calls(model)
    try:
        first = reduce.capture_batch(model, tok, docs, reduce.Options(), plan=plan)
        full_linear, linear[0] = linear[0], 0
        again = reduce.capture_batch(model, tok, docs, reduce.Options(), plan=plan)
        stopped_linear = linear[0]
    finally:
        for h in hooks:
            h.remove()
    (cap_a, _), = first.captures
    (cap_b, _), = again.captures
    assert cap_a.output is not None and cap_b.output is None  # the second pass stopped
    assert list(plan.orders.values())[0] is not None and len(list(plan.orders.values())[0]) == len(cap_a.sites)
    assert 0 < stopped_linear < full_linear  # what runs after the last attention call did not run
    assert [s.name for s in cap_a.sites] == [s.name for s in cap_b.sites]
    for key in cap_a.tensors:  # the recording is the same
        assert torch.equal(cap_a.tensors[key], cap_b.tensors[key]), key
    a, b = reduce.analyse(first).heads, reduce.analyse(again).heads
    pd.testing.assert_frame_equal(a, b)


def test_a_pass_whose_calls_go_another_way_runs_to_its_end():
    from inspector.corpus.forward_sums import StopPlan

    model, tok = tiny.build("bert"), tiny.tokenizer()
    docs = _lease_docs(4)
    plan = StopPlan()
    reduce.capture_batch(model, tok, docs, reduce.Options(), plan=plan)
    (key, order), = plan.orders.items()
    plan.orders[key] = tuple(reversed(order))  # not the order this model calls its modules in
    (cap, _), = reduce.capture_batch(model, tok, docs, reduce.Options(), plan=plan).captures
    assert cap.output is not None and len(cap.sites) == len(order)


def test_a_model_that_calls_a_module_twice_never_stops_early():
    from inspector.corpus.forward_sums import StopPlan

    model, tok = tiny.build("bert"), tiny.tokenizer()
    layers = model.encoder.layer
    model.encoder.layer = torch.nn.ModuleList([layers[0], layers[1], layers[0]])  # layer 0 shared, called twice
    model.config.num_hidden_layers = 3
    docs = _lease_docs(4)
    plan = StopPlan()
    for _ in range(2):
        (cap, _), = reduce.capture_batch(model, tok, docs, reduce.Options(), plan=plan).captures
        assert cap.output is not None and len(cap.sites) == 3
    assert list(plan.orders.values()) == [None]


# ---- the split's query rows read from the weights the forward pass computed ----------------------------------
def test_the_held_weights_are_the_models_own_and_give_the_recomputed_rows(monkeypatch):
    from inspector.capture.recorder import capture
    from inspector.corpus import forward_sums
    from inspector.corpus.forward_sums import ForwardSums

    model, tok = tiny.build("bert"), tiny.tokenizer()
    docs = _lease_docs(5)
    texts = [d.text for d in docs]
    lazy = capture(model, tok, texts, weights=False, value_norms=False,
                   forward_sums=lambda records: ForwardSums(records, (False,)))
    full = capture(model, tok, texts, weights=True, value_norms=False)  # transformers' eager attention, kept
    held = lazy.forward_sums.weights
    assert set(held) == {s.name for s in full.sites}
    for s in full.sites:
        torch.testing.assert_close(held[s.name][0], full.tensors[f"{s.name}/weights"], rtol=0, atol=1e-6)
    a = reduce.reduce_batch(model, tok, docs).heads
    monkeypatch.setattr(forward_sums, "KEEP_VALUES", 0)  # nothing held: the rows are computed again from Q and K
    b = reduce.reduce_batch(model, tok, docs).heads
    assert a["split_score"].notna().any()
    for c in ("referent_mass", "chance_mass", "lift", "split_score", "shared_share", "split_unshared"):
        np.testing.assert_allclose(a[c].to_numpy(float), b[c].to_numpy(float), atol=1e-6, rtol=0, err_msg=c)
    for c in ("query_positions", "rows_flagged", "referents", "flagged", "driving_row"):
        assert [str(v) for v in a[c]] == [str(v) for v in b[c]], c


def test_pieces_texts_of_many_heads_are_each_heads_own_text():
    from inspector.analysis.split import ReferentLayout

    tokens = ["[CLS]", "les", "##see", "{x}", "a\x00b", "les", "##sor", "[SEP]"]
    lay = ReferentLayout({"Lessee": [1, 2], "odd": [3, 4], "Lessor": [5, 6]}, tokens)
    weights = np.random.default_rng(0).random((5, len(lay.pieces)))
    many = lay.pieces_texts(weights)
    assert [[many[j][h] for j in range(3)] for h in range(5)] == [lay.pieces_text(list(w)) for w in weights]
    assert many[0][0] == f"les={weights[0, 0]:.4f} ##see={weights[0, 1]:.4f}"
    assert many[1][2] == f"{{x}}={weights[2, 2]:.4f} a\x00b={weights[2, 3]:.4f}"  # braces and the separator kept
    assert lay.pieces_texts(np.zeros((0, len(lay.pieces)))) == [[], [], []]


def test_the_pieces_of_many_rows_in_one_call_are_each_layouts_own():
    """split.rows_pieces_texts (the scan's writer: one format call for a block's rows) gives, row by row, what
    each row's layout gives alone: layouts of different pieces and referents (a shared piece, braces), rows of
    documents in any order; a token holding the separator gives None (the writer then goes layout by layout)."""
    from inspector.analysis.split import ReferentLayout, rows_pieces_texts

    tokens = ["[CLS]", "the", "les", "##see", "{x}", "les", "##sor", "bank", "[SEP]"]
    layouts = [ReferentLayout({"Lessee": [2, 3], "Lessor": [5, 6]}, tokens),
               ReferentLayout({"bank": [7], "{x}": [4], "the Lessee": [1, 2, 3]}, tokens),
               ReferentLayout({"the": [1], "bank": [7]}, tokens)]
    rng = np.random.default_rng(1)
    docs = np.array([2, 0, 0, 1, 2, 1, 1])
    weights = rng.random((len(docs), max(len(lay.pieces) for lay in layouts)))
    want = [text for d, w in zip(docs, weights, strict=True) for text in layouts[d].pieces_text(list(w))]
    assert rows_pieces_texts(layouts, docs, weights) == want
    assert want[2] == f"les={weights[1, 0]:.4f} ##see={weights[1, 1]:.4f}"
    odd = [ReferentLayout({"a": [1], "b": [2]}, ["[CLS]", "x\x00y", "z"])]
    assert rows_pieces_texts(odd, np.array([0, 0]), rng.random((2, 2))) is None


def test_a_model_that_calls_attention_again_for_long_inputs_is_never_cut_short():
    """A pass's calls may depend on the input's length (here layer 1 of a Llama looks twice at inputs of 20 tokens
    or more): the plan is learned per input shape, so a batch of long documents after a batch of short ones keeps
    its second call's rows (before, it was stopped after the calls the short batch made)."""
    from transformers import AutoModelForCausalLM

    config = tiny.config_for("llama")
    config.num_hidden_layers = 2
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    attn = model.model.layers[1].self_attn
    own = attn.forward

    def looped(hidden_states, *a, **k):
        out, w = own(hidden_states, *a, **k)
        if hidden_states.shape[1] >= 20:
            out, w = own(hidden_states + out, *a, **k)
        return out, w

    attn.forward = looped
    tok = tiny.tokenizer()
    docs = [Document(row=i, id=f"d{i}", text=("word " * (5 if i < 4 else 30)).strip()) for i in range(8)]
    results = list(reduce.local_batches(model, tok, docs, batch_size=4, prefetch=False))
    heads = pd.concat([r.heads for r in results], ignore_index=True)
    alone = reduce.reduce_batch(model, tok, docs[4:]).heads
    for d in ("d4", "d7"):
        assert sorted(heads.loc[heads["id"] == d, "site"].unique()) == sorted(alone.loc[alone["id"] == d, "site"].unique())
        assert "model.layers.1.self_attn@1" in set(heads.loc[heads["id"] == d, "site"])


def test_long_documents_are_not_read_ahead_many_at_a_time(monkeypatch):
    monkeypatch.setattr(reduce, "WINDOW_CHARS", 1000)
    docs = [Document(row=i, id=str(i), text="x" * (600 if i % 2 else 10)) for i in range(12)]
    held = []
    real = reduce._cut

    def spy(chunk, size, tokenizer=None):
        held.append(len(chunk))
        return real(chunk, size, tokenizer)

    monkeypatch.setattr(reduce, "_cut", spy)
    batches = list(reduce.length_batches(docs, 4))
    assert sorted(d.row for b in batches for d in b) == list(range(12))
    assert max(held) <= 4 and sum(held) == 12  # a window ends once its texts hold 1,000 characters


def test_a_scan_stopped_inside_a_group_resumes_to_the_uninterrupted_rows(bert, tmp_path, monkeypatch):
    """With the default grouping (64 documents a commit), Ctrl-C in the fourth batch commits the three batches
    gathered so far; a resume scans the rest, and the folder equals an uninterrupted scan's."""
    data = write_jsonl(tmp_path / "leases.jsonl", lease_rows(20, seed=6))
    scan(data, tmp_path / "full", fields=FIELDS, engine=Engine(batch_size=3), loaded=bert, progress=False)
    real, calls = reduce.reduce_batch, [0]

    def interrupted(*a, **k):
        calls[0] += 1
        if calls[0] == 4:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(reduce, "reduce_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        scan(data, tmp_path / "part", fields=FIELDS, engine=Engine(batch_size=3), loaded=bert, progress=False)
    monkeypatch.setattr(reduce, "reduce_batch", real)
    assert len(committed_documents(tmp_path / "part")) == 9
    assert len(list((tmp_path / "part" / "heads").glob("part-*.parquet"))) == 1  # one group
    again = scan(data, tmp_path / "part", fields=FIELDS, engine=Engine(batch_size=3), loaded=bert, progress=False)
    assert (again.skipped, again.scanned) == (9, 11)
    a, b = (read_heads(tmp_path / x).sort_values(["id", "site", "head"]).reset_index(drop=True) for x in ("full", "part"))
    assert a["id"].tolist() == b["id"].tolist()
    for c in a.columns:
        if pd.api.types.is_float_dtype(a[c]):
            np.testing.assert_allclose(a[c].to_numpy(float), b[c].to_numpy(float), atol=1e-6, rtol=0, err_msg=c)
    assert pd.read_parquet(tmp_path / "full" / "documents.parquet").equals(pd.read_parquet(tmp_path / "part" / "documents.parquet"))


# ---- one stop plan per model, kept across scans ----------------------------------------------------------------------
def test_a_second_scan_of_the_same_model_stops_from_its_first_pass_and_a_changed_model_learns_anew(monkeypatch):
    """The plan a scan learns is kept for its model (StopPlan.of): the second scan's passes all end early, with the
    same rows; replacing a layer, or patching a module's forward, makes a new plan (a full pass first)."""
    from inspector.corpus.forward_sums import StopPlan

    model, tok = tiny.build("bert"), tiny.tokenizer()
    docs = _lease_docs(6)
    outputs: list = []
    own = reduce._capture

    def watched(*a, **k):
        cap = own(*a, **k)
        outputs.append(cap.output)
        return cap

    monkeypatch.setattr(reduce, "_capture", watched)
    first = pd.concat([r.heads for r in reduce.local_batches(model, tok, docs, batch_size=3, prefetch=False)])
    assert outputs[0] is not None  # the first pass of a shape runs whole
    plan = StopPlan.of(model)
    assert StopPlan.of(model) is plan and plan.orders and all(o is not None for o in plan.orders.values())
    outputs.clear()
    second = pd.concat([r.heads for r in reduce.local_batches(model, tok, docs, batch_size=3, prefetch=False)])
    assert outputs and all(o is None for o in outputs)  # every pass of the second scan ended after its last call
    pd.testing.assert_frame_equal(first.reset_index(drop=True), second.reset_index(drop=True))
    model.encoder.layer[1] = type(model.encoder.layer[1])(model.config, layer_idx=1).eval()  # a layer replaced
    assert StopPlan.of(model) is not plan and not StopPlan.of(model).orders
    patched = StopPlan.of(model)
    attn = model.encoder.layer[0].attention.self
    attn.forward = attn.forward  # a module's forward set on the instance
    assert StopPlan.of(model) is not patched
    hooked = StopPlan.of(model)
    handle = model.encoder.layer[1].register_forward_hook(lambda *a: None)  # a hook may call attention again
    assert StopPlan.of(model) is not hooked
    handle.remove()


def test_a_plan_holds_no_reference_to_its_model():
    import gc
    import weakref

    from inspector.corpus.forward_sums import StopPlan

    model = tiny.build("bert")
    StopPlan.of(model)
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None


def test_a_kept_plan_is_dropped_when_a_class_forward_or_an_instance_forward_at_a_reused_address_changes(monkeypatch):
    """A reviewer's two cases: a class-level patch that runs the last layer twice, and an instance forward replaced
    by another function (which CPython may place at the freed one's address): the kept plan would have stopped the
    pass before the new calls; each makes a new plan, and the scan keeps every site a fresh plan finds."""
    import types

    from transformers.models.llama import modeling_llama

    from inspector.corpus.forward_sums import StopPlan

    model, tok = tiny.build("llama"), tiny.tokenizer()
    docs = _lease_docs(3)

    def sites():
        return sorted(pd.concat([r.heads for r in reduce.local_batches(model, tok, docs, batch_size=3, prefetch=False)])
                      ["site"].unique())

    before = sites()
    plan = StopPlan.of(model)
    own = modeling_llama.LlamaDecoderLayer.forward

    def looped(self, hidden_states, *args, **kw):
        out = own(self, hidden_states, *args, **kw)
        if self is model.model.layers[-1]:
            out = own(self, out[0] if isinstance(out, tuple) else out, *args, **kw)
        return out

    monkeypatch.setattr(modeling_llama.LlamaDecoderLayer, "forward", looped)
    assert StopPlan.of(model) is not plan
    assert len(sites()) == len(before) + 1  # the second call of the last layer's attention is there
    monkeypatch.undo()
    attn = model.model.layers[-1].self_attn
    once = type(attn).forward

    def twice(self, hidden_states, *a, **k):
        out, w = once(self, hidden_states, *a, **k)
        return once(self, hidden_states + out, *a, **k)

    attn.forward = types.MethodType(once, attn)
    assert sites() == before
    kept = StopPlan.of(model)
    del attn.forward
    attn.forward = types.MethodType(twice, attn)
    assert StopPlan.of(model) is not kept
    assert len(sites()) == len(before) + 1


def test_a_row_a_sum_leaves_out_adds_nothing_even_where_its_weights_are_not_finite():
    """A real row that sees one key is in the entropy's mean, not in the normalized entropy's: a NaN weight there
    makes the block not finite (the caller's error) but leaves the normalized entropy of the other rows as it was."""
    from inspector.analysis import RankSums

    none = torch.zeros(1, 3, dtype=torch.bool)
    rows = torch.ones(1, 1, dtype=torch.bool)
    s = RankSums(1, 1, 3, False, (False,))
    one = torch.tensor([[[[True, False, False]]]])
    assert not s.add(torch.tensor([[[[float("nan"), 0.0, 0.0]]]]), s.block_rows(1, one, rows, torch.arange(1), special_k=none, pad_k=none))
    two = torch.tensor([[[[True, True, False]]]])
    assert s.add(torch.tensor([[[[0.5, 0.5, 0.0]]]]), s.block_rows(1, two, rows, torch.arange(1), special_k=none, pad_k=none))
    assert float(s.metrics(False)["normalized_entropy"][0, 0]) == pytest.approx(1.0)
