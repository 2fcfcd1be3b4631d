"""Rerun only what an edit changes (issue 42): a clean pass kept so that an ablated or patched pass starts where
the edit is.

Editing a head of layer L changes nothing that ran before layer L: not the layers below it, and not an
encoder-decoder's encoder when the head is in the decoder (its self- or cross-attention). :func:`record` runs
the clean pass once and keeps, family-independently, at the seam this package owns:

* the output of every **layer call** (the elements of the outermost ``nn.ModuleList`` that holds the attention
  sites: a decoder's blocks, an encoder's and a decoder's layers, in call order), a prefix of them within a
  memory bound (``memory_gib``);
* the output of every **leaf module call that reads only what an edit below it cannot change** and is not the
  layer's own residual input: the key and value projections of cross-attention, which read the encoder's output
  (``memo``, within the same bound).

:meth:`Recording.run` then reruns the model with the layer calls before the edited layer returning their kept
outputs (their forward is not called) and the kept leaf calls returning theirs when they are handed the very
same input tensor, unmodified (object identity and version counter); everything else is computed as in a plain
pass. So a head in layer L reruns layers L..N, and a decoder head of an encoder-decoder reruns the decoder
without its cross-attention's key and value projections. With a logit contrast the LM head computes only the
two logits the metric reads (``narrow``). Several edits of one start layer run as one batch (``zero_rows``: batch
row i ablates head i), as many as the memory bound leaves room for (:func:`batch_for`): on a GPU, and on a CPU
too, where it measured faster (a BART-large-shaped decoder's 384 heads: 4.3 forward-equivalents 16 a pass, 1.1
at 64 a pass; docs/interventions.md).

The kept outputs are returned as they are, never copied: a pass that changed one in place would make every later
rerun wrong, so each rerun checks every kept tensor's version counter and raises :class:`Stale` if one moved
(:func:`inspector.intervene.effects.exact_effects` then falls back to full passes). A model is rerun this way
only when its family is in :data:`FAMILIES` (each tested equal to full passes within 1e-5,
``tests/test_reruns.py``) and its clean pass called every layer and site module once; else
:attr:`Recording.reason` says why not and reruns are full passes.

Costs (:meth:`Recording.cost`) are counted, not timed, so a choice made from them is the same on every run:
multiply-adds of every leaf module call with a weight (rows x weight size) and of every attention site (heads x
query x key x (d_head + d_v)), as a fraction of the clean pass's (forward-equivalents).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch

from inspector.capture.inputs import Encoded
from inspector.capture.interface import eval_mode
from inspector.capture.recorder import Recorder, roles_of
from inspector.intervene import seam as intervene
from inspector.store.capture_file import Site

# model types whose reruns are tested equal to full passes (tests/test_reruns.py)
FAMILIES = frozenset({
    "gpt2", "llama", "mistral", "gemma2", "qwen2", "opt", "gpt_neox", "bert", "bart", "pegasus", "t5",
    "led", "longformer", "pegasus_x", "longt5", "bigbird_pegasus", "big_bird",
})
MEMORY_GIB = 2.0  # the default bound on what a recording keeps plus one batch's activations
MAX_BATCH = 64  # at most this many edits a pass (fewer when the memory bound says so), on a CPU too: measured faster


class Stale(RuntimeError):
    """A kept tensor was changed in place by a rerun: the recording cannot be trusted any more."""


@dataclass
class _Entry:
    """A kept leaf call: the stable tensors it read, their versions then, its output and the last layer call
    whose output those inputs depend on (-1: the model's inputs alone)."""

    inputs: tuple[torch.Tensor, ...]
    versions: tuple[int, ...]
    output: torch.Tensor
    dep: int
    flops: float
    at: int  # the layer call it ran in (-1: outside every layer call)


@dataclass
class _Call:
    """One layer call of the clean pass: its module, its output (None when not kept) and the multiply-adds in it."""

    module: Any
    name: str
    output: Any = None
    flops: float = 0.0
    width: int = 0  # bytes of the leaf outputs inside it (one batch row)
    versions: tuple[int, ...] = ()  # the kept output's tensors' version counters when it was kept


@dataclass
class Recording:
    """What :func:`record` kept of one clean pass (module docstring). ``output``: the model's output;
    ``seam``: the clean pass's seam (its ``outputs``: the recorded sites' per-head outputs ``[batch, query, head,
    d_v]``); ``reason``: why reruns are full passes (None: they reuse the pass); ``kept``: how many layer calls, in
    call order, have their output kept; ``bytes``: what the kept tensors take."""

    model: Any
    encoded: Encoded
    output: Any
    seam: intervene.Seam
    extra: dict = field(default_factory=dict)
    calls: list[_Call] = field(default_factory=list)
    site_call: dict[str, int] = field(default_factory=dict)
    memo: dict[int, list[_Entry]] = field(default_factory=dict)
    modules: dict[int, Any] = field(default_factory=dict)
    outside: float = 0.0  # multiply-adds of leaf calls outside every layer, the LM head's apart
    encoder: Any = None  # an encoder-decoder's encoder module, when its output is kept
    encoder_output: Any = None
    encoder_at: int = -1  # the layer calls done when the encoder returned (a rerun from there on skips it)
    encoder_outside: float = 0.0  # multiply-adds of its leaf calls outside its layers
    head: float = 0.0  # the LM head's
    attention: dict[str, float] = field(default_factory=dict)  # site -> its attention's multiply-adds
    total: float = 0.0
    kept: int = 0
    bytes: int = 0
    logits: int = 0  # a batch row's logits: bytes
    memory: int = 0  # the bound, bytes
    reason: str | None = None
    _encoder_versions: list = field(default_factory=list)

    @property
    def reusable(self) -> bool:
        """Whether reruns start at the edited layer (else they are full passes)."""
        return self.reason is None

    def start(self, sites) -> int:
        """The first layer call a rerun editing ``sites`` (names) must run: the earliest of theirs (0 when one is
        not inside a layer call, or reruns are full passes)."""
        if not self.reusable:
            return 0
        return min((self.site_call.get(str(s).split("@")[0], 0) for s in sites), default=0)

    def cost(self, sites, narrow: bool = False) -> float:
        """Forward-equivalents of a rerun editing ``sites``: the multiply-adds it computes over the clean pass's
        (counted, module docstring); ``narrow``: the LM head computes the metric's two logits only."""
        if not self.total:
            return 1.0
        k = min(self.start(sites), self.kept)
        run = sum(c.flops for c in self.calls[k:]) + self.outside + (0.0 if narrow else self.head)
        if self._skips_encoder(k):
            run -= self.encoder_outside
        saved = sum(e.flops for es in self.memo.values() for e in es if e.dep < k and (e.at < 0 or e.at >= k))
        return max(0.0, run - saved) / self.total

    def run(self, s: intervene.Seam, sites, *, batch: int = 1, narrow: tuple[int, list[int]] | None = None) -> Any:
        """The model's output on the recorded input (``batch`` copies of it, one edit a row where ``s`` says so,
        ``zero_rows``) through ``s``, rerunning from :meth:`start` of ``sites``; ``narrow``: ``(row of the LM
        head's input, token ids)``, the only logits computed (the rest are 0). No grad. Raises :class:`Stale`
        when the pass changed a kept tensor in place."""
        k = min(self.start(sites), self.kept)
        shown = _Shown(batch)
        kwargs = {n: shown.of(v) for n, v in self.encoded.model_kwargs.items()}
        with contextlib.ExitStack() as stack:
            if self._skips_encoder(k):
                stack.enter_context(_replaced(self.encoder, _returning(shown.of(self.encoder_output))))
            for call in self.calls[:k]:
                stack.enter_context(_replaced(call.module, _returning(shown.of(call.output))))
            for key, entries in self.memo.items():
                usable = [e for e in entries if e.dep < k]
                if usable:
                    stack.enter_context(_replaced(self.modules[key], _memoised(self.modules[key], usable, shown)))
            if narrow is not None:
                stack.enter_context(_narrowed(self.model, *narrow))
            stack.enter_context(eval_mode(self.model))
            stack.enter_context(_lazy(self.model, self.encoded, s))
            stack.enter_context(intervene.seam(self.model, s))
            stack.enter_context(torch.no_grad())
            out = self.model(**kwargs, **self.extra, use_cache=False)
        self.check()
        unedited = [n for n in [*s.zero, *s.replace, *s.zero_rows] if n not in s.seen]
        if unedited:
            raise Stale(f"{unedited[0]} did not run in the rerun")
        return out

    def _skips_encoder(self, k: int) -> bool:
        return self.encoder is not None and 0 <= self.encoder_at <= k

    def rows_fit(self, sites) -> int:
        """How many batch rows of a rerun editing ``sites`` the memory bound leaves room for, after what is kept
        (a row's activations estimated from the widest layer call the rerun runs, four times over, and its
        logits)."""
        k = min(self.start(sites), self.kept)
        widest = max((c.width for c in self.calls[k:]), default=0)
        per_row = 4 * widest + self.logits
        return max(0, self.memory - self.bytes) // max(1, per_row)

    def check(self) -> None:
        """Raise :class:`Stale` when a kept tensor's version counter moved since it was kept."""
        for call in self.calls[:self.kept]:
            if tuple(t._version for t in _tensors(call.output)) != call.versions:
                raise Stale(f"the kept output of {call.name} was changed in place")
        for t, v in self._encoder_versions:
            if t._version != v:
                raise Stale("the kept encoder output was changed in place")
        for entries in self.memo.values():
            for e in entries:
                if tuple(t._version for t in e.inputs) != e.versions:
                    raise Stale("a kept leaf call's input was changed in place")


class _Shown:
    """The tensors a rerun of ``batch`` rows is handed: a kept tensor itself for one row, else one expanded view of
    it (the same view every time it is asked for, so identity still tells a kept input)."""

    def __init__(self, batch: int):
        self.batch, self.views = batch, {}

    def of(self, value):
        if self.batch == 1:
            return value
        if isinstance(value, torch.Tensor):
            if value.dim() == 0 or value.shape[0] != 1:
                return value
            got = self.views.get(id(value))
            if got is None or got[0] is not value:
                got = (value, value.expand(self.batch, *value.shape[1:]))
                self.views[id(value)] = got
            return got[1]
        if isinstance(value, tuple):
            return tuple(self.of(v) for v in value)
        if isinstance(value, list):
            return [self.of(v) for v in value]
        if _model_output(value):
            return type(value)(**{k: self.of(v) for k, v in value.items()})
        return value


def _model_output(value) -> bool:
    from transformers.utils import ModelOutput

    return isinstance(value, ModelOutput)


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if _model_output(value):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _versions(value) -> list[tuple[torch.Tensor, int]]:
    return [(t, t._version) for t in _tensors(value)]


def _plain(value) -> bool:
    """A layer output this module can keep and hand back: a tensor, None, or tuples and lists of them."""
    if value is None or isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (tuple, list)) and type(value) in (tuple, list) and all(_plain(v) for v in value)


