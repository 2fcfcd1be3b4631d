"""Capture: run a model and record, per attention call, the queries, keys, values and weights it computed.

* :mod:`~inspector.capture.recorder`: the recording attention function registered in transformers'
  ``AttentionInterface`` (the seam), :func:`capture` and :func:`record`;
* :mod:`~inspector.capture.inputs`: tokenization with offsets, special and padding flags, pairs, targets;
* :mod:`~inspector.capture.models`: loading a model by folder or Hub id, offline first;
* :mod:`~inspector.capture.value_norm`: each site's output projection and ``||v_j W_O^h||``;
* :mod:`~inspector.capture.generation`: generating an output to capture.

Imports :mod:`inspector.store` only. The names of :mod:`~inspector.capture.recorder` are importable from
here (``from inspector.capture import capture``); torch is imported when one is first used.
"""

from __future__ import annotations

import importlib

__all__ = ["IMPL", "attn_implementation", "capture", "probability_maps", "record", "site_patterns"]

_SUBMODULES = {"recorder", "inputs", "models", "value_norm", "generation"}


def __getattr__(name: str):
    if name.startswith("__") or name in _SUBMODULES:
        raise AttributeError(name)  # a submodule not yet imported: the import system loads it
    recorder = importlib.import_module("inspector.capture.recorder")
    try:
        return getattr(recorder, name)
    except AttributeError:
        raise AttributeError(f"module 'inspector.capture' has no attribute {name!r}") from None
