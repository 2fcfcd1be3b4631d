"""Review faults where what the tool tells the user was not true: the reproduce commands of a generated run's
variants, the refusal for a head with no edit point, and a value-norm split with no row left.

Tiny seeded models (tests/tiny.py, Pegasus-X as tests/helpers/pegasus_x.py builds it), saved to a folder where
a command must load them as a user would."""

from __future__ import annotations

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

SOURCE = "The Lessee shall indemnify the Lessor against all claims."
QUOTED = 'The lease says "The Lessee shall indemnify the Lessor." It survives.'


def _saved(name: str, folder):
    model = tiny.build(name, attn="eager")
    if model.config.is_encoder_decoder:
        model.config.decoder_start_token_id = model.generation_config.decoder_start_token_id = 101
        model.config.eos_token_id = model.generation_config.eos_token_id = 102
    model.save_pretrained(folder)
    tiny.tokenizer().save_pretrained(folder)
    return LoadedModel(model, tiny.tokenizer(), str(folder))


def _rerun(commands: list[str], out, again, capsys) -> set[str]:
    """Run every command as written (outputs redirected into ``again``); each capture must equal the run's own:
    the same token ids on every side and the same weights, exactly."""
    ran = set()
    for cmd in commands:
        argv = shlex.split(cmd)[1:]
        for flag in ("--out", "--csv"):
            if flag in argv:
                i = argv.index(flag) + 1
                argv[i] = str(again / argv[i].rsplit("/", 1)[-1])
        assert main(argv) == 0, (cmd, capsys.readouterr().err)
        ran.add(argv[0])
        if argv[0] == "capture":
            name = argv[argv.index("--out") + 1].rsplit("/", 1)[-1]
            mine, theirs = load(again / name), load(out / name)
            assert [r.ids for r in mine.inputs] == [r.ids for r in theirs.inputs], cmd
            for site in theirs.sites:
                torch.testing.assert_close(mine.weights(site.name, 0), theirs.weights(site, 0), atol=0, rtol=0)
    return ran


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_a_generated_runs_variant_is_reproduced_with_its_own_output(name, tmp_path, capsys):
    """``debug --generate N --variant``: the variant generates its own output (here another one than the
    original's), saved as ``output-NAME.txt``; every report command reproduces the run's captures exactly.
    GPT-2's generated text starts with a word piece and T5's stops at N tokens without its end token, so
    neither tokenizes back to the generated ids: their commands generate again (greedy, the same ids)."""
    loaded = _saved(name, tmp_path / "model")
    out = tmp_path / "run"
    inv = investigate(loaded, SOURCE, Question(query="indemnify", referents=("Lessee", "Lessor")), Output.of(generate=8), variants={"quoted": QUOTED}, out_dir=out)
    original, variant = (out / "output.txt").read_text(), (out / "output-quoted.txt").read_text()
    assert original != variant  # the variant's own output, not the original's
    assert variant == load(out / "variant-quoted.safetensors").records("target").text
    captures = [c for c in inv.command_lines if c.startswith("inspector capture")]
    assert len(captures) == 2 and "output.txt" not in captures[1]
    again = tmp_path / "again"
    again.mkdir()
    assert {"capture", "rank", "split", "compare"} <= _rerun(inv.command_lines, out, again, capsys)
    assert (out / "report.html").read_text().count("inspector capture") == 2


def test_given_output_and_a_generated_text_that_tokenizes_back_point_at_their_files(tmp_path, capsys):
    """Where the output text tokenizes to the ids the run fed, the commands name its file: ``output.txt`` for
    an output given with ``output=``; a generated output whose text tokenizes back is named too."""
    loaded = _saved("gpt2", tmp_path / "model")
    out = tmp_path / "run"
    inv = investigate(loaded, SOURCE, Question(query="indemnify", referents=("Lessee", "Lessor")), Output.of("The Lessee pays."), variants={"quoted": QUOTED}, out_dir=out)
    captures = [c for c in inv.command_lines if c.startswith("inspector capture")]
    assert all(f"--output-file {out / 'output.txt'}" in c for c in captures), captures
    assert not (out / "output-quoted.txt").exists()  # nothing generated: the variant reads the same output
    again = tmp_path / "again"
    again.mkdir()
    _rerun(captures, out, again, capsys)
    inv = investigate(loaded, QUOTED, Question(query="indemnify", referents=("Lessee", "Lessor")), Output.of(generate=8), out_dir=tmp_path / "g")
    assert f"--output-file {tmp_path / 'g' / 'output.txt'}" in inv.command_lines[0]  # '£5 £5 ...' tokenizes back
    _rerun(inv.command_lines[:1], tmp_path / "g", again, capsys)