def _returning(output):
    def forward(*_args, **_kwargs):
        return output

    return forward


def _memoised(module, entries: list[_Entry], shown: _Shown):
    own = type(module).forward.__get__(module) if "forward" not in module.__dict__ else module.__dict__["forward"]
    cases = [(tuple(shown.of(t) for t in e.inputs), shown.of(e.output)) for e in entries]

    def forward(*args, **kwargs):
        got = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        for inputs, output in cases:
            if len(got) == len(inputs) and all(a is b for a, b in zip(got, inputs, strict=True)):
                return output
        return own(*args, **kwargs)

    return forward


@contextlib.contextmanager
def _replaced(module, forward):
    """``module.forward`` is ``forward`` for the block (its hooks still run); an instance attribute it had is put
    back on exit."""
    had = module.__dict__.get("forward")
    module.forward = forward
    try:
        yield
    finally:
        if had is not None:
            module.forward = had
        else:
            del module.forward


def _lm_head(model):
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return head if type(head) is torch.nn.Linear else None


@contextlib.contextmanager
def _narrowed(model, row: int, ids: list[int]):
    """The LM head computes the logits of ``ids`` at input row ``row`` only (every other logit 0)."""
    head = _lm_head(model)
    if head is None:
        yield
        return
    index = torch.as_tensor(ids, dtype=torch.long, device=head.weight.device)
    w = head.weight.index_select(0, index)
    b = head.bias.index_select(0, index) if head.bias is not None else None

    def forward(x):
        out = x.new_zeros(*x.shape[:-1], head.weight.shape[0])
        sel = torch.nn.functional.linear(x[:, row], w, b)
        out[:, row, index] = sel
        return out

    with _replaced(head, forward):
        yield


