"""The model ``--model`` names: its ``config.json`` read before torch loads (issue 28), the checks made
against it, and the model loaded."""

from __future__ import annotations

import sys
from pathlib import Path

from inspector.cli.printing import status
from inspector.errors import InspectorError


def load_from_args(args):
    """The model ``--model`` names, loaded. A local path that is no model folder is refused first, in one line
    (:func:`model_config`); the ``loading model`` line goes before the load only on a terminal, else after it
    (an error while loading is then the one line on standard error)."""
    import time

    from inspector.capture.models import load_model

    model_config(getattr(args, "model", None))
    name = args.model or "embedded all-MiniLM-L6-v2"
    tty = _stderr_is_tty()
    if tty:
        status(f"loading model {name} ...")
    t0 = time.perf_counter()
    loaded = load_model(args.model, device=getattr(args, "device", None), device_map=getattr(args, "device_map", None),
                        trust_remote_code=getattr(args, "trust_remote_code", False))
    if not tty:
        status(f"loading model {name} ... done in {time.perf_counter() - t0:.1f} s")
    return loaded


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def looks_like_path(name: str) -> bool:
    """``--model`` names a local folder (not a Hub id): it starts with ``.``, ``/`` or ``~``, holds the platform's
    own separator (where that is not ``/``, which Hub ids hold), or is an existing path."""
    import os

    return (name.startswith((".", "/", "~")) or (os.sep != "/" and os.sep in name)
            or (os.altsep is not None and os.altsep != "/" and os.altsep in name) or Path(name).expanduser().exists())


def model_config(name: str | None) -> dict | None:
    """The ``config.json`` of the model ``--model`` names, read with json before torch loads (issue 28): the
    embedded model's, a local folder's, or a Hub id's in the Hugging Face cache; None where it cannot be read
    without the Hub. A local path that does not exist, is a file or holds no ``config.json`` is one line naming
    the fix."""
    import json

    from inspector.capture.models import in_hub_cache, is_hub_id, resolve_model_name

    try:
        path = resolve_model_name(name)
    except InspectorError:
        return None
    if name is not None and looks_like_path(str(name)):
        folder = Path(path).expanduser()
        if not folder.exists():
            raise InspectorError(f"--model {name} does not exist (no such folder): give a model folder holding config.json, or a Hub id "
                                 "such as owner/name")
        if not folder.is_dir():
            raise InspectorError(f"--model {name} is a file: give the model's folder (the one holding config.json)")
        if not (folder / "config.json").is_file():
            raise InspectorError(f"--model {name} holds no config.json: give the folder of a Hugging Face model "
                                 "(config.json, weights and tokenizer)")
        file = folder / "config.json"
    elif name is None or Path(path).is_dir():
        file = Path(path) / "config.json"
    elif is_hub_id(path) and in_hub_cache(path):
        from huggingface_hub import try_to_load_from_cache

        try:
            found = try_to_load_from_cache(path, "config.json")
        except Exception:  # noqa: BLE001 - a malformed id: leave it to the load
            return None
        file = Path(found) if isinstance(found, str) else None
    else:
        return None
    try:
        config = json.loads(file.read_text(encoding="utf-8")) if file is not None else None
    except (OSError, ValueError, RecursionError):
        return None
    return config if isinstance(config, dict) else None


LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "encoder_layers", "decoder_layers", "num_decoder_layers")


def config_layers(config: dict) -> int | None:
    """The largest layer count of any stack the config states (as the recorder counts them), or None."""
    counts = [config.get(k) for k in LAYER_COUNTS]
    counts = [c for c in counts if isinstance(c, int) and not isinstance(c, bool)]
    return max(counts) if counts else None


def config_class(config: dict) -> str:
    arch = config.get("architectures")
    if isinstance(arch, list) and arch and isinstance(arch[0], str):
        return arch[0]
    return str(config.get("model_type") or "the model")


def config_is_encoder(config: dict) -> bool:
    """True only where the config says for certain the model is an encoder (no output side): no encoder-decoder,
    no decoder flag, an encoder's model type (BERT, RoBERTa, ...) and no architecture that generates."""
    from inspector.capture.inputs import ENCODER_TYPES

    arch = config.get("architectures") or []
    names = " ".join(a for a in arch if isinstance(a, str)) if isinstance(arch, list) else ""
    return (config.get("model_type") in ENCODER_TYPES and not config.get("is_encoder_decoder")
            and not config.get("is_decoder") and not config.get("add_cross_attention")
            and not any(k in names for k in ("CausalLM", "LMHead", "Generation", "Seq2Seq")))


def check_model_capture(config: dict | None, layers: list[int] | None, output: bool) -> None:
    """Against the model's config.json, before it loads: a ``--layers`` index it lacks, and ``--output`` /
    ``--generate`` on an encoder, which has no output side."""
    if config is None:
        return
    n = config_layers(config)
    if layers and n is not None:
        bad = [i for i in layers if not 0 <= i < n]
        if bad:
            raise InspectorError(f"layer {bad[0]} does not exist: {config_class(config)} has layers 0..{n - 1}: give "
                                 f"--layers from 0 to {n - 1}")
    if output and config_is_encoder(config):
        raise InspectorError(f"{config_class(config)} is an encoder: it has no output side, so drop --output/--generate")


def scan_values(args):
    """``scan``'s model and engine as values (:class:`~inspector.corpus.engine.ModelSpec`,
    :class:`~inspector.corpus.engine.Engine`), built once from ``--model``, ``--device``, ``--trust-remote-code``,
    ``--engine``, ``--batch-size``, ``--workers`` and ``--ray-address``, before torch loads; a combination that does
    not go together is one line naming the fix."""
    from inspector.corpus.engine import Engine, ModelSpec

    model = ModelSpec(args.model, device=args.device, trust_remote_code=args.trust_remote_code)
    engine = Engine(args.engine, batch_size=args.batch_size, workers=args.workers, address=args.ray_address)
    return model, engine
