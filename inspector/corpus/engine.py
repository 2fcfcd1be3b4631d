"""The scan's model and engine as values: :class:`ModelSpec` (which model, on which device) and :class:`Engine`
(where the documents are reduced: in this process or on Ray actors, how many at a time, by how many workers).

Both are frozen and checked when made (one-line :class:`~inspector.errors.InspectorError` naming the fix), so a
scan (:func:`inspector.corpus.scan.scan`), the evaluation scan (:func:`inspector.investigate.evaluation.evaluate`)
and the Ray engine (:mod:`inspector.corpus.ray_engine`) receive settings that already go together; the command
line builds each once from its flags. This module imports neither torch nor pandas: the command line builds the
values before they load (issue 28).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, replace
from pathlib import Path

from inspector.errors import InspectorError

ENGINES = ("local", "ray")


def _whole(value, what: str) -> int:
    """``value`` as an int if it is a whole number of at least 1 (not a bool), else one line naming ``what``."""
    try:
        n = operator.index(value) if not isinstance(value, bool) else None
    except TypeError:
        n = None
    if n is None or n < 1:
        raise InspectorError(f"{what} must be a whole number of at least 1, not {value!r}")
    return int(n)


def check_workers(workers) -> int:
    """``workers`` as an int (a NumPy integer too) if it is a whole number of at least 1, else
    :class:`InspectorError` naming the fix."""
    return _whole(workers, "--workers")


@dataclass(frozen=True)
class ModelSpec:
    """The model a scan loads: ``name`` a local folder (kept as an absolute path, the same from any directory or Ray
    worker), a Hub id, or None for the embedded all-MiniLM-L6-v2; ``device`` where it runs (None: the CPU, or where
    :func:`~inspector.capture.models.load_model` puts it); ``trust_remote_code`` allows the model's own Python
    code."""

    name: str | None = None
    device: str | None = None
    trust_remote_code: bool = False

    def __post_init__(self):
        if self.name is not None and not isinstance(self.name, str):
            if not hasattr(self.name, "__fspath__"):
                raise InspectorError(f"the model must be a folder, a Hub id or None (the embedded model), "
                                     f"not {type(self.name).__name__}")
            object.__setattr__(self, "name", str(self.name))
        if self.name is not None and not self.name.strip():
            raise InspectorError("the model name is empty: give a model folder or Hub id, or None for the embedded model")
        if self.device is not None and (not isinstance(self.device, str) or not self.device.strip()):
            raise InspectorError(f"the device must be a name such as cpu or cuda, not {self.device!r}")
        if not isinstance(self.trust_remote_code, bool):
            raise InspectorError(f"trust_remote_code must be True or False, not {self.trust_remote_code!r}")
        if self.name is not None and Path(self.name).expanduser().exists():
            object.__setattr__(self, "name", str(Path(self.name).expanduser().resolve()))

    @property
    def label(self) -> str:
        """How the status line names the model while it loads."""
        return self.name or "embedded all-MiniLM-L6-v2"

    def on(self, device: str | None) -> ModelSpec:
        """The same model on ``device``."""
        return replace(self, device=device)

    def load(self):
        """The :class:`~inspector.capture.models.LoadedModel` (:func:`~inspector.capture.models.load_model`)."""
        from inspector.capture.models import load_model

        return load_model(self.name, device=self.device, trust_remote_code=self.trust_remote_code)


@dataclass(frozen=True)
class Engine:
    """Where a scan reduces its documents, and how: ``kind`` ``local`` (this process) or ``ray`` (Ray Data actors,
    :mod:`inspector.corpus.ray_engine`); ``batch_size`` documents per forward pass, on either engine; ``workers`` the
    Ray actors, or the local engine's worker threads (None: the engine's default); ``address`` a Ray cluster to
    join (``ray`` only; None: a local Ray instance); ``num_cpus`` the CPUs a local Ray instance uses (None: all);
    ``prefetch`` whether a local engine of one worker captures the next batch while it analyses this one (None: on
    a GPU only; :func:`~inspector.corpus.reduce.local_batches`)."""

    kind: str = "local"
    batch_size: int = 8
    workers: int | None = None
    address: str | None = None
    num_cpus: int | None = None
    prefetch: bool | None = None

    def __post_init__(self):
        try:
            size = operator.index(self.batch_size) if not isinstance(self.batch_size, bool) else None
        except TypeError:
            size = None
        if size is None:
            raise InspectorError(f"--batch-size must be a whole number of at least 1, not {self.batch_size!r}")
        if size < 1:
            raise InspectorError(f"--batch-size must be at least 1, not {size}")
        object.__setattr__(self, "batch_size", int(size))
        if self.workers is not None:
            object.__setattr__(self, "workers", check_workers(self.workers))
        if self.kind not in ENGINES:
            raise InspectorError(f"unknown engine {self.kind!r}: use local or ray")
        if self.address is not None and not isinstance(self.address, str):
            raise InspectorError(f"--ray-address must be an address such as ray://head:10001 or auto, not {self.address!r}")
        if self.address and self.kind != "ray":
            raise InspectorError("--ray-address needs --engine ray")
        if self.num_cpus is not None:
            object.__setattr__(self, "num_cpus", _whole(self.num_cpus, "num_cpus (the CPUs of a local Ray instance)"))
        if self.prefetch is not None and not isinstance(self.prefetch, bool):
            raise InspectorError(f"prefetch must be True, False or None (the default for the device), not {self.prefetch!r}")
