"""Every pass inspector runs puts the model in evaluation mode and gives back each module's own mode.

``model.train(flag)`` sets every module alike, so a model whose modules were in a mix of modes (a layer being
fine-tuned, a frozen block kept in eval) came back with all of them in one mode: after ``capture`` a submodule in
training mode was left in eval, and after an ablation or an attribution of a model in training mode its frozen
blocks were put in training mode. :func:`inspector.capture.interface.eval_mode` restores each flag."""

from __future__ import annotations

import pytest

from inspector.attribute.attribution import attribute
from inspector.attribute.sources import SourcesOptions, sources
from inspector.capture import capture
from inspector.intervene.effects import ablate

import tiny

SOURCE = "The Lessee shall indemnify the Lessor. The rent is due monthly."
SAID = "The Lessor shall indemnify the Lessee."
CALLS = {
    "capture": lambda m, t: capture(m, t, SOURCE, SAID),
    "ablate": lambda m, t: ablate(m, t, SOURCE, SAID, heads=[("model.decoder.layers.0.encoder_attn", 0)],
                                  contrast="Lessee,Lessor"),
    "attribute": lambda m, t: attribute(m, t, SOURCE, SAID, contrast="Lessee,Lessor", methods=("input_x_gradient",)),
    "sources": lambda m, t: sources(m, t, SOURCE, SAID, options=SourcesOptions(ablations=16, holdout=0, baselines=False)),
}


def _mixed(root_training: bool):
    """A tiny BART in a mix of modes: the root in ``root_training``, one encoder layer in the other mode."""
    model = tiny.build("bart")
    model.train(root_training)
    model.model.encoder.layers[0].train(not root_training)
    return model


@pytest.mark.parametrize("root_training", [False, True], ids=["eval, one layer training", "training, one layer eval"])
@pytest.mark.parametrize("name", list(CALLS))
def test_each_module_keeps_its_own_mode(tokenizer, name, root_training):
    model = _mixed(root_training)
    before = {n: m.training for n, m in model.named_modules()}
    seen: list[bool] = []
    hook = model.model.encoder.layers[0].register_forward_pre_hook(lambda mod, args: seen.append(mod.training))
    CALLS[name](model, tokenizer)
    hook.remove()
    assert seen and not any(seen), "the pass ran with a module in training mode (dropout on)"
    assert {n: m.training for n, m in model.named_modules()} == before
