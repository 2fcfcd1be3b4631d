"""Interventions at the attention seam: ablate heads, patch heads from another run, record head outputs.

transformers' attention functions return the per-head output ``[batch, query, head, d_v]`` (after
the transpose, before the heads are flattened and the output projection is applied). While
:func:`seam` is active, inspector's registration from :mod:`inspector.capture` (``registered_functions``,
``attn_implementation``, ``ACTIVE``) routes every attention call through a :class:`Seam`, which
computes the output as a lazy capture does (sdpa, or the model's own eager function where sdpa
cannot express the call), names the site exactly as a capture names it (module path, ``@n`` for the
n-th repeated call within one forward pass), and then

* records the output of chosen sites (``record``), e.g. a variant's head outputs to patch in;
* sets chosen heads' slices to zero (``zero``): the same as zeroing that head's input columns of
  the output projection, so the projection's bias is kept; ``zero_rows`` does so in one batch row only, so that
  a batch of copies of one input ablates a different head in each row (:mod:`inspector.intervene.rerun`);
* replaces chosen heads' slices by given values (``replace``): a constant per head (mean ablation)
  or values per query position (patching), only at the positions a boolean mask selects;
* adds a zero tensor that requires grad (``grad=True``), so the gradient of any function of the
  model's output with respect to every head's output comes out of one backward pass.

Long-document encoder attention (LED, Longformer, Pegasus-X, LongT5, BigBird block-sparse) makes no call
through the interface; :mod:`inspector.intervene.long_sites` finds where its per-head outputs enter the
output projection, and the same fields (``zero``, ``replace``, ``record``, ``grad``) act there, on the same
site names and query axes a capture gives these modules.

Everything changed on the model is restored on every exit path, exceptions included.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any

import torch

from inspector.capture.banded import pseudo_records
from inspector.capture.inputs import Encoded
from inspector.capture.interface import eval_mode, model_alone
from inspector.capture.recorder import (
    ACTIVE,
    IMPL,
    LOCK,
    Recorder,
    attn_implementation,
    fast_attention,
    registered_functions,
    roles_of,
    site_depth,
)
from inspector.errors import InspectorError
from inspector.intervene import long_sites
from inspector.store.capture_file import Capture, Site
from inspector.store.specs import parse_heads  # noqa: F401  (the one rule, torch-free; part of this module's API)

METHODS = ("zero", "mean")


@dataclass
class Replacement:
    """Values for some heads of one site.

    ``heads``: query-head indices. ``values``: ``[batch, query, len(heads), d_v]`` per position, or
    ``[batch, 1, len(heads), d_v]`` for a constant over positions. ``positions``: ``[query]`` bool,
    where the values go (None: every position). While generating with a cache, the query axis of
    one call starts at the running position of that site (the number of query positions it has
    seen so far); per-position values past their end are not applied.
    """

    heads: list[int]
    values: torch.Tensor
    positions: torch.Tensor | None = None


@dataclass
class Seam:
    """What to do at each attention call (see the module docstring). Filled during the run:
    ``sites`` (the capture's Site records, from a lazy recorder on the first pass), ``outputs``
    (recorded per site, ``[batch, query, head, d_v]``) and ``deltas`` (the zero tensors that require
    grad)."""

    zero: dict[str, list[int]] = field(default_factory=dict)
    replace: dict[str, Replacement] = field(default_factory=dict)
    zero_rows: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # site -> [(batch row, head)] zeroed
    record: set[str] | bool = field(default_factory=set)
    grad: bool = False
    recorder: Recorder | None = None
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    deltas: dict[str, torch.Tensor] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)  # site -> query heads
    _calls: dict[int, int] = field(default_factory=dict)
    _position: dict[str, int] = field(default_factory=dict)
    _names: dict[int, str] = field(default_factory=dict)
    source_len: int | None = None  # tokens of the source in the current pass (see note_source)
    pseudo: dict[str, int] = field(default_factory=dict)  # pseudo-inputs the long sites' axes name
    _pending: dict[int, Any] = field(default_factory=dict)  # projection id -> _LongCall

    def reset_calls(self, *_args, **_kwargs) -> None:
        """Forget the calls counted so far (a forward pre-hook calls this at the start of each pass)."""
        self._calls.clear()

    def __call__(self, module, query, key, value, attention_mask, **kwargs):
        if self.recorder is not None:
            out, w = self.recorder(module, query, key, value, attention_mask, **kwargs)
            name = self.recorder.sites[-1].name
        else:
            base = self._names.get(id(module), type(module).__name__)
            call = self._calls.get(id(module), 0)
            self._calls[id(module)] = call + 1
            name = base if call == 0 else f"{base}@{call}"
            out, w = fast_attention(module, query, key, value, attention_mask, **kwargs)
        heads, q_len = query.shape[1], query.shape[2]
        if out.dim() != 4 or out.shape[1] != q_len or out.shape[2] != heads:
            raise InspectorError(
                f"{type(module).__name__} at {name} returned attention output of shape {tuple(out.shape)}, not "
                f"[batch, query={q_len}, head={heads}, d_v]: heads cannot be edited at this site")
        self.seen[name] = heads
        start = self._position.get(name, 0)
        self._position[name] = start + q_len
        if self.record is True or (self.record and name in self.record):
            self.outputs[name] = out.detach()
        out = self._edit(name, out, start)
        if self.grad:
            delta = torch.zeros_like(out, requires_grad=True)
            self.deltas[name] = delta
            out = out + delta
        return out, w

    def _edit(self, name: str, out: torch.Tensor, start: int) -> torch.Tensor:
        """``out [batch, query, head, d_v]`` (query positions ``start ..`` of the site) with the zeroed and
        replaced heads of ``name`` applied."""
        if name in self.zero or name in self.replace or name in self.zero_rows:
            keep = torch.ones(out.shape[0], out.shape[2], dtype=out.dtype, device=out.device)
            if name in self.zero:
                keep[:, self.zero[name]] = 0
            for row, head in self.zero_rows.get(name, ()):
                keep[row, head] = 0
            out = out * keep[:, None, :, None]
            r = self.replace.get(name)
            if r is not None:
                out = _apply(out, r, start)
        return out

    # ---- long-document attention: edited at its output projection's input (inspector.intervene.long_sites) ----
    def note_source(self, _module, args, kwargs) -> None:
        """Remember the source length of a pass (a forward pre-hook on the encoder, or the model without one):
        the long-document modules run on padded sequences, and their query axis is the tokens."""
        ids = kwargs.get("input_ids")
        ids = ids if ids is not None else kwargs.get("inputs_embeds")
        ids = ids if ids is not None else (args[0] if args and isinstance(args[0], torch.Tensor) else None)
        if ids is not None:
            self.source_len = int(ids.shape[1])

    def long_call(self, point: long_sites.EditPoint, module, args, kwargs) -> None:
        """A forward pre-hook on a long-document attention module: name this call as the capture does, map its
        projection's input to the site's query axis, and describe the site to the recorder."""
        call = self._calls.get(id(module), 0)
        self._calls[id(module)] = call + 1
        name = point.name if call == 0 else f"{point.name}@{call}"
        if self.source_len is None and type(module).__name__ not in long_sites.DECODER_CLASSES:
            raise InspectorError(f"{type(module).__name__} at {name} ran before its encoder's input was seen: run the "
                                 "model through its encoder (or the whole model) under the seam")
        lay = long_sites.layout(module, args, kwargs, self.source_len, start=self._position.get(name, 0))
        if lay.decoder:
            self._position[name] = lay.start + lay.query_len
        self.seen[name] = point.heads
        self._pending[id(point.proj)] = _LongCall(point=point, name=name, layout=lay)
        if self.recorder is not None:
            self.recorder.sites.append(long_sites.site_record(point, name, site_depth(None, point.name, call),
                                                              self.recorder.encoder_decoder, lay=lay))
            for role, count in lay.pseudo.items():
                self.pseudo[role] = count

    def long_edit(self, point: long_sites.EditPoint, proj, args, kwargs):
        """A forward pre-hook on the projection: record, edit and (with ``grad``) add the zero delta to the
        per-head outputs of the pending call's rows, ``[batch, query, head, d_v]`` on the site's query axis."""
        st = self._pending.get(id(proj))
        if st is None:  # the projection ran outside a call of its module
            return None
        offset, rows = st.layout.segments[st.next]
        st.next += 1
        if st.next == len(st.layout.segments):
            del self._pending[id(proj)]
        x = args[0] if args else kwargs["input"]
        b, length, width = x.shape
        x4 = x.reshape(b, length, point.heads, point.d_v)
        rows = rows.to(x.device)
        out = x4.index_select(1, rows)  # [batch, query of this segment, head, d_v]
        total, name, first = st.layout.query_len, st.name, st.next == 1
        at = slice(offset - st.layout.start, offset - st.layout.start + out.shape[1])  # this call's rows
        if self.record is True or (self.record and name in self.record):
            if first:
                self.outputs[name] = out.new_zeros(b, total, point.heads, point.d_v)
            self.outputs[name][:, at] = out.detach()
        out = self._edit(name, out, offset)
        if self.grad:
            if first:
                self.deltas[name] = torch.zeros(b, total, point.heads, point.d_v, dtype=out.dtype, device=out.device,
                                                requires_grad=True)
            out = out + self.deltas[name][:, at]
        x4 = x4.index_copy(1, rows, out.to(x4.dtype))
        x = x4.reshape(b, length, width)
        return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "input": x})


@dataclass
class _LongCall:
    """A long-document module's call whose projection has not consumed every segment yet."""

    point: long_sites.EditPoint
    name: str
    layout: long_sites.Layout
    next: int = 0


def _apply(out: torch.Tensor, r: Replacement, start: int) -> torch.Tensor:
    """``out`` with ``r``'s heads replaced by its values at query positions ``start ..``."""
    q_len = out.shape[1]
    vals = r.values.to(device=out.device, dtype=out.dtype)
    if vals.shape[1] == 1:  # a constant over positions
        vals = vals.expand(out.shape[0], q_len, *vals.shape[2:])
        where = torch.ones(q_len, dtype=torch.bool, device=out.device)
    else:
        n = max(0, min(q_len, vals.shape[1] - start))
        if n == 0:
            return out
        vals = torch.cat([vals[:, start:start + n], vals.new_zeros(vals.shape[0], q_len - n, *vals.shape[2:])], 1)
        where = torch.zeros(q_len, dtype=torch.bool, device=out.device)
        where[:n] = True if r.positions is None else r.positions[start:start + n].to(out.device)
        if vals.shape[0] != out.shape[0]:  # beams of one row
            vals = vals.expand(out.shape[0], *vals.shape[1:])
    index = torch.as_tensor(r.heads, device=out.device)
    mixed = torch.where(where[None, :, None, None], vals, out.index_select(2, index))
    return out.index_copy(2, index, mixed)


@contextlib.contextmanager
def seam(model, s: Seam):
    """Route every attention call of ``model`` through ``s`` for the duration (restored on exit): calls of
    transformers' attention interface, and the per-head outputs of the long-document modules
    :mod:`inspector.intervene.long_sites` knows, where they enter their output projection."""
    with model_alone(model):  # its hooks see every pass: where threads share the model, it runs alone
        s._names = {id(m): n for n, m in model.named_modules()}
        s._pending.clear()
        hooks = [model.register_forward_pre_hook(s.reset_calls)]
        encoder = model.get_encoder() if hasattr(model, "get_encoder") and getattr(model.config, "is_encoder_decoder", False) else None
        if encoder is not None and encoder is not model:  # generate() runs the encoder on its own
            hooks.append(encoder.register_forward_pre_hook(s.reset_calls))
        try:
            points = long_sites.edit_points(model)
            if points:
                hooks.append((encoder if encoder is not None else model).register_forward_pre_hook(s.note_source, with_kwargs=True))
            for p in points:
                hooks.append(p.module.register_forward_pre_hook(functools.partial(s.long_call, p), with_kwargs=True))
                hooks.append(p.proj.register_forward_pre_hook(functools.partial(s.long_edit, p), with_kwargs=True))
            with LOCK, registered_functions(), attn_implementation(model, IMPL):
                token = ACTIVE.set(s)
                try:
                    yield s
                finally:
                    ACTIVE.reset(token)
        finally:
            for h in hooks:
                h.remove()
            s._pending.clear()


@contextlib.contextmanager
def frozen(model):
    """Parameters do not require grad for the duration (only activation gradients are computed)."""
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        for p in params:
            p.requires_grad_(False)
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


@dataclass
class SeamRun:
    """One teacher-forced forward pass through a seam: the model's own output, the lazy capture of the
    pass (sites, input records; Q/K/V of every site) and what the seam recorded."""

    output: Any
    capture: Capture
    seam: Seam


def run(model, encoded: Encoded, s: Seam | None = None, *, meta: dict | None = None, extra: dict | None = None) -> SeamRun:
    """One forward pass of ``model`` on ``encoded`` through ``s`` (a plain pass when ``s`` is empty).

    A lazy recorder names and describes every site as :func:`inspector.capture` does; with
    ``s.grad`` the pass keeps the autograd graph from the head outputs on (parameters frozen).
    ``extra``: more keyword arguments for the model (e.g. ``logits_to_keep``).
    Long-document attention modules (:mod:`inspector.intervene.long_sites`) get sites too, with the query axis
    the capture gives them (pseudo-inputs such as Pegasus-X's ``global`` tokens are added to the inputs).
    Raises :class:`InspectorError` when the model's attention bypasses transformers' interface and has no
    edit point, or when ``s`` edits a site that did not run in this pass (nothing is reported as edited then).
    """
    s = s or Seam()
    s.recorder = Recorder(model, weights=False, dtype=torch.float32, layers=None, sites=None, roles=roles_of(encoded))
    grad = torch.enable_grad() if s.grad else torch.no_grad()
    with eval_mode(model), seam(model, s), grad, frozen(model) if s.grad else contextlib.nullcontext():
        output = model(**encoded.model_kwargs, **(extra or {}), use_cache=False)
    if not s.recorder.sites:
        raise InspectorError(
            f"{type(model).__name__}'s attention does not call transformers' attention interface, so its heads "
            "cannot be ablated or patched: use a model whose attention layers call ALL_ATTENTION_FUNCTIONS")
    unedited = [n for n in [*s.zero, *s.replace, *s.zero_rows] if n not in s.seen]
    if unedited:  # never report an edit that did not happen
        raise InspectorError(f"{unedited[0]} did not run in this pass, so its heads were not edited: pick heads of "
                             f"{editable_sites(s.recorder.sites)}")
    batch = 1 + max(r.batch for r in encoded.records)
    pseudo = [p for role, count in s.pseudo.items() for p in pseudo_records(role, count, batch)]
    records = [{f: getattr(r, f) for f in r.__dataclass_fields__} for r in [*encoded.records, *pseudo]]
    cap = Capture({**(meta or {}), "layout": encoded.layout, "inputs": records}, s.recorder.sites, s.recorder.tensors)
    s.recorder = None
    return SeamRun(output=output, capture=cap, seam=s)


# ---- heads -----------------------------------------------------------------------------------
def check_heads(sites: list[Site], heads: list[tuple[str, int]], model=None) -> dict[str, list[int]]:
    """Group ``heads`` by site after checking each exists; raises :class:`InspectorError` naming the fix.

    ``sites`` are the seam run's (each has a per-head edit point on this input); a refusal names a few of them.
    With ``model``, an attention module of it that is no seam site (it computes attention outside
    transformers' interface and has no per-head edit point in :data:`inspector.intervene.long_sites.EDIT_POINTS`,
    e.g. BigBird-Pegasus's full attention on a short input, DeBERTa's) is refused as such, by class."""
    by_name = {s.name: s for s in sites}
    grouped: dict[str, list[int]] = {}
    for name, h in heads:
        site = by_name.get(name)
        module = dict(model.named_modules()).get(name.split("@")[0]) if site is None and model is not None else None
        if module is not None and type(module).__name__.endswith(("Attention", "Attn")):
            raise InspectorError(f"{name} ({type(module).__name__}) computes attention outside transformers' attention "
                                 "interface and has no per-head edit point (inspector edits LED, Longformer, Pegasus-X, "
                                 "LongT5 and BigBird block-sparse encoder heads at their output projection): its heads "
                                 f"cannot be ablated or patched; pick heads of {editable_sites(sites)}")
        if site is None:
            import difflib

            near = difflib.get_close_matches(name, list(by_name), n=3, cutoff=0.4)
            hint = f"; nearest: {', '.join(near)}" if near else ""
            raise InspectorError(f"{name!r} is not an attention site of this model with an edit point{hint}; pick heads "
                                 f"of {editable_sites(sites)}")
        if not 0 <= h < site.num_heads:
            raise InspectorError(f"{name} has heads 0..{site.num_heads - 1}, not {h}: pick a head in that range")
        if h not in grouped.setdefault(name, []):
            grouped[name].append(h)
    return grouped


def editable_sites(sites: list[Site], shown: int = 4) -> str:
    """``"the N sites that can be edited on this input, e.g. A, B, C, D"`` (the first ``shown`` names of
    ``sites``, a seam run's), or a sentence saying none can be when the run has none."""
    if not sites:
        return "a site that can be edited (none can on this input)"
    names = [s.name for s in sites]
    more = ", ..." if len(names) > shown else ""
    return (f"the {len(names)} site{'s' if len(names) != 1 else ''} that can be edited on this input, e.g. "
            f"{', '.join(names[:shown])}{more}")


def query_padding(capture: Capture, site: Site, batch: int) -> torch.Tensor:
    """``[query]`` bool, True at padding positions of the site's query axis in batch row ``batch``."""
    return torch.tensor([rec.padding[i] for rec, i in capture.axis(site, "query", batch)], dtype=torch.bool)


def head_means(capture: Capture, outputs: dict[str, torch.Tensor], heads: dict[str, list[int]]) -> dict[str, Replacement]:
    """Mean ablation values: per batch row, each head's output averaged over the site's non-padding
    query positions of the recorded (clean) pass; ``[batch, 1, head, d_v]`` constants."""
    out = {}
    for name, hs in heads.items():
        site = capture.site(name)
        o = outputs[name][:, :, hs].float()  # [batch, query, head, d_v]
        rows = []
        for b in range(o.shape[0]):
            real = ~query_padding(capture, site, b).to(o.device)
            rows.append(o[b, real].mean(0, keepdim=True))
        out[name] = Replacement(heads=list(hs), values=torch.stack(rows).to(outputs[name].dtype))
    return out


def ablation(capture: Capture, heads: dict[str, list[int]], method: str,
             outputs: dict[str, torch.Tensor] | None = None) -> Seam:
    """A seam that ablates ``heads`` by ``method`` (``zero`` or ``mean``; the latter needs the clean
    pass's ``outputs`` of those sites)."""
    if method not in METHODS:
        raise InspectorError(f"unknown ablation method {method!r}: use zero or mean")
    if method == "zero":
        return Seam(zero={k: list(v) for k, v in heads.items()})
    return Seam(replace=head_means(capture, outputs or {}, heads))


def clean_pass(model, encoded: Encoded, record: set[str] | bool = False) -> SeamRun:
    """The unedited forward pass (recording the given sites' outputs)."""
    return run(model, encoded, Seam(record=record))