def narrow_for(model, c, kept: bool) -> tuple[int, list[int]] | None:
    """``(row, ids)`` for :meth:`Recording.run` with the contrast ``c``
    (:class:`inspector.intervene.contrast.Contrast`): its row (the last with ``kept``, ``logits_to_keep``) and its two
    token ids, where it is a logit contrast and the model's LM head a plain ``nn.Linear``; else None."""
    if getattr(c, "kind", None) != "logit" or _lm_head(model) is None:
        return None
    return (-1 if kept else c.row), [c.right_id, c.wrong_id]


@contextlib.contextmanager
def _lazy(model, encoded: Encoded, s: intervene.Seam):
    """``s`` computes each attention call by a lazy recorder, as :func:`inspector.intervene.seam.run` does (sdpa
    where the model ran sdpa, else its eager function: made before the seam switches the model's attention), so
    the numbers are those of a full seam pass; the recorder is dropped on exit."""
    s.recorder = Recorder(model, weights=False, dtype=torch.float32, layers=None, sites=None, roles=roles_of(encoded))
    s.recorder.shared = True  # its Q, K, V are never saved: no copies (a batch's cross-attention keys are large)
    try:
        yield
    finally:
        s.recorder = None


def _layer_lists(model, names) -> set[str]:
    """The outermost ``nn.ModuleList`` paths that hold one of the sites ``names`` (module paths)."""
    modules = dict(model.named_modules())
    lists = set()
    for name in names:
        parts = name.split("@")[0].split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parts[i].isdigit() and isinstance(modules.get(parent), torch.nn.ModuleList):
                lists.add(parent)
                break
    return lists


