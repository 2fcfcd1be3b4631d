"""The capture engine: record Q, K, V and attention weights at transformers' attention seam
(:mod:`inspector.capture.interface` registers the seam; this module records what passes through it).

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
from typing import Any

import torch

from inspector.capture import banded
from inspector.capture.inputs import TOKENIZER_LOCK, Encoded, encode_with_globals
from inspector.capture.interface import (  # noqa: F401  (re-exported: part of this module's API)
    ACTIVE,
    HANDLED_KWARGS,
    IMPL,
    LOCK,
    NEUTRAL_KWARGS,
    SharedModel,
    attn_implementation,
    eager_function,
    eval_mode,
    fast_attention,
    model_configs,
    registered_functions,
    shared_model,
)
from inspector.capture.models import display_name
from inspector.capture.options import CaptureOptions
from inspector.capture.output import Output
from inspector.errors import InspectorError
from inspector.store import masks, schema
from inspector.store.capture_file import Capture, Site
from inspector.store.files import SIGNALS
from inspector.store.specs import site_patterns  # noqa: F401  (torch-free, for the CLI; part of this module's API)

STORAGE_DTYPES = {name: getattr(torch, name) for name in schema.STORAGE_DTYPES}
_CROSS_NAMES = ("crossattention", "encoder_attn", "encdecattention", "cross_attn", "cross_attention")



class StopForward(Exception):  # noqa: N818 - a signal, not an error
    """Raised by the recorder to end a forward pass once the last attention call its caller needs is recorded
    (:attr:`Recorder.stop_order`); :func:`record` catches it. What the model computes after that call (the last
    layer's feed-forward block, a pooler or a language-model head) feeds no attention weight of the pass."""


def site_depth(module, base: str, call: int) -> int:
    """The depth of an attention call: the module's own ``layer_idx`` where it is a depth (an int, not
    negative), else the first number in its dotted name (``model.layers.3.shared_transformer.self_attn`` -> 3:
    Zamba2's shared blocks have ``layer_idx = -1``, one module per hybrid layer), else 0; a module's second
    and later calls in one forward pass (``name@call``) take the call count."""
    layer = getattr(module, "layer_idx", None)
    if call == 0 and isinstance(layer, int) and not isinstance(layer, bool) and layer >= 0:
        return layer
    numbers = re.findall(r"\.(\d+)(?:\.|$)", base)
    return call if call > 0 or not numbers else int(numbers[0])


class Recorder:
    """The attention function's state for one forward pass: which calls to record (layers, site patterns),
    the :class:`~inspector.store.schema.Site` and tensors (Q, K, V ``[batch, head, position, d_head]``,
    weights ``[batch, head, query, key]``, masks) recorded per call, in the storage dtype. Set as
    :data:`ACTIVE` by :func:`record`; not used directly."""

    def __init__(self, model, *, weights: bool, dtype: torch.dtype, layers: set[int] | None, sites: list[str] | None,
                 roles: dict[str, tuple[list[str], list[str]]], progress=None, lengths: dict[str, int] | None = None):
        # one walk of the module tree for the whole pass (its set-up and the check after it): on a short input
        # repeated walks cost as much as the attention (tests/test_recorder_walk.py)
        self.walk: list[tuple[str, Any]] = list(model.named_modules())
        self.names = {id(m): n for n, m in self.walk}
        self.configs = model_configs(model, [m for _, m in self.walk])
        self.lengths = dict(lengths or {})  # tokens per role (batch row 0; rows are padded alike)
        self.padding: dict[str, list[list[bool]]] = {}  # per role, per batch row: which tokens are padding
        # configs whose model ran sdpa before the capture: lazy calls of other modules run their eager function
        # (while concurrent_captures holds the model, its configs name the recording attention: it kept theirs)
        with LOCK:  # read at once with the set-up (concurrent_captures changes both under LOCK)
            shared = shared_model(model)
            before = shared.original if shared is not None else {id(c): c._attn_implementation for c in self.configs}
        self.sdpa_configs = {id(c) for c in self.configs if before.get(id(c)) == "sdpa"}
        self.model_sdpa = id(model.config) in self.sdpa_configs
        self.encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
        self.weights = weights
        self.dtype = dtype
        self.layers = layers
        self.site_patterns = site_patterns(sites)
        self.roles = roles
        self.progress = progress
        self.sites: list[Site] = []
        self.tensors: dict[str, torch.Tensor] = {}
        self._calls: dict[int, int] = {}
        self._order: list[int] = []  # the module of every attention call, in call order
        self.shared = False  # keep Q, K, V as the model made them (a capture reduced in memory, never saved)
        self.stop_order: tuple[int, ...] | None = None  # end the pass after this sequence of calls (StopForward)
        self._masks: dict[tuple[int, int, int], str | None] = {}
        self.masks: dict[str, dict] = {}  # mask name -> spec (schema 2)
        self._alive: list[Any] = []  # keep mask inputs alive so their ids stay unique
        self._sdpa_masks: dict[tuple, Any] = {}
        self.projections = None  # a value_norm.OutputProjections while recording
        self._kinds: dict[tuple, tuple] = {}  # (mask id, bias id, query len, key len) -> (mask, bias, kind)
        self.forward_sums = None  # a forward_sums.ForwardSums: reduce recomputable calls as they run
        self.pseudo: dict[str, int] = {}  # pseudo-inputs a site's axes name (Pegasus-X's "global"): role -> tokens

    def _keep(self, t: torch.Tensor) -> torch.Tensor:
        """A CPU copy in the storage dtype that shares memory with nothing (K and V may be one tensor, Q a
        view of a fused projection): safetensors refuses tensors that share memory. A capture that is only
        reduced in memory (``shared``: its ``forward_sums`` says ``in_memory``) keeps the model's own tensors."""
        out = t.detach().to(device="cpu", dtype=self.dtype)
        if self.shared:
            return out
        return out.clone() if out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() else out

    def __call__(self, module, query, key, value, attention_mask, **kwargs):
        base = self.names.get(id(module), type(module).__name__)
        call = self._calls.get(id(module), 0)
        self._calls[id(module)] = call + 1
        self._order.append(id(module))
        name = base if call == 0 else f"{base}@{call}"
        layer = site_depth(module, base, call)
        if (self.layers is not None and layer not in self.layers) or (
            self.site_patterns is not None and not any(p.search(name) for p in self.site_patterns)
        ):
            found = self._lazy(module, query, key, value, attention_mask, kwargs)[1:]
            self._maybe_stop(module)
            return found

        extra = sorted(k for k, v in kwargs.items() if v is not None and k not in NEUTRAL_KWARGS | HANDLED_KWARGS)
        summed = (self.forward_sums is not None and not (self.weights or extra)
                  and self.forward_sums.applies(query, key, value, self.dtype))
        if summed:  # computed below, once the site and its mask are recorded (inspector.corpus.forward_sums)
            fn, out, w = None, None, None
        elif self.weights or extra:
            fn = eager_function(module)
            out, w = fn(module, query, key, value, attention_mask, **kwargs)
        else:
            fn, out, w = self._lazy(module, query, key, value, attention_mask, kwargs)

        stack, kind = self._where(module, base, query, key, attention_mask, kwargs.get("position_bias"))
        q_roles, k_roles = self.roles[stack if self.encoder_decoder else "none"] if kind != "cross" else self.roles["cross"]
        q_roles, k_roles = self._axes(module, base, query, key, attention_mask, q_roles, k_roles)
        kind = self._own_part_kind(kind, q_roles, k_roles, attention_mask, kwargs.get("position_bias"), int(query.shape[-2]))
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
        if summed:  # the call that ends a stop plan's pass needs no output: the pass stops right after it
            last = self.stop_order is not None and len(self._order) == len(self.stop_order) and self.stop_order[-1] == id(module)
            out = self.forward_sums.attend(site, query, key, value, output=not last)
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
        self._maybe_stop(module)
        return out, w

    def _maybe_stop(self, module) -> None:
        """Raise :class:`StopForward` when this call ends :attr:`stop_order` (every call so far the one expected);
        a call that is not the one expected drops the plan, and the pass runs to its end."""
        if self.stop_order is None:
            return
        i = len(self._order) - 1
        if i >= len(self.stop_order) or self.stop_order[i] != id(module):
            self.stop_order = None
        elif i == len(self.stop_order) - 1:
            raise StopForward

    def weights_only(self, module, name: str, base: str, w: torch.Tensor, *, call: int) -> None:
        """A site for a module that computes attention its own way: its probability map ``w``
        ``[batch, head, query, key]`` as returned with ``output_attentions``; Q/K/V unavailable."""
        layer = site_depth(None, base, call)
        if (self.layers is not None and layer not in self.layers) or (
            self.site_patterns is not None and not any(p.search(name) for p in self.site_patterns)
        ):
            return
        q_ok = any(sum(self.lengths.get(r, -1) for r in c) == w.shape[-2] for c in (["source"], ["target"], ["source", "target"]))
        if self.lengths and not q_ok:
            raise InspectorError(
                f"{type(module).__name__} at {base} returns attention weights of shape {tuple(w.shape)}, whose axes are not "
                f"the tokens of the inputs ({self._lengths_text()}), which a capture file cannot express: capture the "
                f"other sites with --sites '^(?!{re.escape(base)}$)' or choose another model")
        stack, kind = self._where(module, base, w, w.transpose(-1, -2), None)
        q_roles, k_roles = self.roles[stack if self.encoder_decoder else "none"] if kind != "cross" else self.roles["cross"]
        q_roles, k_roles = self._axes(module, base, w, w.transpose(-1, -2), None, q_roles, k_roles)
        if kind != "cross":
            pad = None
            if self.padding and all(r in self.padding for r in q_roles):
                pad = torch.cat([torch.tensor(self.padding[r], dtype=torch.bool) for r in q_roles], dim=-1)
            kind = weights_kind(w, pad) or ("causal" if getattr(module, "is_causal", False) else "self")
        heads = int(w.shape[1])
        self.sites.append(Site(
            name=name, stack=stack, layer=int(layer), kind=kind, num_heads=heads, num_kv_heads=heads,
            head_map=list(range(heads)), d_head=0, d_v=0, scaling=float("nan"), query_input=q_roles, key_input=k_roles,
            query_len=int(w.shape[-2]), key_len=int(w.shape[-1]), parts=["weights"], recomputable=False,
            extra_kwargs=["output_attentions"], module_class=type(module).__name__, eager_function="output_attentions",
            value_norm_note="captured through output_attentions, without values",
        ))
        self.tensors[f"{name}/weights"] = self._keep(w)

    def band_site(self, module, name: str, base: str, band: banded.Band, *, call: int) -> None:
        """A banded or block-local site (Longformer, LED's encoder, LongT5, Pegasus-X, BigBird;
        :mod:`inspector.store.band`): each query's global-key slots and window as read from the model, the global
        queries' rows, and a band mask naming the global tokens, the padding and the window (one mask for every
        layer that sees the same keys); the pseudo-inputs its axes name (``global``) are added to the file's inputs."""
        layer = site_depth(None, base, call)
        if (self.layers is not None and layer not in self.layers) or (
            self.site_patterns is not None and not any(p.search(name) for p in self.site_patterns)
        ):
            return
        b, heads, nq, _ = band.weights.shape
        nk = int(band.is_global.shape[1])
        stack = "encoder" if self.encoder_decoder else "none"
        q_roles = band.query_roles if band.query_roles is not None else self.roles[stack][0]
        k_roles = band.key_roles if band.key_roles is not None else self.roles[stack][1]
        for role, count in band.pseudo.items():
            if self.pseudo.setdefault(role, count) != count:
                raise InspectorError(f"{type(module).__name__} at {base} has {count} {role} tokens, another site "
                                     f"{self.pseudo[role]}: capture one of them with --sites")
        known = {**self.lengths, **self.pseudo}
        if self.lengths and (sum(known.get(r, -1) for r in q_roles) != nq or sum(known.get(r, -1) for r in k_roles) != nk):
            raise InspectorError(f"{type(module).__name__} at {base} attends over {nq} x {nk} positions, not the inputs' "
                                 f"({self._lengths_text()}): capture the other sites with --sites '^(?!{re.escape(base)}$)'")
        ident = ("band", band.geometry, band.pad_rows, band.is_global.cpu().numpy().tobytes(),
                 band.padding.cpu().numpy().tobytes(), nq, nk)
        if ident not in self._masks:
            spec, tensors = masks.band_spec(f"{name}/mask", band.geometry, nq, band.is_global, padding=band.padding, pad_rows=band.pad_rows)
            self.masks[f"{name}/mask"] = spec
            self.tensors.update(tensors)
            self._masks[ident] = f"{name}/mask"
        self.sites.append(Site(
            name=name, stack=stack, layer=int(layer), kind="self", num_heads=heads, num_kv_heads=heads,
            head_map=list(range(heads)), d_head=0, d_v=0, scaling=float("nan"), query_input=list(q_roles),
            key_input=list(k_roles), query_len=nq, key_len=nk, parts=["weights", "global_rows"], recomputable=False,
            extra_kwargs=["output_attentions"], module_class=type(module).__name__, eager_function="output_attentions",
            value_norm_note="captured through output_attentions, without values", mask=self._masks[ident], band=band.window,
        ))
        self.tensors[f"{name}/weights"] = self._keep(band.weights)
        self.tensors[f"{name}/global_rows"] = self._keep(band.global_rows)

    def _lazy(self, module, query, key, value, attention_mask, kwargs):
        """(eager function used or None, output, weights) for a call whose weights are not kept: sdpa where the
        model itself ran sdpa, else the module's own eager function, so the model's outputs stay as they were
        (sdpa without a mask defaults to causal, which a model with no sdpa support never meant)."""
        config = getattr(module, "config", None)
        if (id(config) in self.sdpa_configs) if config is not None else self.model_sdpa:
            return None, *fast_attention(module, query, key, value, self._sdpa_mask(module, query, key, attention_mask, kwargs),
                                          **kwargs)
        fn = eager_function(module)
        return fn, *fn(module, query, key, value, attention_mask, **kwargs)

    def _axes(self, module, name, query, key, mask, q_roles, k_roles):
        """Check the call's query and key lengths against the inputs the roles name; an axis that is the
        concatenation of two inputs is recorded as such. What the file cannot express (pooled, blocked or
        global/local keys, a non-4D call) is refused, naming the module."""
        def fits(roles, n):
            return sum(self.lengths.get(r, -(10**9)) for r in roles) == n

        if not self.lengths:  # record() called without the inputs' lengths: nothing to check against
            return q_roles, k_roles

        def refuse(why):
            raise InspectorError(
                f"{type(module).__name__} at {name} {why}, which a capture file cannot express: capture the other "
                f"sites with --sites '^(?!{re.escape(name)}$)' or choose another model")

        if query.dim() != 4 or key.dim() != 4:
            refuse(f"passes attention {query.dim()}-D queries and {key.dim()}-D keys instead of [batch, head, seq, dim]")
        q_len, k_len = int(query.shape[-2]), int(key.shape[-2])
        candidates = [["source"], ["target"], ["source", "target"], ["target", "source"]]
        if not fits(q_roles, q_len):
            q_roles = next((c for c in candidates if fits(c, q_len)), None)
            if q_roles is None:
                refuse(f"has {q_len} queries, not the tokens of any input ({self._lengths_text()})")
        if not fits(k_roles, k_len):
            options = [c for c in candidates if fits(c, k_len)]
            if len(options) == 2 and q_roles not in options:  # both orders of two inputs: the mask tells which
                options = [o for o in options if self._own_first(mask, q_roles, o)] or options
            if len(options) != 1 and not (len(options) == 2 and q_roles in options):
                refuse(f"has {k_len} keys, not the tokens of one input or of a known concatenation ({self._lengths_text()})")
            k_roles = q_roles if q_roles in options else options[0]
        if isinstance(mask, torch.Tensor) and (mask.dim() != 4 or mask.shape[-2] not in (1, q_len) or mask.shape[-1] < k_len):
            refuse(f"applies a mask of shape {tuple(mask.shape)} to {q_len} queries x {k_len} keys")
        return q_roles, k_roles

    def _own_first(self, mask, q_roles: list[str], order: list[str]) -> bool:
        """Whether a call whose keys are two inputs concatenated, in one order or the other, has them in
        ``order`` (T5Gemma2's merged attention: the decoder's own tokens, then the source's), read from its
        mask in batch row 0: the first query sees the first key of its own input but not the second (causal)
        and the first key of the other input. False when the mask cannot tell (then the call is refused)."""
        if not isinstance(mask, torch.Tensor) or mask.dim() != 4 or len(q_roles) != 1 or q_roles[0] not in order:
            return False
        own = order.index(q_roles[0])
        start = 0 if own == 0 else self.lengths[order[0]]
        other = self.lengths[order[0]] if own == 0 else 0
        row = mask[0, 0, 0]
        seen = row if row.dtype == torch.bool else row > masks.MASKED
        n_own = self.lengths[q_roles[0]]
        return n_own > 1 and bool(seen[start]) and not bool(seen[start + 1]) and bool(seen[other])

    def _own_part_kind(self, kind: str, q_roles: list[str], k_roles: list[str], mask, bias, q_len: int) -> str:
        """The kind of a call whose keys are the query's own input and another's, concatenated (T5Gemma2's merged
        self + cross attention: the decoder's tokens, then the source's): that of its own part, read from the mask
        on those keys (causal for T5Gemma2's decoder), not of the whole square-less call. Other calls keep ``kind``."""
        if kind == "cross" or len(q_roles) != 1 or len(k_roles) < 2 or q_roles[0] not in k_roles:
            return kind
        start = sum(self.lengths.get(r, 0) for r in k_roles[:k_roles.index(q_roles[0])])
        n = self.lengths.get(q_roles[0], 0)

        def own(m):
            return m[..., start:start + n] if isinstance(m, torch.Tensor) and m.dim() == 4 and m.shape[-1] >= start + n else None

        if own(mask) is None and own(bias) is None:
            return kind
        return kind_from_mask(own(mask), own(bias), q_len, n) or kind

    def _lengths_text(self) -> str:
        return ", ".join(f"{r} {n} tokens" for r, n in self.lengths.items())

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
        """Store the additive mask (plus any position bias) once per distinct tensor, compactly (a mask spec,
        see :mod:`inspector.store.masks`); return its name."""
        ident = (id(mask), id(bias), key_len)
        if ident in self._masks:
            return self._masks[ident]
        self._alive += [mask, bias]
        if isinstance(mask, torch.Tensor) and mask.shape[-1] != key_len:
            mask = mask[..., :key_len]
        if not isinstance(mask, torch.Tensor):
            mask = None
        stored = None
        if bias is not None or (mask is not None and bool((~mask).any() if mask.dtype == torch.bool else (mask != 0).any())):
            stored = f"{name}/mask"
            spec, tensors = masks.encode(stored, mask, bias)
            self.masks[stored] = spec
            self.tensors.update(tensors)
        self._masks[ident] = stored
        return stored

    def _where(self, module, name: str, query, key, mask, bias=None) -> tuple[str, str]:
        parts = name.lower().split(".")
        stack = "none"
        if self.encoder_decoder:
            stack = "decoder" if any("decoder" in p for p in parts) else "encoder" if any("encoder" in p for p in parts) else "none"
        flat = name.lower().replace("_", "").replace(".", "")
        if getattr(module, "is_cross_attention", False) or any(c.replace("_", "") in flat for c in _CROSS_NAMES):
            return stack, "cross"
        # every layer of a stack gets the same mask object: its kind is read once (the entry keeps it alive)
        ident = (id(mask), id(bias), int(query.shape[-2]), int(key.shape[-2]))
        hit = self._kinds.get(ident)
        if hit is None or hit[0] is not mask or hit[1] is not bias:
            hit = (mask, bias, kind_from_mask(mask, bias, int(query.shape[-2]), int(key.shape[-2])))
            self._kinds[ident] = hit
        kind = hit[2]
        if kind is None:  # one query, or no square mask: nothing tells causal from bidirectional but the module
            kind = "causal" if getattr(module, "is_causal", False) and mask is not None else "self"
        return stack, kind


def kind_from_mask(mask, bias, q_len: int, k_len: int) -> str | None:
    """"causal" when the mask as applied (additive or boolean, plus any position bias) hides every later key
    from every query, "self" when it shows some query a later key, None when it cannot tell (one query, a
    non-square call). No mask means nothing is hidden: the eager path is bidirectional then."""
    if q_len < 2 or q_len != k_len:
        return None
    if mask is None and bias is None:
        return "self"
    hidden = None
    for m in (mask, bias):
        if not isinstance(m, torch.Tensor):
            continue
        m = m[..., :k_len] if m.shape[-1] != k_len else m
        if m.shape[-2] != q_len:
            return None
        h = ~m if m.dtype == torch.bool else (m <= torch.finfo(m.dtype).min / 2) | torch.isneginf(m)
        hidden = h if hidden is None else hidden | h
    if hidden is None:
        return "self"
    later = torch.ones(q_len, k_len, dtype=torch.bool, device=hidden.device).triu_(1)
    return "causal" if bool(hidden[..., later].all()) else "self"


def weights_kind(weights: torch.Tensor, padding: torch.Tensor | None = None) -> str | None:
    """The kind a weights-only site's zero pattern shows: "causal" when every later key gets exactly 0 from
    every real query. ``padding`` (``[batch, query]``, True = padding) leaves padding queries out; rows that
    see nothing (all zero, or the uniform row softmax makes of a fully masked one) are left out too."""
    q_len, k_len = weights.shape[-2:]
    if q_len < 2 or q_len != k_len:
        return None
    w = weights.detach().float()
    real = ~((w == 0).all(-1) | (w == w[..., :1]).all(-1))
    if padding is not None and tuple(padding.shape) == (w.shape[0], q_len):
        real &= ~padding[:, None, :]
    later = torch.ones(q_len, k_len, dtype=torch.bool).triu_(1)
    return "causal" if bool(((w * real[..., None])[..., later] == 0).all()) else "self"


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


def roles_of(encoded: Encoded) -> dict[str, tuple[list[str], list[str]]]:
    """Per attention kind (``self``, ``causal``, ``cross``), the input roles of its (query, key) axes for
    this encoding: ``source`` and/or ``target``."""
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
        # the embedded model by its alias, as the command line names it, however it was loaded
        "name": display_name(name or getattr(config, "_name_or_path", "") or type(model).__name__),
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


@dataclasses.dataclass
class Recording:
    """What :func:`record` returns: the sites, the tensors (named as in the capture file), the model's own output,
    the mask specs the sites name, the pseudo-inputs their axes name (Pegasus-X's learned global tokens, role
    ``global``: role -> number of tokens) and a note (``{"module", "class", "reason"}``) per attention module that
    returned no probability map (also warned about, never dropped silently)."""

    sites: list[Site]
    tensors: dict[str, torch.Tensor]
    output: Any
    masks: dict[str, dict] = dataclasses.field(default_factory=dict)
    pseudo: dict[str, int] = dataclasses.field(default_factory=dict)
    notes: list[dict[str, str]] = dataclasses.field(default_factory=list)


def record(
    model,
    model_kwargs: dict[str, Any],
    roles: dict[str, tuple[list[str], list[str]]],
    options: CaptureOptions | None = None,
    *,
    lengths: dict[str, int] | None = None,
    padding: dict[str, list[list[bool]]] | None = None,
    forward_sums=None,
) -> Recording:
    """Run one forward pass of ``model`` on ``model_kwargs`` while recording every attention call, as ``options``
    say (:class:`~inspector.capture.options.CaptureOptions`; its ``global_tokens`` are the caller's to encode).

    ``roles``: per stack (``encoder``, ``decoder``, ``cross``, ``none``), the roles of its query and key axes.
    ``lengths`` (tokens per role) lets every site's axes be checked against the inputs; ``padding`` (per role,
    per batch row, which tokens are padding) is kept for the value norms and the scan. Attention modules that
    make no call through the interface are captured weights-only from a second, eager pass with
    ``output_attentions`` (named after the module). ``forward_sums`` (a
    :class:`~inspector.corpus.forward_sums.ForwardSums`) takes the rank sums of the calls it applies to as they
    run; after a full pass it is told the pass's attention calls (its ``passed``), and where it names that
    sequence as its ``stop_order``, the pass ends after the last of those calls (:class:`StopForward`): the
    recording is the same, and ``output`` is None. Raises :class:`InspectorError` for a selection that matches no site or a layer the model lacks.
    """
    options = options or CaptureOptions()
    notes: list[dict[str, str]] = []
    _check_selection(model, options)
    bar = None
    if options.progress:
        from tqdm.auto import tqdm

        bar = tqdm(desc="capturing attention", unit="site", leave=False, disable=None,
                   total=_expected_sites(model) if not (options.layers or options.sites) else None)
    recorder = _recorder(model, roles, options, bar=bar, lengths=lengths, padding=padding, forward_sums=forward_sums)
    if recorder.layers is None and recorder.site_patterns is None:
        recorder.stop_order = getattr(forward_sums, "stop_order", None)
    shared = shared_model(model)
    try:
        # value norms hook every projection: no other pass may run beside them
        with _pass_hold(model, recorder, shared, bool(options.value_norms)) as alone, torch.no_grad(), \
                recorder.projections.watching(recorder.tensors):
            token = ACTIVE.set(recorder)
            stopped = False
            try:
                output = model(**model_kwargs, use_cache=False)
            except StopForward:  # every attention call was recorded (forward_sums.stop_order): the rest is not needed
                output, stopped = None, True
            finally:
                ACTIVE.reset(token)
            # a stopped pass made the calls of a full pass that recorded every module (forward_sums.passed)
            missing = [] if stopped else _unrecorded_modules(recorder)
            if forward_sums is not None and not stopped:
                _tell_order(forward_sums, recorder, missing)
            # attention modules that bypass the interface, or no call through it at all: a second, eager pass
            second = bool(missing) or (not recorder._calls and not recorder.sites)
            fallback = _second_pass(model, model_kwargs, roles, options, recorder, missing, notes) if second and alone else None
        if second and not alone:  # it changes the model's attention implementation: once no other pass runs
            with shared.writing(), torch.no_grad():
                fallback = _second_pass(model, model_kwargs, roles, options, recorder, missing, notes)
        if fallback is not None:
            return fallback
    finally:
        if bar is not None:
            with SIGNALS.hold():  # a signal inside tqdm's close waits until the bar is closed, then is raised
                bar.close()
    if not recorder.sites:
        raise InspectorError("the capture selected no attention site: check --layers / --sites against the model")
    return Recording(recorder.sites, recorder.tensors, output, dict(recorder.masks), dict(recorder.pseudo), notes)


@contextlib.contextmanager
def _pass_hold(model, recorder: Recorder, shared: SharedModel | None, alone: bool):
    """What one recording pass holds, yielding whether it runs alone (nothing else changes or runs the model beside
    it): without :func:`~inspector.capture.interface.concurrent_captures` (or once its set-up is undone),
    :data:`LOCK` and the model pointed at the recording attention for the pass (alone); within it, the shared
    set-up, beside other threads' passes or, with ``alone``, by itself."""
    with contextlib.ExitStack() as held:
        if shared is not None:
            held.enter_context(shared.writing() if alone else shared.reading())
        if shared is None or shared.closed:
            held.enter_context(LOCK)
            held.enter_context(eval_mode(model, [m for _, m in recorder.walk]))
            held.enter_context(registered_functions())
            held.enter_context(attn_implementation(model, IMPL, recorder.configs))
            alone = True
        yield alone


def _second_pass(model, model_kwargs, roles, options: CaptureOptions, recorder: Recorder, missing: list,
                 notes: list) -> Recording | None:
    """After the recording pass: the ``output_attentions`` maps of the attention modules it did not record
    (``missing``, by module), or, where no call went through the interface at all, the whole recording from
    ``output_attentions`` (returned; else None)."""
    if missing:
        _weights_only_pass(model, model_kwargs, recorder, missing, notes)
    if not recorder._calls and not recorder.sites:
        return Recording(*_fallback(model, model_kwargs, roles, dtype=STORAGE_DTYPES[options.dtype],
                                    layers=options.layers, sites=options.sites))
    return None


def _tell_order(forward_sums, recorder: Recorder, missing: list) -> None:
    """Tell ``forward_sums`` (its optional ``passed``) the modules of this full pass's attention calls in call
    order, where a later pass of the same input shape may stop after the same sequence: every attention module
    called exactly once through the interface, each a class of transformers itself, each call a site (no module
    captured another way, no selection of layers or sites); else None."""
    passed = getattr(forward_sums, "passed", None)
    if passed is None:
        return
    modules = {id(m): m for _, m in recorder.walk}
    simple = (not missing and recorder.layers is None and recorder.site_patterns is None
              and all(c == 1 for c in recorder._calls.values()) and len(recorder.sites) == len(recorder._order)
              # transformers' own attention classes (remote code, or a class of the user's, may call attention
              # any number of times)
              and all(type(modules[i]).__module__.startswith("transformers.") for i in recorder._order if i in modules))
    passed(tuple(recorder._order) if simple else None)


def _check_selection(model, options: CaptureOptions) -> None:
    """Refuse a bad site pattern or a layer the model lacks before any work (raises :class:`InspectorError`
    naming the fix); the dtype was checked by the options."""
    site_patterns(list(options.sites) if options.sites is not None else None)
    n_layers = _num_layers(model)
    if options.layers is not None and n_layers is not None:
        bad = [i for i in options.layers if not 0 <= i < n_layers]
        if bad:
            raise InspectorError(f"layer {bad[0]} does not exist: {type(model).__name__} has layers 0..{n_layers - 1}")


def _recorder(model, roles, options: CaptureOptions, *, bar, lengths, padding, forward_sums) -> Recorder:
    """A :class:`Recorder` for one pass, with its output projections (value norms), padding and rank sums set."""
    from inspector.capture.value_norm import NotRecorded, OutputProjections

    recorder = Recorder(model, weights=options.weights, dtype=STORAGE_DTYPES[options.dtype],
                        layers=set(options.layers) if options.layers is not None else None,
                        sites=list(options.sites) if options.sites is not None else None, roles=roles, progress=bar,
                        lengths=lengths)
    recorder.projections = OutputProjections(recorder.walk) if options.value_norms else NotRecorded()
    recorder.padding = dict(padding or {})
    if forward_sums is not None:
        forward_sums.bind(recorder.masks, recorder.tensors)
        recorder.forward_sums = forward_sums
        recorder.shared = bool(getattr(forward_sums, "in_memory", False))
    return recorder


_ATTENTION_CLASS = re.compile(r"(Attention|Attn)$")


def _unrecorded_modules(recorder) -> list[tuple[str, Any]]:
    """Attention modules (class name ending in Attention/Attn, none below them) of the recorder's model whose
    subtree made no recorded call: they compute attention their own way."""
    called = set(recorder._calls)
    out = []
    for name, m in recorder.walk:
        if not _ATTENTION_CLASS.search(type(m).__name__):
            continue
        below = list(m.modules())[1:]
        if any(_ATTENTION_CLASS.search(type(c).__name__) for c in below):
            continue
        if id(m) in called or any(id(c) in called for c in below):
            continue
        out.append((name, m))
    return out


def probability_maps(value, batch: int) -> list[torch.Tensor]:
    """4-D tensors ``[batch, head, query, key]`` under ``value`` (nested tuples, lists, dicts, model outputs)
    whose rows are probability distributions: non-negative, each row summing to 1 (rows of padding may
    be all zero)."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 4 or not value.is_floating_point() or value.shape[0] != batch or value.numel() == 0:
            return []
        v = value.detach().float()
        sums = v.sum(-1)
        ok = bool((v >= 0).all()) and bool((((sums - 1).abs() < 1e-3) | (sums == 0)).all()) and bool((sums > 0).any())
        return [value] if ok else []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in probability_maps(v, batch)]
    return []


def _weights_only_pass(model, model_kwargs, recorder, missing, notes) -> None:
    """Run the model once more (eager, ``output_attentions=True``) and keep, for each module in ``missing``,
    the probability map it returns, as a weights-only site named after the module."""
    import warnings

    batch = int(next(v for v in model_kwargs.values() if isinstance(v, torch.Tensor)).shape[0])
    seen: dict[int, list] = {}
    pad = torch.tensor(recorder.padding["source"], dtype=torch.bool) if recorder.padding.get("source") else None

    def hook(module, args, kwargs, output):
        found = banded.read(module, args, kwargs, output, n=recorder.lengths.get("source"), padding=pad)
        seen.setdefault(id(module), []).append([found] if found is not None else probability_maps(output, batch)[:1])

    handles = [m.register_forward_hook(hook, with_kwargs=True) for _, m in missing]
    try:
        with attn_implementation(model, "eager"):
            model(**model_kwargs, **_run_kwargs(model), output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    for name, module in missing:
        calls = seen.get(id(module))
        if not calls:
            continue  # the module did not run on this input
        for call, maps in enumerate(calls):
            site_name = name if call == 0 else f"{name}@{call}"
            if not maps:
                notes.append({"module": site_name, "class": type(module).__name__,
                              "reason": "computes attention outside transformers' attention interface and returns no "
                                        "[batch, head, query, key] probability map with output_attentions (blocked, "
                                        "local or pooled attention)"})
                continue
            if isinstance(maps[0], banded.Band):
                recorder.band_site(module, site_name, name, maps[0], call=call)
            else:
                recorder.weights_only(module, site_name, name, maps[0], call=call)
    for n in notes:
        warnings.warn(f"inspector: {n['class']} at {n['module']} is not captured: {n['reason']}", stacklevel=4)


def _flatten(value) -> list:
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flatten(v)]
    return [value]


def _run_kwargs(model) -> dict[str, Any]:
    import inspect

    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    return {"use_cache": False} if "use_cache" in params or any(p.kind == p.VAR_KEYWORD for p in params.values()) else {}


def _fallback(model, model_kwargs, roles, *, dtype, layers, sites):
    """For models whose attention bypasses the interface (Bloom, DeBERTa, Falcon in 5.24): the weights
    that ``output_attentions`` returns, with Q/K/V marked unavailable."""
    with attn_implementation(model, "eager"):
        output = model(**model_kwargs, **_run_kwargs(model), output_attentions=True)
    batch = int(next(v for v in model_kwargs.values() if isinstance(v, torch.Tensor)).shape[0])
    groups = []
    for field, stack, kind in (
        ("encoder_attentions", "encoder", "self"), ("decoder_attentions", "decoder", "causal"),
        ("cross_attentions", "decoder", "cross"), ("attentions", "none", None),
    ):
        value = getattr(output, field, None)
        if value:
            flat = _flatten(value)
            bad = [i for i, w in enumerate(flat) if not probability_maps(w, batch)]
            if bad:  # keep only probability maps; anything else would be shown as weights it is not
                raise InspectorError(
                    f"{type(model).__name__} returns {field}[{bad[0]}] with output_attentions, which is not a probability "
                    "map (rows do not sum to 1), and its attention bypasses transformers' attention interface: it "
                    "cannot be captured faithfully")
            groups.append((field, stack, kind, flat))
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
    target: str | list[str] | Output | None = None,
    *,
    options: CaptureOptions | None = None,
    model_name: str | None = None,
    forward_sums=None,
    extra_inputs: dict[str, Any] | None = None,
    **fields: Any,
) -> Capture:
    """Capture per-layer, per-head Q, K, V and attention weights of ``model`` on ``text``.

    ``target`` is what the model said: the decoder side of an encoder-decoder (teacher-forced) or a continuation
    appended to a decoder-only prompt, as a text, a list of texts (one per batch row) or an
    :class:`~inspector.capture.output.Output` (text or token ids; generate first with
    :func:`inspector.capture.generation.generate_target`). ``options`` (:class:`~inspector.capture.options.CaptureOptions`)
    say what is recorded; its fields may also be given as keywords (``weights=False``, ``layers=[0]``,
    ``sites=[...]``, ``dtype=``, ``value_norms=``, ``global_tokens=``, ``progress=``), which are checked as the
    options check them (an unknown keyword is a ``TypeError``). ``weights=False`` makes a lazy capture (Q/K/V and
    masks only); ``global_tokens`` marks LED's / Longformer's global tokens by word or ``@i`` index
    (:func:`inspector.capture.inputs.global_attention_mask`, which raises :class:`InspectorError` for a model that
    takes none) and is recorded under ``options.global``. ``model_name`` is kept in the provenance.

    The model's own output is kept on the returned capture as ``capture.output`` (not saved); None where a
    ``forward_sums`` plan ended the pass after its last attention call (:class:`StopForward`).
    ``forward_sums`` (lazy captures only) is a callable that takes the encoded input records and returns an
    object with ``applies``, ``bind`` and ``attend`` (the scan's :class:`inspector.corpus.forward_sums.ForwardSums`):
    it sums the rank metrics of every site it can while the model runs, each site's weights computed once,
    eagerly, for its output and its sums; it is kept on the capture as ``capture.forward_sums`` (not saved).
    The capture stage does not import the scan: the scan hands this in. ``extra_inputs`` are further model
    inputs, given as they are (e.g. a ready ``global_attention_mask [batch, source]``, 1 = a global token).
    """
    if fields:
        unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(CaptureOptions)})
        if unknown:
            raise TypeError(f"capture() got unexpected keyword argument(s) {', '.join(unknown)}")
        options = dataclasses.replace(options or CaptureOptions(), **fields)
    options = options or CaptureOptions()
    said = target.kwargs() if isinstance(target, Output) else {"target": target}
    with TOKENIZER_LOCK:  # captures may run in several threads (concurrent_captures); the tokenizer is one object
        encoded = encode_with_globals(model, tokenizer, text, said.get("target"), target_ids=said.get("target_ids"),
                                      global_tokens=list(options.global_tokens) if options.global_tokens else None)
    if extra_inputs:
        encoded.model_kwargs.update(extra_inputs)
    roles = roles_of(encoded)
    lengths = {r.role: len(r.ids) for r in encoded.records if r.batch == 0}
    taken = None
    if forward_sums is not None and not options.weights:
        taken = forward_sums(encoded.records)
    padding = {role: [r.padding for r in sorted((r for r in encoded.records if r.role == role), key=lambda r: r.batch)]
               for role in lengths}
    rec = record(model, encoded.model_kwargs, roles, options, lengths=lengths, padding=padding, forward_sums=taken)
    batch = 1 + max(r.batch for r in encoded.records)
    for role, count in rec.pseudo.items():  # learned tokens a site's axes name, one record per batch row
        encoded.records.extend(banded.pseudo_records(role, count, batch))
    meta = {
        "model": _provenance(model, model_name),
        "layout": encoded.layout,
        "options": options.header(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        # the records' fields as InputRecord.to_dict gives them, without its deep copy (encode's lists are
        # fresh and used nowhere else; a deep copy costs ~30 ms per 1000 tokens)
        "inputs": [{f.name: getattr(r, f.name) for f in dataclasses.fields(r)} for r in encoded.records],
        "masks": rec.masks,
    }
    if rec.notes:  # attention modules that could not be captured, each named (also warned about)
        meta["unrecorded"] = rec.notes
    cap = Capture(meta, rec.sites, rec.tensors)
    cap.output = rec.output
    cap.forward_sums = taken
    return cap
