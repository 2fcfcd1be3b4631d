"""What a capture records: one frozen value (:class:`CaptureOptions`) taken by :func:`~inspector.capture.recorder.capture`
and :func:`~inspector.capture.recorder.record`, and written to the capture file's header under ``options``."""

from __future__ import annotations

from dataclasses import dataclass

from inspector.errors import InspectorError
from inspector.store.schema import STORAGE_DTYPES


@dataclass(frozen=True)
class CaptureOptions:
    """What one capture records.

    ``weights``: store the attention weights (a *full* capture) or only Q, K, V and the masks they are recomputed
    from exactly on demand (a *lazy* capture, ``False``). ``dtype``: the storage dtype of the tensors, one of
    :data:`~inspector.store.schema.STORAGE_DTYPES`. ``layers``: layer indices to record (None: all).
    ``sites``: regular expressions over site names (None: all). ``value_norms``: store ``||v_j W_O^h||`` per key
    and head (Kobayashi et al. 2020). ``global_tokens``: words or ``@i`` token indices of the source marked as
    global tokens of LED / Longformer (``global_attention_mask``). ``progress``: show a progress bar.

    Raises :class:`InspectorError` for an unknown dtype, a negative layer or an empty site pattern list entry.
    Lists are kept as tuples (the value is hashable and cannot change under a caller)."""

    weights: bool = True
    dtype: str = "float32"
    layers: tuple[int, ...] | None = None
    sites: tuple[str, ...] | None = None
    value_norms: bool = True
    global_tokens: tuple[str, ...] | None = None
    progress: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in STORAGE_DTYPES:
            raise InspectorError(f"unknown storage dtype {self.dtype!r}: use one of {', '.join(STORAGE_DTYPES)}")
        for name in ("layers", "sites", "global_tokens"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple([value] if isinstance(value, (str, int)) else value))
        if self.layers is not None and any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in self.layers):
            raise InspectorError(f"layers are whole numbers from 0, got {list(self.layers)!r}")

    def header(self) -> dict:
        """The ``options`` entry of the capture file's header (JSON: lists, not tuples)."""
        out = {"weights": self.weights, "dtype": self.dtype,
               "layers": list(self.layers) if self.layers is not None else None,
               "sites": list(self.sites) if self.sites is not None else None, "value_norms": self.value_norms}
        if self.global_tokens:
            out["global"] = list(self.global_tokens)
        return out