def _attention_lists(model) -> set[str]:
    """The outermost ``nn.ModuleList`` paths some element of which holds a module whose class is named
    ``...Attention`` or ``...Attn`` (before a pass has named the sites)."""
    names = [n for n, m in model.named_modules() if type(m).__name__.endswith(("Attention", "Attn"))]
    return _layer_lists(model, names)


def _detached(value, known: dict | None = None):
    """``value`` (a layer's or an encoder's output) with every tensor detached from any graph (``known``: id -> the
    tensor already kept for it, used instead)."""
    known = known or {}
    if isinstance(value, torch.Tensor):
        return known.get(id(value), value.detach())
    if isinstance(value, tuple) and type(value) is tuple:
        return tuple(_detached(v, known) for v in value)
    if isinstance(value, list):
        return [_detached(v, known) for v in value]
    if _model_output(value):
        return type(value)(**{k: _detached(v, known) for k, v in value.items()})
    return value


def _leaf_flops(module, args, output) -> float:
    w = getattr(module, "weight", None)
    x = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if isinstance(module, torch.nn.Embedding) or x is None:
        return float(output.numel()) if isinstance(output, torch.Tensor) else 0.0
    if isinstance(w, torch.Tensor) and w.dim() == 2:
        inner = w.shape[1] if isinstance(module, torch.nn.Linear) else w.shape[0]  # Conv1D keeps [in, out]
        return float(x.numel() // max(1, x.shape[-1])) * float(w.numel()) if x.shape[-1] == inner else float(x.numel())
    return float(x.numel())


class _Watch:
    """The hooks of the recording pass: layer calls, leaf calls and site modules, what to keep, the costs."""

    def __init__(self, rec: Recording, layers: dict[int, str], lm_head):
        self.rec, self.layers, self.lm_head = rec, layers, lm_head
        # id -> (the pass's tensor, the layer call it depends on, the tensor kept for it: detached from any graph)
        self.stable: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}
        self.current: int | None = None
        self.residual: set[int] = set()
        self.count: dict[int, int] = {}
        self.done = 0
        self.encoder = None
        self.in_encoder = False

    def note_inputs(self, kwargs: dict) -> None:
        for t in _tensors(list(kwargs.values())):
            self.stable[id(t)] = (t, -1, t)

    def _refuse(self, why: str) -> None:
        if self.rec.reason is None:
            self.rec.reason = why

    def layer_pre(self, module, args, kwargs):
        key = id(module)
        self.count[key] = self.count.get(key, 0) + 1
        if self.count[key] > 1:
            self._refuse(f"{self.layers[key]} runs more than once a pass")
        if self.current is not None:
            self._refuse(f"{self.layers[key]} runs inside another layer")
        self.current = len(self.rec.calls)
        self.rec.calls.append(_Call(module=module, name=self.layers[key]))
        first = args[0] if args else kwargs.get("hidden_states")
        self.residual = {id(first)} if isinstance(first, torch.Tensor) else set()

    def layer_post(self, module, args, kwargs, output):
        i, self.current, self.residual = self.current, None, set()
        if i is None:
            return
        self.done = i + 1
        if not _plain(output):
            self._refuse(f"{self.layers[id(module)]} returns a {type(output).__name__}, which a rerun cannot hand back")
            return
        size = sum(t.numel() * t.element_size() for t in _tensors(output))
        if self.rec.kept == i and self.rec.bytes + size <= self.rec.memory:
            kept = _detached(output)
            self.rec.calls[i].output = kept
            self.rec.calls[i].versions = tuple(t._version for t in _tensors(kept))
            self.rec.kept = i + 1
            self.rec.bytes += size
            for t, k in zip(_tensors(output), _tensors(kept), strict=True):
                self.stable[id(t)] = (t, i, k)

    def leaf_post(self, module, args, kwargs, output):
        flops = _leaf_flops(module, args, output)
        if self.current is not None:
            self.rec.calls[self.current].flops += flops
            if isinstance(output, torch.Tensor):
                self.rec.calls[self.current].width += output.numel() * output.element_size()
        elif module is self.lm_head:
            self.rec.head += flops
        else:
            self.rec.outside += flops
            if self.in_encoder:
                self.rec.encoder_outside += flops
        self._maybe_keep(module, args, kwargs, output, flops)

    def _maybe_keep(self, module, args, kwargs, output, flops) -> None:
        ins = _tensors([*args, *kwargs.values()])
        if not ins or module is self.lm_head or not isinstance(output, torch.Tensor):
            return
        known = [self.stable.get(id(t)) for t in ins]
        if any(k is None or k[0] is not t or id(t) in self.residual for k, t in zip(known, ins, strict=True)):
            return
        dep = max(k[1] for k in known)
        here = self.current if self.current is not None else self.done
        size = output.numel() * output.element_size()
        if dep >= here or dep >= self.rec.kept or self.rec.bytes + size > self.rec.memory:
            return  # no rerun could hand it the same input, or it does not fit
        kept = output.detach()
        self.rec.memo.setdefault(id(module), []).append(
            _Entry(inputs=tuple(k[2] for k in known), versions=tuple(t._version for t in ins), output=kept, dep=dep,
                   flops=flops, at=-1 if self.current is None else self.current))
        self.rec.modules[id(module)] = module
        self.rec.bytes += size
        self.stable[id(output)] = (output, dep, kept)

    def encoder_pre(self, _module, _args):
        self.in_encoder = True

    def encoder_post(self, module, _args, output):
        self.in_encoder = False
        size = sum(t.numel() * t.element_size() for t in _tensors(output))
        plain = _plain(output) or (_model_output(output) and all(_plain(v) for v in output.values()))
        if plain and self.rec.encoder_at < 0 and self.rec.kept == self.done and self.rec.bytes + size <= self.rec.memory:
            known = [self.stable.get(id(t)) for t in _tensors(output)]
            kept = _detached(output, {id(k[0]): k[2] for k in known if k is not None and k[0] is not None})
            self.rec.encoder, self.rec.encoder_output, self.rec.encoder_at = module, kept, self.done
            self.rec.bytes += size
            self.rec._encoder_versions = _versions(kept)
            for t, k in zip(_tensors(output), _tensors(kept), strict=True):
                self.stable.setdefault(id(t), (t, self.done - 1, k))

    def install(self, model, hooks: list) -> None:
        """The recording pass's hooks on ``model``, appended to ``hooks`` as they are made (for removal): its
        layers, every leaf module with a parameter, an encoder-decoder's encoder."""
        encoder = model.get_encoder() if getattr(model.config, "is_encoder_decoder", False) and hasattr(model, "get_encoder") \
            else None
        if encoder is not None and encoder is not model:
            hooks.append(encoder.register_forward_pre_hook(self.encoder_pre))
            hooks.append(encoder.register_forward_hook(self.encoder_post))
        for m in model.modules():
            if id(m) in self.layers:
                hooks.append(m.register_forward_pre_hook(self.layer_pre, with_kwargs=True))
                hooks.append(m.register_forward_hook(self.layer_post, with_kwargs=True))
            if not any(True for _ in m.children()) and any(True for _ in m.parameters(recurse=False)):
                hooks.append(m.register_forward_hook(self.leaf_post, with_kwargs=True))


