"""Global-plus-block-local attention to tokens (issue 20): Pegasus-X's encoder attends over learned global
tokens (no input's) and the tokens of each query's block, blocks staggered by half a block on odd layers.
Captured, its sites' queries and keys are the pseudo-input ``global`` (tokens ``<global 0>`` ...) followed
by the source; every analysis reads per-token weights with the keys outside the block masked.

The reference is computed here independently of :mod:`inspector.capture.banded`: from each layer's own
projections on the hidden states it received, every real query's softmax over the keys the Pegasus-X
paper's rule lets it see (a token: the global tokens and the non-padding tokens of its block, blocks
shifted by ``block_size // 2`` on a staggered layer; a global token: every global token and every
non-padding token). On a padded batch of two, full and lazy captures equal it within 1e-5, the model's
outputs are unchanged, and the file opens with a mask that shows exactly those keys.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from inspector.analysis import rank_heads
from inspector.capture import capture
from inspector.capture.inputs import encode
from inspector.store import load

import compact
import tiny
from helpers.pegasus_x import BLOCK, GLOBALS, TARGETS, TEXTS, pegasus_x

TOL = 1e-5
CLS = "PegasusXGlobalLocalAttention"


def _reference(model, kwargs):
    """Per encoder layer ``(weights [batch, head, G + n, G + n], visible [batch, G + n, G + n])`` from the
    layer's own projections, and the model's plain output."""
    inputs = {}

    def grab(module, args, kw):
        inputs[module] = kw

    layers = [m for m in model.modules() if type(m).__name__ == "PegasusXEncoderLayer"]
    out = tiny.run_hooked(model, kwargs, [m.self_attn for m in layers], pre=grab)
    n = kwargs["input_ids"].shape[1]
    real = kwargs["attention_mask"].bool()  # [batch, n]
    refs = []
    with torch.no_grad():
        for layer in layers:
            kw = inputs[layer.self_attn]
            off = BLOCK // 2 if layer.stagger_blocks_this_layer else 0
            hs = torch.cat([kw["global_hidden_states"], kw["token_hidden_states"][:, off:off + n]], dim=1)
            refs.append(_layer_reference(layer.self_attn, hs, real, off))
    return refs, out


def _layer_reference(m, hs, real, off):
    b, length, _ = hs.shape
    n = length - GLOBALS

    def heads(t):
        return t.view(b, length, m.num_heads, m.head_dim).transpose(1, 2)

    q, k = heads(m.q_proj(hs)) * m.head_dim ** -0.5, heads(m.k_proj(hs))
    block = torch.cat([torch.full((GLOBALS,), -1), (torch.arange(n) + off) // BLOCK])  # -1: a global token
    is_glob = block < 0
    vis = (block[:, None] == block[None, :]) | is_glob[None, :] | is_glob[:, None]  # [query, key]
    keep = torch.cat([torch.ones(b, GLOBALS, dtype=torch.bool), real], dim=1)  # [batch, key]
    vis = vis[None] & keep[:, None, :]
    scores = (q @ k.transpose(-1, -2)).masked_fill(~vis[:, None], float("-inf"))
    return scores.softmax(-1), vis


def test_global_local_weights_equal_the_models_own_attention(tmp_path):
    model = pegasus_x()
    enc = encode(model, tiny.tokenizer(), TEXTS, TARGETS)
    refs, plain = _reference(model, enc.model_kwargs)
    real = torch.cat([torch.ones(2, GLOBALS, dtype=torch.bool), enc.model_kwargs["attention_mask"].bool()], dim=1)
    for weights in (True, False):
        cap = capture(model, tiny.tokenizer(), TEXTS, TARGETS, weights=weights)
        dec = enc.model_kwargs["decoder_attention_mask"].bool()
        torch.testing.assert_close(cap.output.logits[dec], plain.logits[dec], atol=TOL, rtol=TOL)  # outputs unchanged
        cap = load(cap.save(tmp_path / f"px{weights}.safetensors"))
        sites = [s for s in cap.sites if s.module_class == CLS]
        assert len(sites) == len(refs) == 2
        assert [cap.records("global", b).tokens for b in (0, 1)] == [["<global 0>", "<global 1>", "<global 2>"]] * 2
        for site, (ref, vis) in zip(sites, refs, strict=True):
            assert site.query_input == site.key_input == ["global", "source"]
            assert site.query_len == site.key_len == GLOBALS + 28
            for b in (0, 1):
                got = cap.weights(site, batch=b)  # checked on read: rows sum to 1 over the visible keys
                torch.testing.assert_close(got[:, real[b]], ref[b][:, real[b]], atol=TOL, rtol=0)
                seen = (cap.mask_rows(site, b) > -1e4)[0]  # [query, key]: the keys each query could see
                assert torch.equal(seen, vis[b])  # padding queries too: what the dense layout's mask showed
                assert float(torch.where(seen, 0.0, got)[:, real[b]].abs().max()) == 0
        # token 10 of row 0 (query 3 + 10): layer 0's block is tokens 8..15, layer 1's (staggered) 4..11
        for site, keys in zip(sites, (range(8, 16), range(4, 12)), strict=True):
            row = (cap.mask_rows(site, 0) > -1e4)[0, GLOBALS + 10]
            assert row.nonzero().flatten().tolist() == [0, 1, 2] + [GLOBALS + k for k in keys]
        assert len(rank_heads(cap)) == sum(s.num_heads for s in cap.sites)


def test_debug_end_to_end_on_a_tiny_pegasus_x(tmp_path, capsys):
    """`inspector debug` on a tiny Pegasus-X summariser: generation, the encoder's global-local sites ranked
    with their block and the global tokens as the visible keys, split, explain, report."""
    from inspector.cli import main

    model = pegasus_x()
    model.config.decoder_start_token_id = model.generation_config.decoder_start_token_id = 101
    model.config.eos_token_id = model.generation_config.eos_token_id = 102
    model.save_pretrained(tmp_path / "model")
    tiny.tokenizer().save_pretrained(tmp_path / "model")
    out = tmp_path / "out"
    code = main(["debug", "--model", str(tmp_path / "model"), "--source", TEXTS[0], "--generate", "4", "--query", "@1",
                 "--referents", "Lessee,Lessor", "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    cap = load(out / "capture.safetensors")
    assert len(cap.records("target").ids) >= 2 and (out / "report.html").is_file()
    enc = [s for s in cap.sites if s.module_class == CLS]
    assert len(enc) == 2
    rank = rank_heads(cap).set_index(["site", "head"])
    heads = rank.loc[enc[0].name]
    # the random tiny encoder spreads each row almost evenly over what it sees: a token, at most its block and
    # the global tokens (8 + 3 keys); a global token, all 31. The mean row entropy is at most
    # (3 log 31 + 28 log 11) / 31, and normalised by the visible keys it is near 1 (by all 31 keys: ~0.71)
    assert float(heads["entropy"].max()) <= (3 * math.log(31) + 28 * math.log(11)) / 31 + 1e-6
    assert float(heads["normalized_entropy"].min()) > 0.9


@pytest.mark.parametrize("bad", ["ids", "tokens"])
def test_pseudo_input_is_checked_on_load(bad, tmp_path):
    from inspector.errors import InspectorError
    from inspector.store.capture_file import Capture

    cap = capture(pegasus_x(), tiny.tokenizer(), TEXTS, TARGETS)
    meta = dict(cap.meta)
    meta["inputs"] = [dict(r) for r in meta["inputs"]]
    rec = next(r for r in meta["inputs"] if r["role"] == "global")
    rec[bad] = rec[bad][:-1]  # one global token fewer: the sites' axes no longer add up
    tensors = {k: cap.tensors[k] for k in cap.tensors.keys()}
    Capture(meta, cap.sites, tensors).save(tmp_path / "bad.safetensors")
    with pytest.raises(InspectorError, match="global"):
        load(tmp_path / "bad.safetensors")


def test_global_local_is_stored_compactly(tmp_path):
    """Per query G + block_size values (its global slots and its block) and G global rows, not (G + n)^2; rank and
    split equal the dense layout's; a lazy read of some rows reads only those (and global rows only for a global
    query); the mask is a band rule of blocks, staggered by half a block on layer 1."""
    cap = load(capture(pegasus_x(), tiny.tokenizer(), TEXTS, TARGETS).save(tmp_path / "px.safetensors"))
    sites = [s for s in cap.sites if s.module_class == CLS]
    n = GLOBALS + 28
    for site, offset in zip(sites, (-GLOBALS, BLOCK // 2 - GLOBALS), strict=True):
        assert site.band == 0
        assert cap.tensors.shape(site.tensor_name("weights")) == [2, 4, n, GLOBALS + BLOCK]
        assert cap.tensors.shape(site.tensor_name("global_rows")) == [2, 4, GLOBALS, n]
        spec = cap.masks[site.mask]
        assert (spec["visible"], spec["block"], spec["window"], spec["offset"]) == ("band", BLOCK, 0, offset)
        stored = sum(math.prod(cap.tensors.shape(site.tensor_name(p))) for p in ("weights", "global_rows"))
        assert stored == 2 * 4 * (n * (GLOBALS + BLOCK) + GLOBALS * n) < 2 * 4 * n * n
        compact.assert_lazy_reads(cap, site, 0, [1, 3], slice(GLOBALS + 5, GLOBALS + 20), globals_read=False)
        compact.assert_lazy_reads(cap, site, 1, [0, 1, 2, 3], slice(1, 9), globals_read=True)
    compact.assert_same_analyses(cap, "Lessor", ["Lessee", "claim"])


@functools.cache
def _captured():
    """One in-memory capture of the tiny Pegasus-X for the damaged-file cases (each edits a copy)."""
    return capture(pegasus_x(), tiny.tokenizer(), TEXTS, TARGETS)


def _edit_spec(**fields):
    def edit(header, tensors):
        spec = next(s for s in header["masks"].values() if s["visible"] == "band")
        spec.update(fields)
    return edit


def _edit_site(**fields):
    def edit(header, tensors):
        next(s for s in header["sites"] if s["band"] is not None).update(fields)
    return edit


def _edit_tensor(suffix, change):
    def edit(header, tensors):
        name = next(k for k in tensors if k.endswith(suffix))
        tensors[name] = change(tensors[name])
    return edit


def _edit_band_mask_away(header, tensors):
    for site in header["sites"]:
        if site["band"] is not None:
            site["mask"] = None
    for name, spec in list(header["masks"].items()):
        if spec["visible"] == "band":
            del header["masks"][name]
            for t in [k for k in tensors if k.startswith(name + ".")]:
                del tensors[t]


def _one_more_global(t):
    t = t.clone()
    t[:, GLOBALS + 4] = 1
    return t


@pytest.mark.parametrize("edit, message", [
    (_edit_spec(block="8"), r"field 'block' must be int, and only with a band rule; got \"8\""),
    (_edit_spec(block=0), r"field 'block' must be an integer from 1"),
    (_edit_spec(window=-1), r"field 'window' must be an integer from 0"),
    (_edit_spec(pad_rows=1), r"field 'pad_rows' must be bool, and only with a band rule; got 1"),
    (_edit_spec(window=1, block=2**30), r"the band's window spans more than 2147483648 keys"),
    (_edit_spec(offset=2**40), r"field 'offset' must be an integer from"),
    (_edit_site(band=1), r"weights' has shape \[2, 4, 31, 11\], but the header says .* = \[2, 4, 31, 27\]"),
    (_edit_site(band=-1), r"field 'band' \(-1\) needs a window from 0"),
    (_edit_tensor("encoder.layers.0.self_attn/weights", lambda t: t[..., :-1]), r"weights' has shape \[2, 4, 31, 10\]"),
    (_edit_tensor("encoder.layers.0.self_attn/global_rows", lambda t: t[:, :, :-1]), r"global_rows' has 2 rows for 3 global queries"),
    (_edit_tensor(".globals", _one_more_global), r"weights' has shape \[2, 4, 31, 11\], but the header says"),
    (_edit_band_mask_away, r"field 'band' needs a band mask \(field 'mask' is null\)"),
    (lambda header, tensors: header.update(schema=1), r"field 'band' needs a schema-2 band mask, not a dense one"),
])
def test_damaged_compact_site_refused(edit, message, tmp_path):
    from inspector.errors import InspectorError

    compact.save_edited(_captured(), tmp_path / "bad.safetensors", edit)
    with pytest.raises(InspectorError, match=message) as err:
        load(tmp_path / "bad.safetensors")
    assert "\n" not in str(err.value)
