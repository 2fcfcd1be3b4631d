"""Capture: run a model and record, per attention call, the queries, keys, values and weights it computed.

* :mod:`~inspector.capture.interface`: the attention function registered in transformers'
  ``AttentionInterface`` (the seam) and the context managers that point a model at it;
* :mod:`~inspector.capture.recorder`: the recorder behind the seam, :func:`capture` and :func:`record`;
* :mod:`~inspector.capture.output`: what the model said (:class:`~inspector.capture.output.Output`);
* :mod:`~inspector.capture.options`: what a capture records (:class:`~inspector.capture.options.CaptureOptions`);
* :mod:`~inspector.capture.banded`: long-document attention read from the model and moved to tokens;
* :mod:`~inspector.capture.inputs`: tokenization with offsets, special and padding flags, pairs, targets;
* :mod:`~inspector.capture.models`: loading a model by folder or Hub id, offline first;
* :mod:`~inspector.capture.value_norm`: each site's output projection and ``||v_j W_O^h||``;
* :mod:`~inspector.capture.generation`: generating an output to capture.

Imports :mod:`inspector.store` only. The names of :mod:`~inspector.capture.recorder` are importable from
here (``from inspector.capture import capture``); torch is imported when one is first used. The package is
callable: ``inspector.capture(model, tokenizer, text)`` is :func:`~inspector.capture.recorder.capture`, while
``import inspector.capture as c`` still gives the package.
"""

from __future__ import annotations

import importlib
import sys
import types

__all__ = ["IMPL", "attn_implementation", "capture", "probability_maps", "record", "site_patterns"]

_SUBMODULES = {"recorder", "inputs", "models", "value_norm", "generation", "interface", "output", "banded"}


def __getattr__(name: str):
    if name.startswith("__") or name in _SUBMODULES:
        raise AttributeError(name)  # a submodule not yet imported: the import system loads it
    recorder = importlib.import_module("inspector.capture.recorder")
    try:
        return getattr(recorder, name)
    except AttributeError:
        raise AttributeError(f"module 'inspector.capture' has no attribute {name!r}") from None


class _CallablePackage(types.ModuleType):
    """The package's type: calling it calls :func:`inspector.capture.recorder.capture`."""

    def __call__(self, *args, **kwargs):
        return importlib.import_module("inspector.capture.recorder").capture(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
