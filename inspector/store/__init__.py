"""The bottom stage: what a capture is and how it is kept.

* :mod:`~inspector.store.schema`: :class:`Site` (one attention call) and :class:`InputRecord` (one role's tokens);
* :mod:`~inspector.store.capture_file`: :class:`Capture` and the safetensors file format (``load``, ``save``);
* :mod:`~inspector.store.masks`: compact mask specs, expanded on demand;
* :mod:`~inspector.store.validate`: every header field and every row read is checked;
* :mod:`~inspector.store.attention`: the seed's attention math, which a lazy capture recomputes weights with;
* :mod:`~inspector.store.files`: atomic writes for every file inspector writes;
* :mod:`~inspector.store.band`: banded and block-local attention stored compactly;
* :mod:`~inspector.store.display`: the notebook display (``_repr_html_``) of captures, sites and explanations;
* :mod:`~inspector.store.header`: a capture file's header read with json alone (checks before torch loads);
* :mod:`~inspector.store.specs`: the torch-free rules of the command line's specs (contrast, referents, heads, sites);
* :mod:`~inspector.store.words`: the one word matcher and token-index parser.

Nothing here imports another stage of inspector.
"""

from __future__ import annotations

import importlib

# the API names, from their modules when first used: importing a light module of this stage (schema, files)
# does not import torch
_NAMES = {"Capture": "capture_file", "check_replaceable": "capture_file", "is_capture_file": "capture_file",
          "load": "capture_file", "save": "capture_file", "InputRecord": "schema", "Site": "schema"}
__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(importlib.import_module(f"inspector.store.{_NAMES[name]}"), name)
    raise AttributeError(f"module 'inspector.store' has no attribute {name!r}")
