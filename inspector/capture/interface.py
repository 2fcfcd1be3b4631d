"""The attention seam: the attention function inspector registers with transformers, and the context managers
that point a model at it.

transformers 5.x routes the attention of most model families through ``ALL_ATTENTION_FUNCTIONS``. While
:func:`registered_functions` and :func:`attn_implementation` are active, a model's configs name ``"inspector"``
(:data:`IMPL`), registered with ``AttentionInterface`` as a dispatcher to the recorder of the current context
(:data:`ACTIVE`, a ``ContextVar``; :mod:`inspector.capture.recorder` sets it) or, for any other call, to
:func:`fast_attention`; the matching mask function (the eager, additive mask) is registered with
``AttentionMaskInterface`` -- without it masks are silently skipped and causal models would see the future.
Every change is undone on every exit path; registrations are counted, so nested and concurrent uses share one.
The intervention seam (:mod:`inspector.intervene.seam`) uses the same registration.

A capture holds :data:`LOCK` for its whole pass, so captures in several threads take turns. Inside
:func:`concurrent_captures` (the corpus scan's worker threads) the model stays pointed at the recording attention
for the block, and captures of it run at once: each forward pass reads the shared set-up
(:meth:`SharedModel.reading`), and a step that changes the model (a second, eager pass with hooks; forward hooks for
value norms) waits for the others and runs alone (:meth:`SharedModel.writing`).
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
import threading
from contextvars import ContextVar
from typing import Any

from inspector.errors import InspectorError

IMPL = "inspector"
# Keyword arguments that attention functions receive but that do not change the weights (the mask
# already encodes sliding windows for eager/sdpa).
NEUTRAL_KWARGS = {
    "dropout", "scaling", "is_causal", "sliding_window", "output_attentions", "position_ids", "cache_position",
    "use_cache", "return_dict", "layer_idx", "head_mask", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
    "max_length_k", "position_embeddings", "output_hidden_states", "token_type_ids", "output_router_logits",
}
HANDLED_KWARGS = {"softcap", "position_bias"}

ACTIVE: ContextVar[Any] = ContextVar("inspector_recorder", default=None)
LOCK = threading.RLock()
_registrations = 0


def _dispatch(module, query, key, value, attention_mask, **kwargs):
    """The function registered as ``attn_implementation="inspector"``."""
    recorder = ACTIVE.get()
    if recorder is None:  # another thread's model is being captured; this one just runs normally
        return fast_attention(module, query, key, value, attention_mask, **kwargs)
    return recorder(module, query, key, value, attention_mask, **kwargs)


def fast_attention(module, query, key, value, attention_mask, **kwargs):
    """The attention function registered for a pass that needs no weights (``weights=False`` or the
    intervention seam): transformers' SDPA kernel where the call allows it (no softcap or unusual
    keyword), else eager. Arguments and return as transformers' attention interface: ``query``
    ``[batch, head, query, d_head]``, ``key``/``value`` ``[batch, kv_head, key, d_head]``; returns
    ``(output [batch, query, head, d_head], weights or None)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if kwargs.get("softcap") is not None or any(v is not None for k, v in kwargs.items() if k not in NEUTRAL_KWARGS | HANDLED_KWARGS):
        return eager_function(module)(module, query, key, value, attention_mask, **kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


_INTERFACE_DEFAULT = re.compile(
    r"(?:get_interface\(\s*[^,()]+,|getattr\(\s*ALL_ATTENTION_FUNCTIONS\s*,\s*[^,()]+,)\s*([A-Za-z_][\w.]*)\s*\)")


@functools.lru_cache(maxsize=256)
def _named_eager(cls):
    """The eager function ``cls.forward`` falls back to in ``ALL_ATTENTION_FUNCTIONS.get_interface(impl, fn)``
    (read from its source and resolved in its module), or None. Read once per class: a capture calls it for every
    attention module, and reading the source took a second per 200 calls."""
    import inspect

    forward = getattr(cls, "forward", None)
    try:
        source = inspect.getsource(forward)
    except (OSError, TypeError):
        return None
    found = _INTERFACE_DEFAULT.search(source)
    if found is None:
        return None
    obj: Any = getattr(forward, "__globals__", {})
    for i, part in enumerate(found.group(1).split(".")):
        obj = obj.get(part) if i == 0 else getattr(obj, part, None)
        if obj is None:
            return None
    return obj if callable(obj) else None


def eager_function(module):
    """The eager attention function the module itself falls back to: the one its ``forward`` names in
    ``ALL_ATTENTION_FUNCTIONS.get_interface(...)`` (e.g. ``simple_eager_attention_forward``), else the
    ``eager_attention_forward`` of its own modeling file (or a parent class's)."""
    named = _named_eager(type(module))
    if named is not None:
        return named
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
def registered_functions():
    """Register the recording attention and its (eager, additive) mask for the duration."""
    global _registrations
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    from transformers.modeling_utils import AttentionInterface

    with LOCK:
        if _registrations == 0:
            AttentionInterface.register(IMPL, _dispatch)
            AttentionMaskInterface.register(IMPL, eager_mask)
        _registrations += 1
    try:
        yield
    finally:
        with LOCK:
            _registrations -= 1
            if _registrations == 0:
                # GeneralInterface has no unregister; its class-level mapping is the registry
                AttentionInterface._global_mapping.pop(IMPL, None)
                AttentionMaskInterface._global_mapping.pop(IMPL, None)


class SharedModel:
    """A model held pointed at the recording attention by :func:`concurrent_captures`: its configs' own attention
    implementations before (``original``: config id -> name, which the recorder reads instead of the configs) and a
    readers-writer lock over its passes that prefers writers (a reader waits while a writer waits). A thread that
    holds :meth:`writing` may also read and write again; a reader must not ask to write (it would wait for itself).
    ``closed`` once the set-up is undone (a pass that finds it closed runs as without it)."""

    def __init__(self, original: dict[int, Any]):
        self.original = original
        self.closed = False
        self.holders = 0  # concurrent_captures blocks holding it (nested or in other threads): the last one undoes it
        self.undo = contextlib.ExitStack()
        self._cond = threading.Condition()
        self._readers = 0
        self._waiting = 0  # writers waiting: new readers wait behind them
        self._writer: int | None = None  # the thread that writes
        self._depth = 0

    @contextlib.contextmanager
    def reading(self):
        """A pass that changes nothing of the model: runs alongside other readers, never alongside a writer."""
        me = threading.get_ident()
        with self._cond:
            nested = self._writer == me
            if not nested:
                while self._writer is not None or self._waiting:
                    self._cond.wait()
                self._readers += 1
        try:
            yield self
        finally:
            if not nested:
                with self._cond:
                    self._readers -= 1
                    if not self._readers:
                        self._cond.notify_all()

    @contextlib.contextmanager
    def writing(self):
        """A step that changes the model (hooks, its attention implementation): waits until no other pass runs."""
        me = threading.get_ident()
        with self._cond:
            if self._writer != me:
                self._waiting += 1
                try:
                    while self._writer is not None or self._readers:
                        self._cond.wait()
                finally:
                    self._waiting -= 1
                    if not self._waiting:
                        self._cond.notify_all()
                self._writer = me
            self._depth += 1
        try:
            yield self
        finally:
            with self._cond:
                self._depth -= 1
                if not self._depth:
                    self._writer = None
                    self._cond.notify_all()


_SHARED: dict[int, SharedModel] = {}  # id(model) -> its set-up while concurrent_captures holds it


def shared_model(model) -> SharedModel | None:
    """The :class:`SharedModel` that :func:`concurrent_captures` holds for ``model``, else None."""
    return _SHARED.get(id(model))


@contextlib.contextmanager
def model_alone(model):
    """For a step that changes ``model`` (forward hooks, its attention implementation) while
    :func:`concurrent_captures` may hold it: until no other thread's pass runs, and none starts
    (:meth:`SharedModel.writing`); without it, nothing."""
    shared = shared_model(model)
    if shared is None:
        yield
        return
    with shared.writing():
        yield


@contextlib.contextmanager
def concurrent_captures(model):
    """Let captures of ``model`` in several threads run at once for the block: the recording attention registered,
    the model in evaluation mode and every config pointed at it once, for the whole block (instead of per
    capture, under :data:`LOCK`); restored on every exit path, once the passes still running end (an interrupt
    while waiting for them restores at once). Holds of one model, nested or in several threads, share one set-up,
    which the last to leave undoes. Yields the :class:`SharedModel`. Each thread's capture still records only its
    own calls (:data:`ACTIVE` is a ``ContextVar``); a tokenizer is not shared between threads by this (callers
    serialize it: :data:`inspector.capture.inputs.TOKENIZER_LOCK`).

    While the block is held (also while a generator that holds it is paused) the model is not as the caller left
    it: its configs name :data:`IMPL`, it is in evaluation mode, and an eager ``output_attentions`` pass outside a
    capture returns no weights."""
    with LOCK:  # set up once, atomically; the block itself does not hold LOCK (other models' captures go on)
        state = _SHARED.get(id(model))
        if state is None:
            modules = list(model.modules())
            configs = model_configs(model, modules)
            state = SharedModel({id(c): c._attn_implementation for c in configs})
            # published first and withdrawn last: a recorder that finds no SharedModel finds the configs as they were
            _SHARED[id(model)] = state
            try:
                state.undo.enter_context(eval_mode(model, modules))
                state.undo.enter_context(registered_functions())
                state.undo.enter_context(attn_implementation(model, IMPL, configs))
            except BaseException:
                state.undo.close()
                _SHARED.pop(id(model), None)
                raise
        state.holders += 1
    try:
        yield state
    finally:
        with LOCK:
            state.holders -= 1
            last = not state.holders
        if last:
            alone = contextlib.ExitStack()
            try:
                alone.enter_context(state.writing())  # the passes still running end first; none starts meanwhile
            finally:
                try:
                    with LOCK:
                        if not state.holders and not state.closed:  # nobody joined meanwhile
                            state.closed = True
                            try:
                                state.undo.close()
                            finally:
                                _SHARED.pop(id(model), None)
                finally:
                    alone.close()


def model_configs(model, modules: list | None = None) -> list[Any]:
    """Every ``PretrainedConfig`` of ``model`` (its modules' and their sub-configs), each once; ``modules``:
    ``model.modules()`` already listed (one walk of the module tree serves a whole capture)."""
    from transformers import PretrainedConfig

    seen: dict[int, Any] = {}
    stack = [getattr(m, "config", None) for m in (model.modules() if modules is None else modules)]
    while stack:
        c = stack.pop()
        if isinstance(c, PretrainedConfig) and id(c) not in seen:
            seen[id(c)] = c
            stack += [getattr(c, k, None) for k in getattr(c, "sub_configs", {})]
    return list(seen.values())


@contextlib.contextmanager
def eval_mode(model, modules: list | None = None):
    """``model`` in evaluation mode (no dropout) for the block; on exit every module's own ``training`` flag is as
    it was, whatever mix of modes the model was in (``model.train(flag)`` would set them all alike). ``modules``:
    ``model.modules()`` already listed."""
    saved = [(m, m.training) for m in (model.modules() if modules is None else modules)]
    try:
        if any(flag for _, flag in saved):
            model.eval()
        yield model
    finally:
        for m, flag in saved:
            if m.training != flag:  # only what changed: Module.__setattr__ costs microseconds per module
                m.training = flag


@contextlib.contextmanager
def attn_implementation(model, name: str, configs: list | None = None):
    """Point every config of ``model`` (``configs``: :func:`model_configs` already listed) at attention
    implementation ``name``; restore on exit."""
    configs = model_configs(model) if configs is None else configs
    saved = [(c, c.__dict__.get("_attn_implementation_internal")) for c in configs]
    try:
        for c in configs:
            c._attn_implementation_internal = name
        yield
    finally:
        for c, value in saved:
            c._attn_implementation_internal = value
