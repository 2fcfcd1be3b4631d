"""`inspector ablate`, `inspector effects` and the "Does it matter?" part of `debug`, end to end on tiny models."""

from __future__ import annotations

import shlex
from html import unescape

import pandas as pd
import pytest

from inspector.analysis.question import Question
from inspector.capture.models import LoadedModel
from inspector.capture.output import Output
from inspector.cli import main
from inspector.intervene import effects as E
from inspector.investigate.debug import investigate

import tiny
from conftest import LEGAL

OUTPUT = "The Lessor shall indemnify the Lessee."
QUOTED = 'The clause reads: "The Lessee shall indemnify the Lessor against all claims." Such indemnity survives.'


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("gpt2")
    tiny.build("gpt2").save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_effects_cli_writes_one_row_per_head(gpt2_dir, tmp_path, capsys, tokenizer):
    out = tmp_path / "effects.csv"
    code = main(["effects", "--model", str(gpt2_dir), "--source", LEGAL, "--output", OUTPUT, "--contrast", "Lessee,Lessor",
                 "--top", "3", "--csv", str(out)])
    assert code == 0, capsys.readouterr().err
    df = pd.read_csv(out)
    assert list(df.columns) == ["site", "stack", "kind", "layer", "head", "attribution", "effect"]
    assert len(df) == 2 * 4 and df["effect"].notna().sum() == 3 and df["effect"].iloc[:3].notna().all()
    api = E.effects(tiny.build("gpt2"), tokenizer, LEGAL, OUTPUT, contrast="Lessee,Lessor", top=3).table
    assert df["attribution"].tolist() == pytest.approx(api["attribution"].tolist(), abs=1e-7)
    assert "logit(Lessee) - logit(Lessor)" in capsys.readouterr().out


