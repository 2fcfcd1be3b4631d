"""The evaluation scan on Ray (issue 41): ``scan --engine ray`` with a contrast per document gives the local engine's
rows, on the trained decoder fixture, a local Ray instance on 127.0.0.1 started by the test and stopped after it."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from inspector.corpus import verdicts
from inspector.corpus.documents import Fields
from inspector.corpus.engine import Engine, ModelSpec
from inspector.investigate.evaluation import Evaluation, evaluate

import groundtruth as gt

DECODER = gt.PARTIES / "decoder"


def _read(out):
    docs, heads = verdicts.read_evaluation(out)
    docs = docs.drop(columns=["part"]).sort_values("row", kind="stable").reset_index(drop=True)
    heads = heads.sort_values(["id", "site", "head"], kind="stable").reset_index(drop=True)
    return docs, heads


def test_ray_rows_equal_local_rows(tmp_path):
    try:
        import ray
    except ImportError:
        pytest.skip("Ray is not installed (pip install -e .[ray])")
    from inspector.capture.models import load_model

    items = gt.heldout("decoder")["items"]
    rows = [x for x in items if not x["right"]][:4] + [x for x in items if x["right"]][:3]
    rows.append({**rows[-1], "id": "empty", "prompt": ""})  # a document the model cannot read, recorded on Ray too
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fields = Fields(text="prompt", target="answer", id="id")
    ev = Evaluation(right_field="gold", wrong_field="wrong", reference_field="gold", top=12)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        evaluate(data, tmp_path / "local", ev, fields=fields, engine=Engine(batch_size=3), loaded=load_model(str(DECODER)),
                 progress=False)
    finally:
        torch.set_num_threads(before)
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False, configure_logging=False)
    try:
        result = evaluate(data, tmp_path / "ray", ev, model=ModelSpec(str(DECODER)),
                          engine=Engine("ray", batch_size=3, workers=1), fields=fields, progress=False)
    finally:
        ray.shutdown()
    assert (result.scanned, result.errors) == (8, 1)
    (a, ha), (b, hb) = _read(tmp_path / "local"), _read(tmp_path / "ray")
    pd.testing.assert_frame_equal(a, b, check_exact=False, atol=1e-5, rtol=1e-5)
    pd.testing.assert_frame_equal(ha, hb, check_exact=False, atol=1e-5, rtol=1e-5)
    assert (b["culprit_site"].notna()).sum() == 4
