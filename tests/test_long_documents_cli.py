"""Issue 20 as a new user meets it (review): the long-document summarisers from the command line, where a
run's printed and reported commands must reproduce it and every mistake is one line naming the text at fault.

Tiny seeded LED and Pegasus-X from the builders of tests/helpers/longformer.py and tests/helpers/pegasus_x.py,
saved to a folder so the commands a report prints can be run as a user would run them."""

from __future__ import annotations

import re
import shlex

import pytest
import torch

from inspector.analysis.question import Question
from inspector.capture.models import LoadedModel
from inspector.capture.output import Output
from inspector.cli import main
from inspector.investigate.debug import investigate
from inspector.store import load

import tiny
from helpers import longformer as lf
from helpers import pegasus_x as px

QUOTED = 'The Lessee shall "indemnify" the Lessor against every claim. Such indemnity survives the term of this lease.'


def _saved(build, folder):
    model = build()
    model.config.decoder_start_token_id = model.generation_config.decoder_start_token_id = 101
    model.config.eos_token_id = model.generation_config.eos_token_id = 102
    model.save_pretrained(folder)
    tiny.tokenizer().save_pretrained(folder)
    return LoadedModel(model, tiny.tokenizer(), str(folder))


@pytest.mark.parametrize("family, globals_", [("led", ["@0", "Lessee"]), ("pegasus_x", None)])
def test_report_commands_rerun_the_long_document_run(family, globals_, tmp_path, capsys):
    """Every command of a debug run's report runs as written (exit 0) and its captures equal the run's own:
    the same global tokens (LED's ``--global``, which changes every encoder weight) and the same weights. The
    ``explain`` command of the top head is listed and runs although its site is captured through
    ``output_attentions``, without Q/K/V (its weights without steps); the report's step section shows that row's
    weights and says why there are no steps."""
    build = lf.led if family == "led" else px.pegasus_x
    loaded = _saved(build, tmp_path / "model")
    out = tmp_path / "run"
    inv = investigate(loaded, lf.TEXTS[0], Question(query="indemnify", referents=("Lessee", "Lessor")), Output.of(lf.TARGETS[0]), variants={"quoted": QUOTED}, out_dir=out, global_tokens=globals_)
    again = tmp_path / "again"
    again.mkdir()
    ran = set()
    for cmd in inv.command_lines:
        argv = shlex.split(cmd)[1:]
        for flag in ("--out", "--csv"):
            if flag in argv:
                i = argv.index(flag) + 1
                argv[i] = str(again / (argv[i].rsplit("/", 1)[-1]))
        assert main(argv) == 0, (cmd, capsys.readouterr().err)
        ran.add(argv[0])
        if argv[0] == "capture":
            name = argv[argv.index("--out") + 1].rsplit("/", 1)[-1]
            mine, theirs = load(again / name), load(out / name)
            assert mine.meta["options"].get("global") == theirs.meta["options"].get("global") == globals_
            for site in theirs.sites:
                torch.testing.assert_close(mine.weights(site.name, 0), theirs.weights(site, 0), atol=0, rtol=0)
    assert {"capture", "rank", "split", "compare"} <= ran
    assert "explain" in ran  # the top head's site has no Q/K/V: explained without steps
    html = (out / "report.html").read_text()
    assert "no steps: site" in html and "stores weights only" in html and "no step-by-step view" not in html


SOURCE = lf.TEXTS[0]
OTHER = "The Tenant shall indemnify the Lessor. The Lessee pays."  # no 'against'