def record(model, encoded: Encoded, sites: list[Site], s: intervene.Seam | None = None, *, extra: dict | None = None,
           memory_gib: float | None = None) -> Recording:
    """The clean pass of ``model`` on ``encoded`` through ``s`` (e.g. recording the sites a mean ablation needs),
    keeping what :meth:`Recording.run` reuses (module docstring) within ``memory_gib`` (default
    :data:`MEMORY_GIB`; what is not kept is rerun). ``sites``: the pass's attention sites (a seam run's capture's),
    whose layers are the calls kept. ``extra``: more keyword arguments for every pass (e.g. ``logits_to_keep``).
    No grad. Raises :class:`~inspector.errors.InspectorError` as :func:`inspector.intervene.seam.run` does for an
    edit of a site that did not run."""
    s = s or intervene.Seam()
    with watching(model, encoded, [x.name for x in sites], extra=extra, memory_gib=memory_gib) as rec:
        with eval_mode(model), _lazy(model, encoded, s), intervene.seam(model, s), torch.no_grad():
            output = model(**encoded.model_kwargs, **rec.extra, use_cache=False)
    return finished(rec, output, s, sites)


@contextlib.contextmanager
def watching(model, encoded: Encoded, names: list[str] | None = None, *, extra: dict | None = None,
             memory_gib: float | None = None):
    """Keep what :meth:`Recording.run` reuses of the one pass of ``model`` on ``encoded`` that the block runs (a
    seam run, with grad or without: what is kept is detached), within ``memory_gib``; then :func:`finished` with
    that pass's output, seam and sites. ``names``: the sites' module paths, whose outermost layer lists are kept
    (None: the outermost ``nn.ModuleList`` whose elements hold a module named ``...Attention`` or ``...Attn``).
    ``extra``: the keyword arguments the pass gives the model besides ``encoded``'s, which every rerun gives too."""
    gib = MEMORY_GIB if memory_gib is None else float(memory_gib)
    rec = Recording(model=model, encoded=encoded, output=None, seam=intervene.Seam(), extra=dict(extra or {}),
                    memory=int(gib * 2 ** 30))
    family = getattr(model.config, "model_type", "")
    if family not in FAMILIES:
        rec.reason = f"reruns of {family!r} models are not tested equal to full passes: each edit reruns the whole model"
    modules = dict(model.named_modules())
    lists = _layer_lists(model, names) if names is not None else _attention_lists(model)
    layers = {id(m): f"{p}.{i}" for p in lists for i, m in enumerate(modules[p])}
    if not layers:
        rec.reason = rec.reason or "no attention site is inside a layer list"
    watch = _Watch(rec, layers, _lm_head(model))
    watch.note_inputs(encoded.model_kwargs)
    hooks: list = []
    try:
        watch.install(model, hooks)
        yield rec
    finally:
        for h in hooks:
            h.remove()


