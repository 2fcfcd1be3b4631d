"""Crafted and hostile capture files: each is read correctly or refused in one line that names the
field, exit 2, no traceback, bounded memory (issue 9)."""

from __future__ import annotations

import copy
import json
import math
import struct
import tracemalloc
import typing

import pytest
import torch
from safetensors.torch import save_file

from inspector.capture import capture
from inspector.capture.inputs import InputRecord
from inspector.cli import main
from inspector.errors import InspectorError
from inspector.store import Site, load
from inspector.store.validate import MASK_FIELDS, conforms

import tiny

TEXTS = ["The Lessee pays.", "Such indemnity survives termination of this lease."]
WRONG = ["0.5", 12345, 1.5, None, [], {}, True, [1, "x"]]  # one value of each JSON type; [1, "x"] mixes item types
PEAK_BYTES = 64 << 20  # Python heap any refusal may take (tracemalloc), whatever the file claims


@pytest.fixture(scope="module")
def bases(tokenizer):
    """name -> (header, tensors): a full padded GPT-2 (weights, causal mask + padding), a lazy padded GPT-2,
    a lazy T5 (position bias, cross-attention) and a schema-1 file (dense float mask)."""
    gpt2 = tiny.build("gpt2")
    out = {}
    for name, cap in (
        ("full", capture(gpt2, tokenizer, TEXTS, layers=[0])),
        ("lazy", capture(gpt2, tokenizer, TEXTS, layers=[0], weights=False)),
        ("t5", capture(tiny.build("t5"), tokenizer, TEXTS[0], "It pays.", layers=[1], weights=False)),
    ):
        out[name] = (cap.header(), {k: v.contiguous() for k, v in cap.tensors.items()})
    old = load(tiny.FIXTURES / "schema1_gpt2_padded.safetensors")
    out["schema1"] = (json.loads(json.dumps(old.meta)), {k: old.tensors[k] for k in old.tensors.keys()})
    return out


def write(tmp_path, header, tensors, name="f.safetensors"):
    path = tmp_path / name
    save_file(tensors, str(path), metadata={"inspector": json.dumps(header)})
    return path


def outcome(capsys, path, *extra, cmd="rank"):
    """None when the command ran (exit 0); else its one error line (asserting exit 2, one line, no traceback).
    Any exception escaping main() fails the test: that would be a traceback."""
    code = main([cmd, str(path), *extra])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    if code == 0:
        return None
    assert code == 2 and len(lines) == 1 and lines[0].startswith("inspector: error:"), err
    return lines[0]


def _mutations(value, tp):
    for w in WRONG:
        if not conforms(w, tp):
            yield w


def test_every_site_and_input_field_removed_or_mistyped(bases, tmp_path, capsys):
    """Every field of Site and InputRecord (from the dataclasses, so fields added later are fuzzed too)."""
    checked = 0
    for base in ("full", "lazy", "t5"):
        header, tensors = bases[base]
        for key, cls, index in (("sites", Site, 0), ("inputs", InputRecord, 0)):
            hints = typing.get_type_hints(cls)
            for field in hints:
                if field not in header[key][index]:
                    continue
                h = copy.deepcopy(header)
                del h[key][index][field]
                line = outcome(capsys, write(tmp_path, h, tensors))
                if line is not None:
                    assert repr(field) in line, line
                for bad in _mutations(header[key][index][field], hints[field]):
                    h = copy.deepcopy(header)
                    h[key][index][field] = bad
                    line = outcome(capsys, write(tmp_path, h, tensors))
                    assert line is not None and repr(field) in line, (base, field, bad, line)
                    checked += 1
    assert checked > 100


def test_every_top_level_and_mask_field_removed_or_mistyped(bases, tmp_path, capsys):
    header, tensors = bases["lazy"]
    for field in ("schema", "sites", "inputs", "masks"):
        h = copy.deepcopy(header)
        del h[field]
        assert repr(field) in outcome(capsys, write(tmp_path, h, tensors))
        for bad in WRONG:
            if field == "schema" and bad in (1.5,):
                continue
            h = copy.deepcopy(header)
            h[field] = bad
            if isinstance(bad, list) and field in ("sites", "inputs") or (field == "masks" and bad == {}):
                assert outcome(capsys, write(tmp_path, h, tensors)) is not None
                continue
            line = outcome(capsys, write(tmp_path, h, tensors))
            assert line is not None and field in line, (field, bad, line)
    for base in ("lazy", "t5"):
        header, tensors = bases[base]
        mask = next(iter(header["masks"]))
        for field, tp in MASK_FIELDS.items():
            h = copy.deepcopy(header)
            del h["masks"][mask][field]
            assert repr(field) in outcome(capsys, write(tmp_path, h, tensors))
            for bad in _mutations(header["masks"][mask][field], tp):
                h = copy.deepcopy(header)
                h["masks"][mask][field] = bad
                line = outcome(capsys, write(tmp_path, h, tensors))
                assert line is not None and repr(field) in line, (field, bad, line)