@pytest.mark.parametrize("args, message", [
    (["debug", "--source", SOURCE, "--output", "It pays.", "--query", "indemnify", "--referents", "Lessee,Lessor",
      "--variant", "q={other}", "-o", "{tmp}/out"], "--global 'against' is not in the --variant q file"),
    (["effects", "--source", SOURCE, "--output", "The Lessor pays.", "--contrast", "Lessee,Lessor", "--variant", "q={other}",
      "--csv", "-"], "--global 'against' is not in the --variant q file"),
    (["ablate", "--source", SOURCE, "--output", "It pays.", "--heads", "x:0", "--patch-from", "{other}"],
     "--global 'against' is not in the --patch-from file"),
    (["capture", "--text", OTHER, "-o", "{tmp}/x.safetensors"], "--global 'against' is not in the source text"),
])
def test_global_words_missing_from_any_text_are_refused_before_the_model_loads(args, message, tmp_path, capsys):
    """A ``--global`` word that the source, a ``--variant`` or a ``--patch-from`` file lacks is one line naming that
    text, before the model loads (the model named here does not exist: reaching it would be another error)."""
    other = tmp_path / "other.txt"
    other.write_text(OTHER)
    argv = [a.format(other=other, tmp=tmp_path) for a in args]
    code = main([*argv, "--model", str(tmp_path / "no-model"), "--global", "@0,against"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err


def test_global_mistakes_name_the_text_they_are_about():
    """From the API too (a variant's pass encodes another text): a missing word, an index past the text and a
    backwards range each say which text and what to do."""
    from inspector.capture.inputs import encode, global_attention_mask
    from inspector.errors import InspectorError

    model = lf.led()
    enc = encode(model, tiny.tokenizer(), OTHER, "It pays.")
    with pytest.raises(InspectorError, match=r"'against' is not in the source text 'The Tenant shall indemnify"):
        global_attention_mask(model, enc, ["against"])
    with pytest.raises(InspectorError, match=r"@40 is outside the 18 tokens \(0..17\) of the source text 'The Tenant"):
        global_attention_mask(model, enc, ["@40"])
    with pytest.raises(InspectorError, match=r"@5-2 runs backwards: give the first position first, e.g. @2-5"):
        global_attention_mask(model, enc, ["@5-2"])
    for bad in ("@-1", "@x", "@3-", "@1.5"):  # meant as an index: said so, not "not in the source text"
        with pytest.raises(InspectorError, match=rf"--global {re.escape(bad)} is no token index: give @i or @i-j"):
            global_attention_mask(model, enc, [bad])
    padded = encode(model, tiny.tokenizer(), [OTHER, "It pays."], ["It pays.", "It pays."])
    marked = global_attention_mask(model, padded, ["@10"])  # a real token of row 0, padding in row 1: never marked
    assert marked[:, 10].tolist() == [1, 0] and int(marked.sum()) == 1


def test_a_lazy_capture_says_which_sites_store_weights(tmp_path, capsys):
    """``capture --no-weights`` of LongT5 (transient-global encoder through output_attentions, decoder through the
    interface) is mixed, and of LED (every site through output_attentions) stores weights everywhere: ``capture``'s
    last line, ``info``, the notebook view and a plain capture say what the file holds, not what was asked."""
    from inspector.capture import capture
    from inspector.store.display import capture_html

    from helpers import block_local as t5

    tok = tiny.tokenizer()
    mixed = capture(t5.longt5("transient-global"), tok, SOURCE, "It pays.", weights=False)
    assert mixed.storage().startswith("mixed: 4 of 6 sites lazy (Q/K/V + mask), 2 with weights (captured lazily")
    assert mixed.storage() in capture_html(mixed)
    led = _saved(lf.led, tmp_path / "led")
    assert capture(led.model, tok, SOURCE, "It pays.", weights=False).storage().startswith("full (with weights) (captured lazily")
    assert capture(led.model, tok, SOURCE, "It pays.").storage() == "full (with weights)"
    assert capture(tiny.build("bart"), tok, SOURCE, "It pays.", weights=False).storage() == "lazy (Q/K/V + mask)"
    out = tmp_path / "led.safetensors"
    assert main(["capture", "--model", str(tmp_path / "led"), "--text", SOURCE, "--target", "It pays.", "--no-weights",
                 "-o", str(out)]) == 0
    assert "full (with weights) (captured lazily" in capsys.readouterr().err
    assert main(["info", str(out)]) == 0
    assert "capture: full (with weights) (captured lazily" in capsys.readouterr().out


def test_value_norm_refusal_does_not_promise_a_recapture_that_cannot_help(tmp_path):
    """LED's sites are all captured through output_attentions, without values: no capture gives them value norms,
    so the refusal names only --weighting attention."""
    from inspector.analysis import rank_heads
    from inspector.capture import capture
    from inspector.errors import InspectorError

    cap = capture(lf.led(), tiny.tokenizer(), SOURCE, "It pays.")
    with pytest.raises(InspectorError, match=r"output_attentions, without values\): use --weighting attention$"):
        rank_heads(cap, weighting="value-norm")


def test_every_value_norm_refusal_promises_a_recapture_only_where_it_helps(tmp_path):
    """The single-site refusal (explain, head_weights) follows the all-sites one: an output_attentions site (LED)
    has no value norms in any capture, so no 'capture again'; a capture made with ``value_norms=False`` gets it."""
    from inspector.analysis import head_weights, rank_heads
    from inspector.analysis.explain import explain
    from inspector.capture import capture
    from inspector.errors import InspectorError

    cap = capture(lf.led(), tiny.tokenizer(), SOURCE, "It pays.", global_tokens=["@0"])
    with pytest.raises(InspectorError, match=r"without values\): use --weighting attention$"):
        explain(cap, Question("Lessee", weighting="value-norm"), cap.sites[0], 0)
    for site in (cap.sites[0], next(s for s in cap.sites if s.stack == "decoder")):
        with pytest.raises(InspectorError, match=r"without values\): use --weighting attention$"):
            head_weights(cap, site, weighting="value-norm")
    plain = capture(tiny.build("gpt2"), tiny.tokenizer(), "The Lessee pays the Lessor.", value_norms=False)
    with pytest.raises(InspectorError, match=r"use --weighting attention, or capture again with this inspector$"):
        head_weights(plain, plain.sites[0], weighting="value-norm")
    with pytest.raises(InspectorError, match=r"use --weighting attention, or capture again with this inspector$"):
        rank_heads(plain, weighting="value-norm")


def test_attribute_on_pegasus_x_runs_by_default_and_says_where_rollout_went(tmp_path, capsys):
    """`attribute` with its default methods failed on Pegasus-X (and every model whose sites have no value norms)
    telling the user to pass --weighting attention, an option attribute does not have. Now value_rollout is left
    out with a note; asked for by name it is refused naming --methods. The rollout share on the learned global
    tokens (no row of the table) is printed, and it is what the table's rows leave of 1."""
    from inspector.attribute.attribution import attribute

    _saved(px.pegasus_x, tmp_path / "model")
    argv = ["attribute", "--model", str(tmp_path / "model"), "--source", px.TEXTS[0], "--output", px.TARGETS[0],
            "--position", "2", "--csv", str(tmp_path / "a.csv")]
    capsys.readouterr()
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "left out value_rollout: model.encoder.layers.0.self_attn has no value norms" in err
    df = attribute(px.pegasus_x(), tiny.tokenizer(), px.TEXTS[0], px.TARGETS[0], position=2)
    assert "value_rollout" not in df and "value_rollout" in df.attrs["left_out"]
    share = df.attrs["rollout_global"]
    assert share > 0.01 and abs(share + df["rollout"].sum() - 1) < 1e-6
    assert f"rollout: {share:.5g} of the row is traced to the model's learned global tokens" in out
    assert main([*argv, "--methods", "rollout,value_rollout"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the model's loading lines
    assert last.startswith("inspector: error: value_rollout needs value norms") and "--methods" in last
    assert "--weighting" not in last
