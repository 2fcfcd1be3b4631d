"""The bottom stage: what a capture is and how it is kept.

* :mod:`~inspector.store.schema`: :class:`Site` (one attention call) and :class:`InputRecord` (one role's tokens);
* :mod:`~inspector.store.capture_file`: :class:`Capture` and the safetensors file format (``load``, ``save``);
* :mod:`~inspector.store.masks`: compact mask specs, expanded on demand;
* :mod:`~inspector.store.validate`: every header field and every row read is checked;
* :mod:`~inspector.store.attention`: the seed's attention math, which a lazy capture recomputes weights with;
* :mod:`~inspector.store.files`: atomic writes for every file inspector writes.

Nothing here imports another stage of inspector.
"""

from inspector.store.capture_file import Capture, check_replaceable, is_capture_file, load, save
from inspector.store.schema import InputRecord, Site

__all__ = ["Capture", "InputRecord", "Site", "check_replaceable", "is_capture_file", "load", "save"]
