"""`inspector attribute` and `inspector routes`, end to end on a tiny GPT-2 saved to a folder: the files
hold what the API returns; mistakes are one line, exit 2, before the model loads."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from inspector.cli import main
from inspector.intervene.attribution import attribute
from inspector.intervene.routes import EDGE_COLUMNS, routes

import tiny
from conftest import LEGAL

OUTPUT = "The Lessor shall indemnify the Lessee."


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("gpt2")
    tiny.build("gpt2").save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_attribute_cli_equals_the_api(gpt2_dir, tmp_path, capsys, tokenizer):
    out = tmp_path / "attr.csv"
    code = main(["attribute", "--model", str(gpt2_dir), "--source", LEGAL, "--output", OUTPUT, "--contrast", "Lessee,Lessor",
                 "--methods", "input_x_gradient,rollout", "--csv", str(out)])
    assert code == 0, capsys.readouterr().err
    df = pd.read_csv(out, keep_default_na=False)
    api = attribute(tiny.build("gpt2"), tokenizer, LEGAL, OUTPUT, contrast="Lessee,Lessor", methods=["input_x_gradient", "rollout"])
    assert df["input_x_gradient"].tolist() == pytest.approx(api["input_x_gradient"].tolist(), abs=1e-7)
    assert "logit(Lessee) - logit(Lessor)" in capsys.readouterr().out


def test_routes_cli_writes_csv_and_json(gpt2_dir, tmp_path, capsys, tokenizer):
    csv, js = tmp_path / "r.csv", tmp_path / "r.json"
    code = main(["routes", "--model", str(gpt2_dir), "--source", LEGAL, "--output", OUTPUT, "--contrast", "Lessee,Lessor",
                 "--csv", str(csv), "--json", str(js)])
    assert code == 0, capsys.readouterr().err
    df = pd.read_csv(csv, keep_default_na=False)
    assert list(df.columns) == EDGE_COLUMNS
    api = routes(tiny.build("gpt2"), tokenizer, LEGAL, OUTPUT, contrast="Lessee,Lessor")
    assert len(df) == len(api) and df["importance"].tolist() == pytest.approx(api["importance"].tolist(), abs=1e-7)
    assert len(json.loads(js.read_text())["edges"]) == len(df)


@pytest.mark.parametrize("argv, message", [
    (["routes", "--source", "x", "--contrast", "Lessee"], "--contrast takes two different words"),
    (["routes", "--source", "x", "--threshold", "1.5"], "--threshold"),
    (["attribute", "--source", "x", "--methods", "saliency"], "unknown --methods"),
])
def test_mistakes_before_loading(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "loading model" not in err