def test_a_head_without_an_edit_point_is_refused_naming_sites_that_can_be_edited():
    """BigBird-Pegasus on a short input runs its encoder through its own full attention (no edit point): the
    refusal names sites that can be edited on this input, each a real seam site whose heads ``ablate`` then
    edits, rather than pointing at a command that does not list what it says. An unknown name and a site that
    did not run are refused the same way."""
    from inspector.capture.inputs import encode
    from inspector.errors import InspectorError
    from inspector.intervene import effects as E
    from inspector.intervene import seam as S

    from helpers import block_local as t5

    model, tok = t5.bigbird("bigbird_pegasus"), tiny.tokenizer()
    long = S.run(model, encode(model, tok, t5.LONG[0], t5.TARGETS[0]))
    sparse = next(s.name for s in long.capture.sites if s.module_class == "BigBirdPegasusBlockSparseAttention")
    short = S.run(model, encode(model, tok, "Such indemnity survives.", "It pays."))
    editable = [s.name for s in short.capture.sites]
    for head, why in [(sparse, "no per-head edit point"), ("model.decoder.layers.9.self_attn", "not an attention site")]:
        with pytest.raises(InspectorError, match=why) as err:
            E.ablate(model, tok, "Such indemnity survives.", "It pays.", heads=[(head, 0)])
        message = str(err.value)
        assert "inspector info" not in message and f"the {len(editable)} sites that can be edited" in message
        named = message.split("e.g. ")[1].removesuffix(", ...").split(", ")
        assert named and set(named) <= set(editable)
        for site in named:  # what the message offers can be edited
            res = E.ablate(model, tok, "Such indemnity survives.", "It pays.", heads=[(site, 0)])
            assert not torch.equal(res.output.logits, res.before.logits)
    with pytest.raises(InspectorError, match="did not run in this pass") as err:
        S.run(model, encode(model, tok, "Such indemnity survives.", "It pays."), S.Seam(zero={sparse: [0]}))
    assert "inspector info" not in str(err.value) and editable[0] in str(err.value)


def test_a_value_norm_split_on_pegasus_x_says_the_query_sites_were_left_out(tmp_path, capsys):
    """Pegasus-X's encoder sites are captured through ``output_attentions`` (no value norms): a value-norm split
    whose query is only in the source leaves them out, and the decoder sites left do not hold the query. The
    refusal says so, with the fix, rather than "not in the target text"; ``compare`` likewise. With
    ``--weighting attention``, as it says, the split gives rows."""
    from inspector.capture.recorder import capture

    from helpers import pegasus_x as px

    model = px.pegasus_x()
    cap_path = str(capture(model, tiny.tokenizer(), px.TEXTS[0], px.TARGETS[0]).save(tmp_path / "px.safetensors"))
    split = ["split", cap_path, "--query", "indemnify", "--referents", "Lessee,Lessor"]
    compare = ["compare", cap_path, cap_path, "--query", "indemnify", "--referents", "Lessee,Lessor", "--names", "a,b"]
    for argv in (split, compare):
        assert main(argv + ["--weighting", "value-norm"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("inspector: error: no site gave a row: the query 'indemnify' is on the "
                                                   "query axis of 2 sites, left out of --weighting value-norm")
        assert "model.encoder.layers.0.self_attn" in err[0] and err[0].endswith("use --weighting attention")
        assert "not in the target text" not in err[0]
        assert main(argv + ["--csv", str(tmp_path / "out.csv")]) == 0
        capsys.readouterr()
