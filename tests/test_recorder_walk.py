"""A capture walks the model's module tree once (issue 30: the per-document cost of a scan).

The recorder listed the modules five times per forward pass (names, configs twice, the training check,
the unrecorded-module check; the value norms a sixth): on a short document, as costly as the attention it
records. Now :class:`~inspector.capture.recorder.Recorder` walks it once and every step reads that walk.
"""

from __future__ import annotations

import sys

import pytest
import torch

import tiny


def _walks_from_inspector(monkeypatch, model) -> list[str]:
    """Record each ``named_modules`` walk of ``model`` (the root) that inspector's code starts (``modules()``
    goes through ``named_modules``; torch's and transformers' own walks, e.g. ``parameters()``, are not counted)."""
    calls: list[str] = []
    original = torch.nn.Module.named_modules

    def counted(self, *args, **kwargs):
        if self is model:
            frame = sys._getframe(1)
            for _ in range(3):  # the caller, or the caller of modules() / named_parameters()
                name = frame.f_globals.get("__name__", "")
                if name.startswith("inspector"):
                    calls.append(f"{name}:{frame.f_code.co_name}")
                    break
                if name.startswith("transformers") or frame.f_back is None:
                    break
                frame = frame.f_back
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "named_modules", counted)
    return calls


@pytest.mark.parametrize("value_norms", [False, True])
def test_a_capture_walks_the_module_tree_once(monkeypatch, value_norms):
    from inspector.capture.recorder import capture

    model = tiny.build("bert")
    calls = _walks_from_inspector(monkeypatch, model)
    cap = capture(model, tiny.tokenizer(), "The Lessor shall indemnify the Lessee.", value_norms=value_norms)
    assert cap.sites  # the capture ran
    assert len(calls) == 1, calls


def test_the_walk_still_finds_a_module_that_bypasses_the_interface(monkeypatch):
    """The unrecorded-module check reads the same walk: an attention module whose calls never reach the
    interface is still captured weights-only (by name), as before."""
    from inspector.capture import recorder

    model = tiny.build("bert")
    rec = recorder.Recorder(model, weights=False, dtype=torch.float32, layers=None, sites=None, roles={})
    names = [n for n, _ in recorder._unrecorded_modules(rec)]  # no call was recorded: every leaf attention module
    want = [n for n, m in model.named_modules() if recorder._ATTENTION_CLASS.search(type(m).__name__)
            and not any(recorder._ATTENTION_CLASS.search(type(c).__name__) for c in list(m.modules())[1:])]
    assert names == want and len(names) == model.config.num_hidden_layers
