"""Per-head edit points of long-document encoder attention (issue 20): LED's and Longformer's banded
self-attention, Pegasus-X's global-local attention, LongT5's local and transient-global attention and
BigBird's block-sparse attention compute attention outside transformers' attention interface, so the seam's
attention function never sees them. Their per-head outputs are edited where they enter the output
projection instead: the projection's input ``[batch, position, head * d_v]`` (heads flattened head-major, as
every one of these modules flattens them) is viewed as ``[batch, position, head, d_v]``, so zeroing head
``h`` there is zeroing its columns of the projection's input (the bias is kept), exactly as the seam defines
it for interface sites.

:data:`EDIT_POINTS` names, per module class, the projection (read from the installed transformers source):

* ``LongformerSelfAttention``: the sibling ``output.dense`` (``LongformerAttention.output``);
* ``LEDEncoderSelfAttention``: the sibling ``output`` (``LEDEncoderAttention.output``);
* ``PegasusXGlobalLocalAttention``: its own ``out_proj``, called twice: on the global tokens, then on the
  (padded, staggered) tokens;
* ``LongT5LocalAttention`` / ``LongT5TransientGlobalAttention``: their own ``o`` (input cropped to the tokens);
* ``BigBirdPegasusBlockSparseAttention``: the sibling ``output``; ``BigBirdBlockSparseAttention``: the sibling
  ``output.dense``;
* ``LEDDecoderAttention`` (LED's decoder self- and cross-attention, which compute attention with their own
  ``bmm`` too): their own ``out_proj``; the query axis is the output tokens, and while generating with a cache
  a call's rows start at the running position.

The modules run on padded sequences: LED and Longformer pad the tokens at the end to a multiple of the
window, BigBird to a multiple of the block, Pegasus-X to a multiple of the block and, on staggered layers,
by half a block at both ends. :func:`layout` maps each call of the projection to the site's query axis (the
same axis the capture gives the site: the source tokens; Pegasus-X: the global tokens, then the source), so
only the rows of real positions are read and edited; the pad rows are left as they are (every later layer
hides them as keys, and the encoder drops them).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

from inspector.store.schema import Site

GLOBAL_ROLE = "global"  # the pseudo-input naming learned or computed global tokens, as the capture names it

# module class -> the projection its per-head outputs enter ("../" = a sibling: a path from the parent module)
EDIT_POINTS = {
    "LongformerSelfAttention": "../output.dense",
    "LEDEncoderSelfAttention": "../output",
    "PegasusXGlobalLocalAttention": "out_proj",
    "LongT5LocalAttention": "o",
    "LongT5TransientGlobalAttention": "o",
    "BigBirdPegasusBlockSparseAttention": "../output",
    "BigBirdBlockSparseAttention": "../output.dense",
    "LEDDecoderAttention": "out_proj",  # LED's decoder self- and cross-attention (its own bmm, not the interface)
}
DECODER_CLASSES = ("LEDDecoderAttention",)
_HEADS = ("num_heads", "n_heads", "num_attention_heads")


@dataclass
class EditPoint:
    """One long-document attention module and the projection its per-head outputs enter."""

    name: str  # the module's path (the capture's site name, before any ``@n``)
    module: torch.nn.Module
    proj_name: str
    proj: torch.nn.Linear
    heads: int
    d_v: int


@dataclass
class Layout:
    """One call of a module on the site's query axis: ``segments`` ``[(offset, rows)]``, one per call of the
    projection in order: its input rows ``rows`` (``[n]`` long) are query positions ``offset .. offset + n - 1``."""

    query_roles: list[str]
    key_roles: list[str]
    query_len: int  # query positions this call covers (from ``start``)
    key_len: int
    segments: list[tuple[int, torch.Tensor]]
    pseudo: dict[str, int] = field(default_factory=dict)  # pseudo-input role -> its tokens
    kind: str = "self"  # "self", "causal" or "cross", as the capture names the site's kind
    decoder: bool = False  # a decoder's site (else the encoder's, or the one stack's)
    start: int = 0  # the call's first query position (a cached decoder call's running position)


def projection_path(name: str, cls: str) -> str | None:
    """The dotted path of the projection a module of class ``cls`` at ``name`` feeds, or None (not editable)."""
    rel = EDIT_POINTS.get(cls)
    if rel is None:
        return None
    if rel.startswith("../"):
        parent = name.rpartition(".")[0]
        return f"{parent}.{rel[3:]}" if parent else rel[3:]
    return f"{name}.{rel}"


def edit_points(model) -> list[EditPoint]:
    """Every module of ``model`` in :data:`EDIT_POINTS` whose projection is a ``Linear`` taking ``head * d_v``
    features (a module whose projection does not fit is left out: :func:`inspector.intervene.seam.check_heads`
    then refuses its heads by class)."""
    modules = dict(model.named_modules())
    out = []
    for name, m in modules.items():
        path = projection_path(name, type(m).__name__)
        proj = modules.get(path) if path is not None else None
        heads = next((getattr(m, a) for a in _HEADS if isinstance(getattr(m, a, None), int)), None)
        if not isinstance(proj, torch.nn.Linear) or not heads or proj.in_features % heads:
            continue
        out.append(EditPoint(name=name, module=m, proj_name=path, proj=proj, heads=heads, d_v=proj.in_features // heads))
    return out


def layout(module, args: tuple, kwargs: dict, n: int | None, *, start: int = 0) -> Layout:
    """Where the projection's input rows of one call of ``module`` (forward arguments ``args``, ``kwargs``) lie
    on the site's query axis, for a source of ``n`` tokens (see the module docstring); ``start``: a decoder
    call's running position (the query positions its module has seen before in this pass)."""
    cls = type(module).__name__
    bound = inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments
    if cls in DECODER_CLASSES:
        length = int(bound["hidden_states"].shape[1])
        kv = bound.get("key_value_states")
        rows = [(start, torch.arange(length))]
        if kv is not None:
            return Layout(["target"], ["source"], length, int(kv.shape[1]), rows, kind="cross", decoder=True, start=start)
        return Layout(["target"], ["target"], length, start + length, rows, kind="causal", decoder=True, start=start)
    if n is None:
        raise ValueError(f"{cls} needs the source length")
    tokens = torch.arange(n)
    if cls == "PegasusXGlobalLocalAttention":
        g = int(bound["global_hidden_states"].shape[1])
        padded, bs = int(bound["token_hidden_states"].shape[1]), int(module.block_size)
        off = (padded - -(-n // bs) * bs) // 2  # the stagger shift (0 on unstaggered layers)
        roles = [GLOBAL_ROLE, "source"]
        return Layout(roles, roles, g + n, g + n, [(0, torch.arange(g)), (g, tokens + off)], {GLOBAL_ROLE: g})
    if cls == "LongT5TransientGlobalAttention":
        g = n // int(module.global_block_size)  # _make_global_fixed_block_ids: one global token per whole block
        return Layout(["source"], ["source", GLOBAL_ROLE], n, n + g, [(0, tokens)], {GLOBAL_ROLE: g})
    return Layout(["source"], ["source"], n, n, [(0, tokens)])


def site_record(point: EditPoint, name: str, layer: int, encoder_decoder: bool, *, lay: Layout) -> Site:
    """The :class:`~inspector.store.schema.Site` of one call (no tensors: the seam's capture of these modules
    holds their axes, heads and projection, what ablation, patching and effects read)."""
    h = point.heads
    stack = ("decoder" if lay.decoder else "encoder") if encoder_decoder else "none"
    return Site(name=name, stack=stack, layer=int(layer), kind=lay.kind, num_heads=h, num_kv_heads=h,
                head_map=list(range(h)), d_head=point.d_v, d_v=point.d_v, scaling=float("nan"),
                query_input=list(lay.query_roles), key_input=list(lay.key_roles), query_len=lay.query_len,
                key_len=lay.key_len, parts=[], recomputable=False, module_class=type(point.module).__name__,
                eager_function="", out_proj=point.proj_name,
                value_norm_note="edited at its output projection's input (long-document attention): no Q/K/V")
