"""inspector: capture and inspect the attention of Hugging Face transformer models.

    >>> import inspector
    >>> lm = inspector.load_model()                      # embedded all-MiniLM-L6-v2
    >>> cap = inspector.capture(lm.model, lm.tokenizer, "The Lessee shall indemnify the Lessor.")
    >>> cap.save("run.safetensors")
    >>> inspector.rank_heads(inspector.load("run.safetensors"))
"""

from .analysis import LabelRule, SplitRule, rank_heads, split_heads
from .capture import capture, record
from .errors import InspectorError
from .explain import explain
from .measure import ablate, effects, patch
from .models import load_model
from .store import Capture, Site, load, save

__all__ = [
    "Capture", "InspectorError", "LabelRule", "Site", "SplitRule", "capture", "explain", "load", "load_model",
    "rank_heads", "record", "save", "split_heads",
    "ablate", "effects", "patch",
]
__version__ = "0.1.0"