def test_ablate_cli_table_contrast_and_errors(gpt2_dir, tmp_path, capsys):
    out = tmp_path / "ablate.csv"
    code = main(["ablate", "--model", str(gpt2_dir), "--source", LEGAL, "--output", OUTPUT, "--heads",
                 "transformer.h.0.attn:1,transformer.h.1.attn:3", "--method", "mean", "--contrast", "Lessee,Lessor",
                 "--csv", str(out)])
    assert code == 0, capsys.readouterr().err
    df = pd.read_csv(out)
    assert list(df.columns) == ["position", "role", "token", "logprob_before", "logprob_after", "change"]
    assert set(df["role"]) == {"target"}
    printed = capsys.readouterr().out
    assert "before" in printed and "after" in printed and "change" in printed
    for argv, words in [
        (["--heads", "transformer.h.7.attn:0", "--output", OUTPUT], "not an attention site"),
        (["--heads", "transformer.h.0.attn", "--output", OUTPUT], "SITE:HEAD"),
        (["--heads", "transformer.h.0.attn:0"], "--output, or --generate"),
        (["--heads", "transformer.h.0.attn:0", "--output", OUTPUT, "--contrast", "Lessee"], "RIGHT,WRONG"),
    ]:
        assert main(["ablate", "--model", str(gpt2_dir), "--source", LEGAL] + argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("inspector: error:") and words in err[-1]


def test_ablate_cli_patch_and_generate(gpt2_dir, tmp_path, capsys):
    variant = tmp_path / "quoted.txt"
    variant.write_text(QUOTED)
    code = main(["ablate", "--model", str(gpt2_dir), "--source", LEGAL, "--generate", "4", "--heads", "transformer.h.1.attn:2",
                 "--patch-from", str(variant)])
    assert code == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "generated before:" in out and "generated after:" in out


def test_encoder_contrast_needs_a_query(tmp_path, capsys, tokenizer):
    model_dir = tmp_path / "bert"
    tiny.build("bert").save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    argv = ["effects", "--model", str(model_dir), "--source", LEGAL, "--contrast", "Lessee,Lessor", "--csv", str(tmp_path / "e.csv")]
    assert main(argv) == 2 and "--query WORD" in capsys.readouterr().err
    assert main(argv + ["--query", "indemnity", "--top", "2"]) == 0
    assert len(pd.read_csv(tmp_path / "e.csv")) == 2 * 3


def test_debug_does_it_matter(tokenizer, tmp_path):
    bart = LoadedModel(tiny.build("bart"), tokenizer, "tiny-bart")
    inv = investigate(bart, LEGAL, Question(query="indemnify", referents=("Lessee", "Lessor"), contrast="Lessee,Lessor", rule=_loose()), Output.of(OUTPUT), variants={"quoted": QUOTED}, out_dir=tmp_path, top=4)
    m = inv.matter
    flagged = {(r.site, r.head) for r in inv.flagged.itertuples()}
    assert flagged, "the loose rule flags some head"
    listed = set(zip(m.heads["site"], m.heads["head"], strict=True))
    assert flagged <= listed and len(listed) >= 4
    assert m.heads["effect"].notna().all() and m.heads["effect"].abs().is_monotonic_decreasing
    for r in m.heads.head(2).itertuples():  # the exact effect is that of a separate ablate run
        one = E.ablate(bart.model, tokenizer, LEGAL, OUTPUT, heads=[(r.site, r.head)], contrast="Lessee,Lessor")
        assert r.effect == pytest.approx(one.contrast["change"], abs=1e-6)
    patchable = m.heads[m.heads["site"].str.contains("decoder")]
    assert patchable["patch_effect[quoted]"].notna().all()
    r = m.heads.iloc[0]
    one = E.patch(bart.model, tokenizer, LEGAL, QUOTED, target=OUTPUT, heads=[(r["site"], int(r["head"]))], contrast="Lessee,Lessor")
    if r["site"].startswith("model.decoder"):
        assert r["patch_effect[quoted]"] == pytest.approx(one.contrast["change"], abs=1e-6)
    for name in ("effects.csv", "matter.csv", "patch.csv"):
        assert (tmp_path / name).is_file()
    html = (tmp_path / "report.html").read_text()
    assert html.index("Does it matter?") < html.index("<h2>Reproduce</h2>")
    # the report's command rebuilds effects.csv, matter.csv and patch.csv exactly as debug wrote them: the same
    # --top, the flagged heads confirmed too (more heads confirmed than --top), the variant patched in
    assert (tmp_path / "effects.csv").exists() and pd.read_csv(tmp_path / "effects.csv")["effect"].notna().sum() > 4
    cmd = next(c for c in inv.command_lines if c.startswith("inspector effects"))
    assert cmd in unescape(html)  # the report's "Reproduce" section shows it
    argv = shlex.split(cmd)[1:]
    again = tmp_path.parent / (tmp_path.name + "-again")
    again.mkdir()
    for opt, name in (("--csv", "effects.csv"), ("--matter-csv", "matter.csv"), ("--patch-csv", "patch.csv")):
        argv[argv.index(opt) + 1] = str(again / name)
    argv[argv.index("--model") + 1] = _saved(bart, tmp_path.parent / (tmp_path.name + "-model"))
    assert main(argv) == 0
    for name in ("effects.csv", "matter.csv", "patch.csv"):
        assert (again / name).read_text() == (tmp_path / name).read_text(), name


def _loose():
    from inspector.analysis import SplitRule

    return SplitRule(min_split=0.0, min_mass=0.0, min_lift=0.0)


def _saved(loaded, path) -> str:
    loaded.model.save_pretrained(path)
    loaded.tokenizer.save_pretrained(path)
    return str(path)


def test_report_section_escapes_every_string():
    from inspector.investigate.matter import Matter, render_section

    evil = "<script>alert(1)</script>"
    heads = pd.DataFrame([{"site": evil, "stack": "none", "kind": "self", "layer": 0, "head": 1, "flagged": True,
                           "attribution": 0.1, "effect": 0.2}])
    m = Matter(contrast=evil, definition=evil, metric=0.5, effects=heads, heads=heads,
               patches=pd.DataFrame([{"variant": evil, "heads": 1, "before": 0.0, "after": 1.0, "change": 1.0}]),
               disagreements=E._disagreements(heads.drop(columns=["flagged"]).assign(effect=-0.2)), top=1, notes=[evil])
    html = render_section(m)
    assert "<script>" not in html and html.count("&lt;script&gt;") >= 4
    assert html.startswith('<section id="does-it-matter">') and html.rstrip().endswith("</section>")


def test_a_wrong_word_only_in_the_prompt_is_named_so(tokenizer):
    """A decoder's contrast is measured where the output says WRONG: a WRONG word found only in the prompt
    gets a line that says so (not 'not in the text' with itself as the nearest word)."""
    from inspector.errors import InspectorError

    model = tiny.build("gpt2")
    with pytest.raises(InspectorError, match="in the prompt but not in the output"):
        E.effects(model, tokenizer, "The Lessee shall indemnify the Lessor", "the tenant pays", contrast="Lessee,Lessor")


def test_effects_matter_options_refused_before_the_model_loads(tmp_path, capsys):
    base = ["effects", "--model", str(tmp_path / "no-such-model"), "--source", LEGAL, "--output", OUTPUT,
            "--contrast", "Lessee,Lessor", "--csv", str(tmp_path / "e.csv")]
    for argv, words in [
        (["--confirm", "transformer.h.0.attn"], "--confirm takes SITE:HEAD"),
        (["--confirm", "transformer.h.0.attn:²"], "--confirm takes SITE:HEAD"),
        (["--patch-csv", str(tmp_path / "p.csv")], "give --variant NAME=FILE"),
        (["--variant", "quoted"], "--variant takes NAME=FILE"),
        (["--variant", f"q={tmp_path / 'missing.txt'}"], "missing.txt"),
    ]:
        assert main(base + argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("inspector: error:") and words in err[0], err


def test_reproduce_rebuilds_matter_files_without_an_lm_head(tokenizer, tmp_path):
    """An encoder without an LM head: the contrast reads the query word (its occurrence too) and the patch
    aligns the query's tokens; the report's command still rewrites the three files exactly."""
    bert = LoadedModel(tiny.build("bert"), tokenizer, "tiny-bert")
    quoted = 'It reads: "The Lessee shall indemnify the Lessor." The Lessee shall indemnify the Lessor again.'
    source = LEGAL + " The Lessee shall indemnify the Lessor again."
    out = tmp_path / "run"
    inv = investigate(bert, source, Question(query="indemnify", referents=("Lessee", "Lessor"), occurrence=2, contrast="Lessee,Lessor", rule=_loose()), variants={"quoted": quoted}, out_dir=out, top=2)
    cmd = next(c for c in inv.command_lines if c.startswith("inspector effects"))
    assert "--query indemnify --occurrence 2" in cmd and "--confirm" in cmd and "--variant" in cmd
    argv = shlex.split(cmd)[1:]
    again = tmp_path / "again"
    again.mkdir()
    for opt, name in (("--csv", "effects.csv"), ("--matter-csv", "matter.csv"), ("--patch-csv", "patch.csv")):
        argv[argv.index(opt) + 1] = str(again / name)
    argv[argv.index("--model") + 1] = _saved(bert, tmp_path / "model")
    assert main(argv) == 0
    for name in ("effects.csv", "matter.csv", "patch.csv"):
        assert (again / name).read_text() == (out / name).read_text(), name
