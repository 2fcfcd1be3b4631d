"""The scan's model and engine as values (issue 43): :class:`~inspector.corpus.engine.ModelSpec` and
:class:`~inspector.corpus.engine.Engine` refuse what does not go together when made, in one line naming the fix,
and the scan and the evaluation scan refuse loose settings in their place."""

from __future__ import annotations

import sys

import pytest

from inspector.corpus.engine import Engine, ModelSpec
from inspector.errors import InspectorError


@pytest.mark.parametrize("kwargs, said", [
    ({"batch_size": 0}, "--batch-size must be at least 1, not 0"),
    ({"batch_size": 1.5}, "--batch-size must be a whole number"),
    ({"batch_size": True}, "--batch-size must be a whole number"),
    ({"workers": 0}, "--workers must be a whole number of at least 1"),
    ({"kind": "spark"}, "unknown engine 'spark': use local or ray"),
    ({"address": "auto"}, "--ray-address needs --engine ray"),
    ({"kind": "ray", "num_cpus": 0}, "num_cpus"),
    ({"prefetch": "yes"}, "prefetch must be True, False or None"),
])
def test_an_engine_that_does_not_go_together_is_one_line(kwargs, said):
    with pytest.raises(InspectorError, match=said) as caught:
        Engine(**kwargs)
    assert "\n" not in str(caught.value)


def test_an_engine_keeps_whole_numbers_as_ints():
    np = pytest.importorskip("numpy")
    e = Engine("ray", batch_size=np.int64(4), workers=np.int64(2), address="auto", num_cpus=np.int64(3))
    assert (e.batch_size, e.workers, e.num_cpus) == (4, 2, 3) and all(
        type(v) is int for v in (e.batch_size, e.workers, e.num_cpus))


@pytest.mark.parametrize("kwargs, said", [
    ({"name": ""}, "the model name is empty"),
    ({"name": 3}, "the model must be a folder, a Hub id or None"),
    ({"device": ""}, "the device must be a name"),
    ({"trust_remote_code": "no"}, "trust_remote_code must be True or False"),
])
def test_a_model_spec_that_cannot_name_a_model_is_one_line(kwargs, said):
    with pytest.raises(InspectorError, match=said):
        ModelSpec(**kwargs)


def test_a_model_folder_is_kept_as_an_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    monkeypatch.chdir(tmp_path)
    assert ModelSpec("m").name == str((tmp_path / "m").resolve())
    assert ModelSpec(tmp_path / "m").name == str((tmp_path / "m").resolve())
    assert ModelSpec("owner/hub-id").name == "owner/hub-id"  # not a path here: left as the Hub id
    assert ModelSpec().label == "embedded all-MiniLM-L6-v2"


def test_the_values_import_neither_torch_nor_pandas():
    import subprocess

    code = ("import sys, inspector.corpus.engine as e; e.Engine('ray', workers=2); e.ModelSpec(); "
            "print(','.join(m for m in ('torch', 'pandas', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_scan_and_evaluate_refuse_loose_settings(tmp_path):
    from inspector.corpus.scan import scan
    from inspector.investigate.evaluation import Evaluation, evaluate

    data = tmp_path / "c.jsonl"
    data.write_text('{"id": "a", "text": "x"}\n')
    with pytest.raises(InspectorError, match=r"model=ModelSpec\(...\) and engine=Engine"):
        scan(data, tmp_path / "out", model="some/model", progress=False)
    with pytest.raises(InspectorError, match=r"model=ModelSpec\(...\) and engine=Engine"):
        evaluate(data, tmp_path / "ev", Evaluation(right_field="r", wrong_field="w"), engine="ray", progress=False)
    assert not (tmp_path / "out").exists() and not (tmp_path / "ev").exists()