def finished(rec: Recording, output, s: intervene.Seam, sites: list[Site]) -> Recording:
    """``rec`` (from :func:`watching`) completed with its pass's ``output``, seam ``s`` (its recorded site outputs
    serve a mean ablation) and ``sites`` (the pass's capture's): each site's layer call, the costs."""
    rec.output, rec.seam = _detached(output), s
    if any("@" in x.name for x in sites):
        rec.reason = rec.reason or "a site runs more than once a pass"
    for x in sites:
        path = x.name.split("@")[0]
        at = next((i for i, c in enumerate(rec.calls) if path == c.name or path.startswith(c.name + ".")), None)
        if at is not None:
            rec.site_call[path] = at
    _settle(rec, sites)
    return rec


def _settle(rec: Recording, sites: list[Site]) -> None:
    """After the recording pass: the attention's multiply-adds added to their layer calls, the totals, and nothing
    kept where reruns are full passes."""
    for x in sites:
        if x.name in rec.seam.seen:
            rec.attention[x.name] = float(x.num_heads * x.query_len * x.key_len * (x.d_head + x.d_v))
    for name, flops in rec.attention.items():
        i = rec.site_call.get(name.split("@")[0])
        if i is not None:
            rec.calls[i].flops += flops
        else:
            rec.outside += flops
    rec.total = sum(c.flops for c in rec.calls) + rec.outside + rec.head
    logits = getattr(rec.output, "logits", None)
    rec.logits = logits.numel() * logits.element_size() if isinstance(logits, torch.Tensor) else 0
    if rec.reason is not None:  # nothing is reused: keep nothing
        rec.memo.clear()
        rec.modules.clear()
        for c in rec.calls:
            c.output = None
        rec.kept = rec.bytes = 0
        rec.encoder = rec.encoder_output = None
        rec.encoder_at = -1
        rec._encoder_versions = []


