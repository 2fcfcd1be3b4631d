"""inspector: capture and inspect the attention of Hugging Face transformer models.

    >>> import inspector
    >>> lm = inspector.load_model()                      # embedded all-MiniLM-L6-v2
    >>> cap = inspector.capture(lm.model, lm.tokenizer, "The Lessee shall indemnify the Lessor.")
    >>> cap.save("run.safetensors")
    >>> inspector.rank_heads(inspector.load("run.safetensors"))

The package is a stack of stages, each a sub-package that imports only the ones below it (checked by the
import-linter contract in ``pyproject.toml``; docs/development.md, "Layout")::

    cli -> investigate -> ui -> corpus -> attribute -> intervene -> analysis -> capture -> store -> errors

``import inspector`` is light: torch, transformers and pandas are imported when a name below is first used.
"""

from __future__ import annotations

import importlib

# ``inspector.capture`` is the sub-package, and calling it captures (see inspector/capture/__init__.py), so
# ``inspector.capture(model, tokenizer, text)`` and ``import inspector.capture as c`` both mean what they say
# likewise ``inspector.attribute``: the sub-package, and calling it attributes (see inspector/attribute/__init__.py)
from inspector import (
    attribute,  # noqa: F401  (part of the API)
    capture,  # noqa: F401  (part of the API)
)
from inspector.errors import InspectorError  # noqa: F401  (part of the API)

_API = {
    "Capture": "inspector.store", "Site": "inspector.store", "InputRecord": "inspector.store",
    "load": "inspector.store", "save": "inspector.store",
    "capture": "inspector.capture.recorder", "record": "inspector.capture.recorder",
    "load_model": "inspector.capture.models",
    "LabelRule": "inspector.analysis", "SplitRule": "inspector.analysis",
    "rank_heads": "inspector.analysis", "split_heads": "inspector.analysis",
    "explain": "inspector.analysis.explain",
    "ablate": "inspector.intervene.effects", "effects": "inspector.intervene.effects",
    "patch": "inspector.intervene.effects",
    "routes": "inspector.attribute.routes",
    "sources": "inspector.attribute.sources", "decompose": "inspector.attribute.score_parts",
    "Question": "inspector.analysis.question", "Output": "inspector.capture.output",
    "investigate": "inspector.investigate.debug",
}
_MODULES = {"show": "inspector.ui.show"}

__all__ = sorted([*_API, *_MODULES, "InspectorError", "attribute"])
__version__ = "0.2.0"


def __getattr__(name: str):
    if name in _API:
        value = getattr(importlib.import_module(_API[name]), name)
    elif name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    else:
        raise AttributeError(f"module 'inspector' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