@pytest.mark.parametrize("base", ["full", "lazy", "t5", "schema1"])
def test_every_tensor_reshaped_retyped_and_rescaled(base, bases, tmp_path, capsys):
    header, tensors = bases[base]
    for name, t in tensors.items():
        shapes = [t.reshape(-1), t[None], t.narrow(-1, 0, t.shape[-1] - 1) if t.shape[-1] > 1 else t.repeat(2),
                  torch.cat([t, t], dim=0)]
        for shaped in shapes:
            line = outcome(capsys, write(tmp_path, header, {**tensors, name: shaped.contiguous()}))
            assert line is not None and (name in line or name.split("/")[0] in line), (name, shaped.shape, line)
        for dtype in (torch.int8, torch.int32, torch.bool, torch.float16, torch.float64):
            if dtype == t.dtype:
                continue
            retyped = t.to(dtype)
            line = outcome(capsys, write(tmp_path, header, {**tensors, name: retyped}))
            if line is None:  # another float width (or bytes as uint8 where bits are stored) reads the same values
                assert dtype.is_floating_point or t.dtype in (torch.uint8, torch.bool)
            else:
                assert name in line or name.split("/")[0] in line, (name, dtype, line)
        if t.is_floating_point():
            site = next(s for s in header["sites"] if name.startswith(s["name"] + "/") or s["mask"] and name.startswith(s["mask"]))
            full = "weights" in site["parts"]
            last = str(max(r["batch"] for r in header["inputs"]))
            explain = ("--site", site["name"], "--head", "1", "--query-index", "2", "--batch", last)
            for scale in (3.0, -1.0, float("nan")):
                path = write(tmp_path, header, {**tensors, name: t * scale})
                line = outcome(capsys, path)
                if name.endswith("/value_norm"):  # a norm is >= 0 and finite: refused on open, by name
                    assert (line is None) == (scale > 0) and (line is None or name in line), (name, scale, line)
                elif name.endswith("/weights") or math.isnan(scale) and not full and not name.endswith("/v"):
                    # weights x 3 or negative, NaN Q/K/mask: rank refuses with site, head and row
                    assert line is not None and " head " in line and " row " in line, (name, scale, line)
                elif math.isnan(scale):  # what rank does not read, explain does
                    line = outcome(capsys, path, *explain, cmd="explain")
                    assert line is not None and " head 1 row 2" in line, (name, scale, line)


def test_the_issues_examples_are_refused_by_name(bases, tmp_path, capsys):
    header, tensors = bases["full"]
    site = header["sites"][0]
    name = site["name"]

    def refused(h=None, t=None, *extra, cmd="rank"):
        return outcome(capsys, write(tmp_path, h or header, t or tensors), *extra, cmd=cmd)

    q1d = {**tensors, f"{name}/q": tensors[f"{name}/q"].reshape(-1).contiguous()}
    assert "'q'" in refused(t=q1d, cmd="info") or f"{name}/q" in refused(t=q1d, cmd="info")
    h = copy.deepcopy(header)
    h["sites"][0]["num_heads"] = 3
    assert "head_map" in refused(h) or "num_heads" in refused(h)
    for field, value in (("scaling", "0.5"), ("scaling", float("nan")), ("softcap", 0), ("parts", None)):
        h = copy.deepcopy(header)
        h["sites"][0][field] = value
        assert f"'{field}'" in refused(h)
    h = copy.deepcopy(header)
    del h["sites"][0]["parts"]
    assert "required field 'parts' is missing" in refused(h)
    h = copy.deepcopy(header)
    h["inputs"][0]["text"] = 12345
    assert "'text'" in refused(h)
    h = copy.deepcopy(header)
    h["inputs"][0]["offsets"][3] = [500, 510]
    assert "'offsets'" in refused(h)
    h = copy.deepcopy(header)
    h["sites"][0]["mask"] = None  # the mask tensors are still stored
    assert "'mask'" in refused(h)
    # weights on masked keys: move the first real query row's weight onto a future key
    w = tensors[f"{name}/weights"].clone()
    w[1, 0, 0] = 0
    w[1, 0, 0, -1] = 1.0
    line = refused(None, {**tensors, f"{name}/weights": w}, "--batch", "1")
    assert "hides" in line and " head 0 row 0" in line
    lazy_h, lazy_t = bases["lazy"]
    for field, value in (("scaling", float("nan")), ("softcap", 0.0)):
        h = copy.deepcopy(lazy_h)
        h["sites"][0][field] = value
        assert f"'{field}'" in outcome(capsys, write(tmp_path, h, lazy_t), "--site", name, "--head", "0", "--query-index",
                                       "1", cmd="explain")


