"""The capture engine: record Q, K, V and attention weights at transformers' attention seam.

transformers 5.x routes the attention of most model families through ``ALL_ATTENTION_FUNCTIONS``
with per-head query, key and value (after rotary embeddings, before grouped K/V heads are
repeated). While :func:`recording` is active, the model's configs point at one recording function
registered under the name ``"inspector"`` with ``AttentionInterface``, and the matching mask
function (the eager, additive mask) with ``AttentionMaskInterface`` -- without the latter, masks
are silently skipped and causal models would see the future.

For every attention call the recorder

* in a full capture, calls the model's *own* ``eager_attention_forward`` (from the module's modeling
  file), so soft-capping, relative position biases and sliding windows come out as the model defines
  them, and keeps its weights;
* in a lazy capture (``weights=False``), calls sdpa for speed (eager where sdpa cannot express the
  call, e.g. soft-capping) and keeps only Q, K, V and the mask, from which the weights are
  recomputed exactly on demand.

Everything changed on the model (the configs' attention implementation, the registrations) is
restored on every exit path, exceptions included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import re
import sys
import threading
from contextvars import ContextVar
from typing import Any

import torch

from .errors import InspectorError
from .inputs import Encoded, encode
from .store import Capture, Site

IMPL = "inspector"
STORAGE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Keyword arguments that attention functions receive but that do not change the weights (the mask
# already encodes sliding windows for eager/sdpa).
_NEUTRAL_KWARGS = {
    "dropout", "scaling", "is_causal", "sliding_window", "output_attentions", "position_ids", "cache_position",
    "use_cache", "return_dict", "layer_idx", "head_mask", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
    "max_length_k", "position_embeddings", "output_hidden_states", "token_type_ids", "output_router_logits",
}
_HANDLED_KWARGS = {"softcap", "position_bias"}
_CROSS_NAMES = ("crossattention", "encoder_attn", "encdecattention", "cross_attn", "cross_attention")

_ACTIVE: ContextVar[_Recorder | None] = ContextVar("inspector_recorder", default=None)
_LOCK = threading.RLock()
_registrations = 0


def _dispatch(module, query, key, value, attention_mask, **kwargs):
    """The function registered as ``attn_implementation="inspector"``."""
    recorder = _ACTIVE.get()
    if recorder is None:  # another thread's model is being captured; this one just runs normally
        return _fast_attention(module, query, key, value, attention_mask, **kwargs)
    return recorder(module, query, key, value, attention_mask, **kwargs)


def _fast_attention(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if kwargs.get("softcap") is not None or any(v is not None for k, v in kwargs.items() if k not in _NEUTRAL_KWARGS | _HANDLED_KWARGS):
        return eager_function(module)(module, query, key, value, attention_mask, **kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def eager_function(module):
    """The ``eager_attention_forward`` of the module's own modeling file (or a parent class's)."""
    for cls in type(module).__mro__:
        mod = sys.modules.get(cls.__module__)
        fn = getattr(mod, "eager_attention_forward", None) if mod is not None else None
        if fn is not None:
            return fn
    raise InspectorError(
        f"{type(module).__name__} calls the attention interface but its modeling file has no eager_attention_forward: "
        "this architecture is not supported yet"
    )


@contextlib.contextmanager
def _registered():
    """Register the recording attention and its (eager, additive) mask for the duration."""
    global _registrations
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    from transformers.modeling_utils import AttentionInterface

    with _LOCK:
        if _registrations == 0:
            AttentionInterface.register(IMPL, _dispatch)
            AttentionMaskInterface.register(IMPL, eager_mask)
        _registrations += 1
    try:
        yield
    finally:
        with _LOCK:
            _registrations -= 1
            if _registrations == 0:
                # GeneralInterface has no unregister; its class-level mapping is the registry
                AttentionInterface._global_mapping.pop(IMPL, None)
                AttentionMaskInterface._global_mapping.pop(IMPL, None)


def _configs(model) -> list[Any]:
    from transformers import PretrainedConfig

    seen: dict[int, Any] = {}
    stack = [getattr(m, "config", None) for m in model.modules()]
    while stack:
        c = stack.pop()
        if isinstance(c, PretrainedConfig) and id(c) not in seen:
            seen[id(c)] = c
            stack += [getattr(c, k, None) for k in getattr(c, "sub_configs", {})]
    return list(seen.values())


@contextlib.contextmanager
def attn_implementation(model, name: str):
    """Point every config of ``model`` at attention implementation ``name``; restore on exit."""
    configs = _configs(model)
    saved = [(c, c.__dict__.get("_attn_implementation_internal")) for c in configs]
    try:
        for c in configs:
            c._attn_implementation_internal = name
        yield
    finally:
        for c, value in saved:
            c._attn_implementation_internal = value


def _patterns(sites: list[str] | None) -> list[re.Pattern] | None:
    if not sites:
        return None
    out = []
    for p in sites:
        try:
            out.append(re.compile(p))
        except re.error as exc:
            raise InspectorError(f"--sites {p!r} is not a valid regular expression ({exc}): escape special characters") from None
    return out


class _Recorder:
    def __init__(self, model, *, weights: bool, dtype: torch.dtype, layers: set[int] | None, sites: list[str] | None,
                 roles: dict[str, tuple[list[str], list[str]]], progress=None):
        self.names = {id(m): n for n, m in model.named_modules()}
        self.encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
        self.weights = weights
        self.dtype = dtype
        self.layers = layers
        self.site_patterns = _patterns(sites)
        self.roles = roles
        self.progress = progress
        self.sites: list[Site] = []
        self.tensors: dict[str, torch.Tensor] = {}
        self._calls: dict[int, int] = {}
        self._masks: dict[tuple[int, int, int], str | None] = {}
        self._alive: list[Any] = []  # keep mask inputs alive so their ids stay unique
        self._sdpa_masks: dict[tuple, Any] = {}
        self.projections = None  # a value_norm.OutputProjections while recording

    def _keep(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(device="cpu", dtype=self.dtype)

    def __call__(self, module, query, key, value, attention_mask, **kwargs):
        base = self.names.get(id(module), type(module).__name__)
        call = self._calls.get(id(module), 0)
        self._calls[id(module)] = call + 1
        name = base if call == 0 else f"{base}@{call}"
        layer = getattr(module, "layer_idx", None)
        if call > 0 or not isinstance(layer, int):
            numbers = re.findall(r"\.(\d+)(?:\.|$)", base)
            layer = call if call > 0 or not numbers else int(numbers[0])
        if (self.layers is not None and layer not in self.layers) or (
            self.site_patterns is not None and not any(p.search(name) for p in self.site_patterns)
        ):
            return _fast_attention(module, query, key, value, self._sdpa_mask(module, query, key, attention_mask, kwargs), **kwargs)

        extra = sorted(k for k, v in kwargs.items() if v is not None and k not in _NEUTRAL_KWARGS | _HANDLED_KWARGS)
        if self.weights or extra:
            fn = eager_function(module)
            out, w = fn(module, query, key, value, attention_mask, **kwargs)
        else:
            fn = None
            out, w = _fast_attention(module, query, key, value, self._sdpa_mask(module, query, key, attention_mask, kwargs),
                                     **kwargs)

        stack, kind = self._where(module, base, query, key, attention_mask)
        q_roles, k_roles = self.roles[stack if self.encoder_decoder else "none"] if kind != "cross" else self.roles["cross"]
        heads, kv_heads = query.shape[1], key.shape[1]
        scaling = kwargs.get("scaling")
        scaling = float(query.shape[-1] ** -0.5 if scaling is None else scaling)
        softcap = kwargs.get("softcap")
        site = Site(
            name=name, stack=stack, layer=int(layer), kind=kind, num_heads=int(heads), num_kv_heads=int(kv_heads),
            head_map=[h // (heads // kv_heads) for h in range(heads)], d_head=int(query.shape[-1]), d_v=int(value.shape[-1]),
            scaling=scaling, query_input=q_roles, key_input=k_roles, query_len=int(query.shape[-2]),
            key_len=int(key.shape[-2]), softcap=None if softcap is None else float(softcap),
            mask=self._mask(name, attention_mask, kwargs.get("position_bias"), key.shape[-2]),
            parts=["q", "k", "v"] + (["weights"] if self.weights or extra else []), recomputable=not extra,
            extra_kwargs=extra, module_class=type(module).__name__,
            eager_function=f"{fn.__module__}.{fn.__name__}" if fn is not None else "",
        )
        self.tensors[f"{name}/q"] = self._keep(query)
        self.tensors[f"{name}/k"] = self._keep(key)
        self.tensors[f"{name}/v"] = self._keep(value)
        if self.weights or extra:  # weights the file could not recompute are always kept
            self.tensors[f"{name}/weights"] = self._keep(w)
        self.sites.append(site)
        if self.projections is not None:  # value norms, once the output projection consumes `out`
            self.projections.expect(site, out, value)
        if self.progress is not None:
            self.progress.update(1)
        return out, w

    def _sdpa_mask(self, module, query, key, mask, kwargs):
        """The mask to give sdpa: None where the additive mask hides exactly what sdpa's own ``is_causal``
        flag hides (the causal pattern for a causal call, nothing otherwise), so that sdpa runs its causal
        kernel as the model's own sdpa path does, instead of adding a float mask over every query x key
        pair; the mask itself otherwise. The stored mask is unaffected."""
        if not isinstance(mask, torch.Tensor) or mask.dtype == torch.bool or kwargs.get("softcap") is not None \
                or kwargs.get("position_bias") is not None:
            return mask
        q_len, k_len = query.shape[-2], key.shape[-2]
        causal = kwargs.get("is_causal")
        causal = bool(getattr(module, "is_causal", True) if causal is None else causal) and q_len > 1
        ident = (id(mask), q_len, k_len, causal)
        if ident not in self._sdpa_masks:
            self._alive.append(mask)
            self._sdpa_masks[ident] = None if _hides_as_sdpa_would(mask, q_len, k_len, causal) else mask
        return self._sdpa_masks[ident]

    def _mask(self, name: str, mask, bias, key_len: int) -> str | None:
        """Store the additive mask (plus any position bias) once per distinct tensor; return its name."""
        ident = (id(mask), id(bias), key_len)
        if ident in self._masks:
            return self._masks[ident]
        self._alive += [mask, bias]
        combined = None
        if isinstance(mask, torch.Tensor):
            combined = mask[..., :key_len] if mask.shape[-1] != key_len else mask
            if combined.dtype == torch.bool:  # a boolean mask (True = visible) as the additive one it stands for
                combined = torch.zeros(combined.shape, dtype=torch.float32, device=combined.device).masked_fill(
                    ~combined, torch.finfo(torch.float32).min)
        if bias is not None:
            combined = bias if combined is None else bias + combined
        stored = None
        if combined is not None and (bias is not None or bool((combined != 0).any())):
            stored = f"{name}/mask"
            self.tensors[stored] = combined.detach().to("cpu")
        self._masks[ident] = stored
        return stored

    def _where(self, module, name: str, query, key, mask) -> tuple[str, str]:
        parts = name.lower().split(".")
        stack = "none"
        if self.encoder_decoder:
            stack = "decoder" if any("decoder" in p for p in parts) else "encoder" if any("encoder" in p for p in parts) else "none"
        flat = name.lower().replace("_", "").replace(".", "")
        if getattr(module, "is_cross_attention", False) or any(c.replace("_", "") in flat for c in _CROSS_NAMES):
            return stack, "cross"
        causal = getattr(module, "is_causal", None)
        if causal is None:  # look at the mask: a causal one hides from the first query a key the last one sees
            causal = bool(
                isinstance(mask, torch.Tensor) and mask.dtype != torch.bool and query.shape[-2] > 1 and key.shape[-2] > 1
                and mask.shape[-2] > 1 and ((mask[:, 0, 0, :] < 0) & (mask[:, 0, -1, :] == 0)).any()
            )
        return stack, "causal" if causal else "self"


def _hides_as_sdpa_would(mask: torch.Tensor, q_len: int, k_len: int, causal: bool) -> bool:
    """True when the additive ``mask`` (``[batch, 1, query, key]``) is 0 on every pair sdpa with
    ``is_causal=causal`` and no mask lets through and the dtype minimum (or -inf) on every pair it hides, so
    both give the same weights."""
    if mask.dim() != 4 or mask.shape[1] != 1 or tuple(mask.shape[-2:]) != (q_len, k_len):
        return False
    if not causal:
        return not bool(mask.any())
    if q_len != k_len:
        return False
    hidden = torch.ones(q_len, k_len, dtype=torch.bool, device=mask.device).triu_(1)
    low = torch.finfo(mask.dtype).min
    if not bool((mask.masked_fill(hidden, 0) == 0).all()):
        return False
    return bool(((mask == low) | (mask == float("-inf"))).masked_fill_(~hidden, True).all())


def _roles(encoded: Encoded) -> dict[str, tuple[list[str], list[str]]]:
    has_target = any(r.role == "target" for r in encoded.records)
    if encoded.layout == "encoder-decoder":
        tgt = ["target"] if has_target else []
        return {"encoder": (["source"], ["source"]), "decoder": (tgt, tgt), "cross": (tgt, ["source"]),
                "none": (["source"], ["source"])}
    seq = ["source", "target"] if has_target else ["source"]
    return {"none": (seq, seq), "encoder": (seq, seq), "decoder": (seq, seq), "cross": (seq, seq)}


def _num_layers(model) -> int | None:
    """The largest layer count of any stack (an encoder-decoder may have more decoder layers)."""
    config = model.config
    counts = [getattr(config, a, None) for a in ("num_hidden_layers", "n_layer", "num_layers", "encoder_layers",
                                                  "decoder_layers", "num_decoder_layers")]
    counts = [c for c in counts if isinstance(c, int)]
    return max(counts) if counts else None


def _expected_sites(model) -> int | None:
    """How many attention calls to expect, for the progress bar: modules named *Attention with no such child."""
    attn = [m for m in model.modules() if type(m).__name__.endswith("Attention")]
    leaves = [m for m in attn if not any(c is not m and type(c).__name__.endswith("Attention") for c in m.modules())]
    return len(leaves) or None


def _provenance(model, name: str | None) -> dict[str, Any]:
    import transformers

    config = model.config
    try:
        dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    except StopIteration:
        dtype = "?"
    return {
        "name": name or getattr(config, "_name_or_path", "") or type(model).__name__,
        "class": type(model).__name__,
        "model_type": getattr(config, "model_type", ""),
        "config_hash": _config_hash(config),
        "dtype": dtype,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }


def _config_hash(config) -> str:
    import hashlib
    import json

    d = config.to_dict()
    for k in ("_name_or_path", "transformers_version", "_attn_implementation_autoset", "dtype", "torch_dtype", "architectures"):
        d.pop(k, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def record(
    model,
    model_kwargs: dict[str, Any],
    roles: dict[str, tuple[list[str], list[str]]],
    *,
    weights: bool = True,
    dtype: str = "float32",
    layers: list[int] | None = None,
    sites: list[str] | None = None,
    progress: bool = False,
) -> tuple[list[Site], dict[str, torch.Tensor], Any]:
    """Run one forward pass of ``model`` on ``model_kwargs`` while recording every attention call.

    Returns the sites, the tensors (named as in the capture file) and the model's own output.
    """
    if dtype not in STORAGE_DTYPES:
        raise InspectorError(f"unknown storage dtype {dtype!r}: use one of {', '.join(STORAGE_DTYPES)}")
    _patterns(sites)  # a bad pattern is reported before any work starts
    n_layers = _num_layers(model)
    if layers is not None and n_layers is not None:
        bad = [i for i in layers if not 0 <= i < n_layers]
        if bad:
            raise InspectorError(f"layer {bad[0]} does not exist: {type(model).__name__} has layers 0..{n_layers - 1}")
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(desc="capturing attention", unit="site", leave=False, total=_expected_sites(model) if not (layers or sites) else None)
    recorder = _Recorder(model, weights=weights, dtype=STORAGE_DTYPES[dtype], layers=set(layers) if layers is not None else None,
                         sites=sites, roles=roles, progress=bar)
    from .value_norm import OutputProjections

    recorder.projections = OutputProjections(model)
    was_training = model.training
    model.eval()
    token = None
    try:
        with _LOCK, _registered(), attn_implementation(model, IMPL), torch.no_grad(), \
                recorder.projections.watching(recorder.tensors):
            token = _ACTIVE.set(recorder)
            try:
                output = model(**model_kwargs, use_cache=False)
            finally:
                _ACTIVE.reset(token)
            if not recorder._calls:
                return _fallback(model, model_kwargs, roles, dtype=STORAGE_DTYPES[dtype], layers=layers, sites=sites)
    finally:
        model.train(was_training)
        if bar is not None:
            bar.close()
    if not recorder.sites:
        raise InspectorError("the capture selected no attention site: check --layers / --sites against the model")
    return recorder.sites, recorder.tensors, output


def _fallback(model, model_kwargs, roles, *, dtype, layers, sites):
    """For models whose attention bypasses the interface (Bloom, DeBERTa, Falcon in 5.24): the weights
    that ``output_attentions`` returns, with Q/K/V marked unavailable."""
    with attn_implementation(model, "eager"):
        output = model(**model_kwargs, use_cache=False, output_attentions=True)
    groups = []
    for field, stack, kind in (
        ("encoder_attentions", "encoder", "self"), ("decoder_attentions", "decoder", "causal"),
        ("cross_attentions", "decoder", "cross"), ("attentions", "none", None),
    ):
        value = getattr(output, field, None)
        if value:
            groups.append((field, stack, kind, value))
    if not groups or any(w is None for _, _, _, ws in groups for w in ws):
        raise InspectorError(
            f"{type(model).__name__} neither uses transformers' attention interface nor returns output_attentions: "
            "it cannot be captured; supported are models whose attention layers call ALL_ATTENTION_FUNCTIONS"
        )
    layout_causal = bool(getattr(model.config, "is_decoder", False)) or "CausalLM" in type(model).__name__
    out_sites, tensors = [], {}
    for field, stack, kind, ws in groups:
        for i, w in enumerate(ws):
            name = f"{field}.{i}"
            if (layers is not None and i not in layers) or (sites and not any(re.search(p, name) for p in sites)):
                continue
            k = kind or ("causal" if layout_causal else "self")
            q_roles, k_roles = roles["cross"] if k == "cross" else roles[stack if stack != "none" else "none"]
            out_sites.append(Site(
                name=name, stack=stack, layer=i, kind=k, num_heads=int(w.shape[1]), num_kv_heads=int(w.shape[1]),
                head_map=list(range(int(w.shape[1]))), d_head=0, d_v=0, scaling=float("nan"), query_input=q_roles,
                key_input=k_roles, query_len=int(w.shape[-2]), key_len=int(w.shape[-1]), parts=["weights"],
                recomputable=False, extra_kwargs=["output_attentions"], module_class=type(model).__name__,
                eager_function="output_attentions", value_norm_note="captured through output_attentions, without values",
            ))
            tensors[f"{name}/weights"] = w.detach().to("cpu", dtype=dtype)
    return out_sites, tensors, output


def capture(
    model,
    tokenizer,
    text: str | list[str],
    target: str | list[str] | None = None,
    *,
    target_ids: list[list[int]] | None = None,
    weights: bool = True,
    dtype: str = "float32",
    layers: list[int] | None = None,
    sites: list[str] | None = None,
    model_name: str | None = None,
    progress: bool = False,
) -> Capture:
    """Capture per-layer, per-head Q, K, V and attention weights of ``model`` on ``text``.

    ``target`` is the decoder side of an encoder-decoder (teacher-forced) or a continuation appended
    to a decoder-only prompt. ``weights=False`` makes a lazy capture (Q/K/V and masks only).
    ``layers`` and ``sites`` (regular expressions over site names) restrict what is recorded.
    The model's own output is kept on the returned capture as ``capture.output`` (not saved).
    """
    encoded = encode(model, tokenizer, text, target, target_ids=target_ids)
    roles = _roles(encoded)
    site_list, tensors, output = record(
        model, encoded.model_kwargs, roles, weights=weights, dtype=dtype, layers=layers, sites=sites, progress=progress
    )
    meta = {
        "model": _provenance(model, model_name),
        "layout": encoded.layout,
        "options": {"weights": weights, "dtype": dtype, "layers": layers, "sites": sites},
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        # the records' fields as InputRecord.to_dict gives them, without its deep copy (encode's lists are
        # fresh and used nowhere else; a deep copy costs ~30 ms per 1000 tokens)
        "inputs": [{f.name: getattr(r, f.name) for f in dataclasses.fields(r)} for r in encoded.records],
    }
    cap = Capture(meta, site_list, tensors)
    cap.output = output
    return cap