def truncated(encoded: Encoded, row: int) -> Encoded:
    """``encoded`` without the output positions after ``row`` (the last the metric reads): an encoder-decoder's
    decoder inputs, a decoder-only model's joint sequence, cut to ``row + 1`` positions; an encoder's, or a
    batch of several rows, as it is. In a causal decoder nothing at a position reads a later one, so the rows up
    to ``row`` are what the full input gives them (tested equal, ``tests/test_reruns.py``)."""
    import dataclasses

    if encoded.layout == "encoder" or row < 0 or 1 + max((r.batch for r in encoded.records), default=0) != 1:
        return encoded
    prefix = "decoder_" if encoded.layout == "encoder-decoder" else ""
    ids = encoded.model_kwargs.get(f"{prefix}input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or row + 1 >= ids.shape[1]:
        return encoded
    n = ids.shape[1]
    kw = {}
    for k, v in encoded.model_kwargs.items():
        cut = k.startswith(prefix) and isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[1] == n
        kw[k] = v[:, :row + 1] if cut else v
    return dataclasses.replace(encoded, model_kwargs=kw)


def batch_for(rec: Recording, n: int, sites, batch: int | None = None) -> int:
    """Edits a rerun of ``sites`` takes a pass: ``batch`` when given; else as many of ``n`` as the memory bound
    leaves room for (:meth:`Recording.rows_fit`), at most :data:`MAX_BATCH`."""
    if batch is not None:
        return max(1, min(n, int(batch)))
    return max(1, min(n, MAX_BATCH, rec.rows_fit(sites)))