def test_explain_refuses_weights_that_disagree_with_q_and_k(bases, tmp_path, capsys):
    header, tensors = bases["full"]
    name = header["sites"][0]["name"]
    h = copy.deepcopy(header)
    h["sites"][0]["scaling"] = header["sites"][0]["scaling"] * 4  # stored weights no longer follow from Q, K
    line = outcome(capsys, write(tmp_path, h, tensors), "--site", name, "--head", "1", "--query-index", "5",
                   "--batch", "1", cmd="explain")
    assert line is not None and "differ from the ones recomputed" in line and "head 1 row 5" in line
    assert outcome(capsys, write(tmp_path, header, tensors), "--site", name, "--head", "1", "--query-index", "5",
                   "--batch", "1", cmd="explain") is None


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def test_oversized_headers_are_refused_before_parsing(bases, tmp_path, capsys):
    header, tensors = bases["lazy"]
    h = copy.deepcopy(header)
    h["junk"] = [[] for _ in range(3_000_000)]  # ~12 MB of empty lists: gigabytes once parsed by a naive reader
    path = write(tmp_path, h, tensors, "lists.safetensors")

    def refuse():
        with pytest.raises(InspectorError, match="more than its|far more than a capture needs"):
            load(path)

    assert _peak(refuse) < PEAK_BYTES
    assert outcome(capsys, path) is not None
    # a header length far beyond the file, and one beyond any bound
    data = write(tmp_path, header, tensors, "ok.safetensors").read_bytes()
    bad = tmp_path / "claim.safetensors"

    def refuse_claim():
        with pytest.raises(InspectorError, match="header"):
            load(bad)

    for claim in (len(data), 2**50, 2**64 - 1):
        bad.write_bytes(struct.pack("<Q", claim) + data[8:])
        assert _peak(refuse_claim) < PEAK_BYTES
        assert outcome(capsys, bad) is not None
    deep = copy.deepcopy(header)
    deep["sites"][0]["extra_kwargs"] = json.loads("[" * 50 + "]" * 50)
    assert "'extra_kwargs'" in outcome(capsys, write(tmp_path, deep, tensors))
    nested = tmp_path / "nested.safetensors"
    save_file(tensors, str(nested), metadata={"inspector": "[" * 100_000 + "]" * 100_000})
    assert "not valid JSON" in outcome(capsys, nested)


def test_control_characters_from_a_file_are_escaped(bases, tmp_path, capsys):
    header, tensors = bases["full"]
    h = copy.deepcopy(header)
    h["model"]["name"] = "evil\x1b]0;pwned\x07\x1b[2J"
    path = write(tmp_path, h, tensors)
    assert main(["info", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err and "\x07" not in out and "\\x1b" in out
    assert main(["rank", str(path), "--sort", "evil\x1b[2J"]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and len(err.strip().splitlines()) == 1


def test_value_norms_are_checked_when_present(bases, tmp_path, capsys):
    """Issue 10's optional part "value_norm" ([batch, head, key], float, finite, >= 0)."""
    header, tensors = bases["full"]
    site = header["sites"][0]
    name, b, h, k = site["name"], len(TEXTS), site["num_heads"], site["key_len"]
    assert "value_norm" in site["parts"], "captures store value norms where the output projection is found"
    h2 = copy.deepcopy(header)
    bare = copy.deepcopy(header)  # the tensor stored, but not named by the site's parts
    bare["sites"][0]["parts"] = [p for p in site["parts"] if p != "value_norm"]
    good = torch.rand(b, h, k)
    assert outcome(capsys, write(tmp_path, h2, {**tensors, f"{name}/value_norm": good})) is None
    for bad in (good - 2, good * float("nan"), good[:, :, :-1].contiguous(), good.to(torch.int32), good[0].contiguous()):
        line = outcome(capsys, write(tmp_path, h2, {**tensors, f"{name}/value_norm": bad}))
        assert line is not None and f"{name}/value_norm" in line, line
    assert "'parts'" in outcome(capsys, write(tmp_path, bare, {**tensors, f"{name}/value_norm": good}))


def test_integers_beyond_64_bits_are_refused_by_name(bases, tmp_path, capsys):
    """Issue 22: every integer field of a site, an input and a mask spec set beyond what int64 holds (and
    below it): one line naming the field, or read as it is; never a traceback (OverflowError)."""
    checked = 0
    for base in ("lazy", "t5", "full"):
        header, tensors = bases[base]
        name = header["sites"][0]["name"]
        explain = ("--site", name, "--head", "0", "--query-index", "1")
        places = [("sites", 0, typing.get_type_hints(Site)), ("inputs", 0, typing.get_type_hints(InputRecord))]
        places += [("masks", m, MASK_FIELDS) for m in header["masks"]]
        for key, index, hints in places:
            for field, tp in hints.items():
                if field not in header[key][index] or not conforms(1, tp):
                    continue
                for big in (2**70, -(2**70), 2**64 - 1):
                    h = copy.deepcopy(header)
                    h[key][index][field] = big
                    path = write(tmp_path, h, tensors)
                    for cmd, extra in (("rank", ()), ("explain", explain)):
                        line = outcome(capsys, path, *extra, cmd=cmd)
                        # a mask's own numbers are named; a site's may be refused by what they break (e.g. head_map)
                        assert line is None or key != "masks" or repr(field) in line, (base, key, field, big, line)
                    checked += 1
    assert checked > 20
