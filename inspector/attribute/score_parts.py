"""Why the culprit attends to WRONG: an exact decomposition of one head's attention-logit difference
``s(q_i, k_WRONG) - s(q_i, k_RIGHT)`` into the parts of the residual stream at the query and the keys.

Definition. At one attention site (``site``, a capture name such as ``transformer.h.1.attn`` or
``model.decoder.layers.0.encoder_attn``), head ``h`` scores key j for query i as
``s(i, j) = scaling * q_i . k_j + b(i, j)``: ``q_i`` and ``k_j`` are the recorded query and key of that head
(after rotary embeddings; a grouped-query head reads its K/V head ``site.head_map[h]``), ``scaling`` the
site's (``d_head ** -0.5``; T5: 1.0) and ``b`` T5's relative position bias (0 elsewhere on every key the
query sees). For a word of several tokens, RIGHT and WRONG are lists of key positions and the **mean**
score over each list is used (the mean is linear, so the decomposition stays exact); the difference
explained is ``mean_{j in WRONG} s(i, j) - mean_{j in RIGHT} s(i, j)``, in logit units (what the softmax
reads: a difference d multiplies the weight ratio WRONG/RIGHT by ``exp(d)``). Positions are token indices on
the site's query axis and key axis (a decoder-only model: prompt then continuation; an encoder-decoder's
decoder: the target with its start token; cross-attention keys: the source).

Residual components. The state entering the site's sub-layer is a sum of components, recorded and checked
as :mod:`inspector.attribute.routes` records them (one forward pass, hooks):

* ``token embedding``, ``position embedding`` (learned positions: GPT-2, BERT, BART; the embedding sum
  minus the token, and token type, embeddings), ``token type embedding`` (BERT); prefixed ``encoder`` /
  ``decoder`` on an encoder-decoder;
* each earlier head ``SITE:H``: ``sum_j A[h, p, j] v_j W_O^h`` (kind ``head``); each attention output bias
  ``<out_proj>.bias`` (``attention bias``);
* each earlier MLP ``<block>:mlp`` (its output without the last projection's bias) and that bias
  ``<proj>.bias`` (``mlp bias``);
* post-LN families (BERT, BART): every LayerNorm on the path is linearised at its actual input
  (``gamma * (z - mean z) / sigma``, ``sigma`` from the real forward pass, exactly as routes do), applied to
  every component that passes through it, and its ``beta`` is a component ``<norm>.bias`` (``norm bias``).

Query and key. The pre-attention norm of pre-LN families (GPT-2 ``ln_1``, Llama ``input_layernorm``, T5
``layer_norm``; for T5 cross-attention keys, the encoder's ``final_layer_norm``) is linearised the same
way at the actual input (RMSNorm: ``gamma * z / rms``, no centring) and its ``beta`` is a component, then
``q = W_Q LN(x) + b_Q`` is a sum of one part per component plus ``SITE:q_bias`` (``projection bias``); k
likewise (``SITE:k_bias``). Rotary models (Llama, Mistral, Qwen 2) have no position component: the
rotation of position p (cos/sin as the model passed them) is linear, so it is applied to each component's
projected q (at i) and k (at each key). Cross-attention's key side is the encoder's final state,
decomposed into the encoder's components.

Terms. ``s`` is bilinear: the difference is ``sum_{a, b} scaling * q_a . (kbar_b(WRONG) - kbar_b(RIGHT))``
over q-side parts a and k-side parts b (``kbar``: the mean over the list), plus, for T5, one ``position
bias`` term ``bbar(WRONG) - bbar(RIGHT)``. All in float64; their sum equals the model's own difference
(recomputed from the recorded q and k, float64) to rounding (tests: 1e-5 on every supported family).

What it cannot tell: it explains the score difference, not the causal effect of any component (a large
term may be cancelled downstream, and changing a component changes every sigma; use ``effects``); each
LayerNorm is linear only at the actual input; and the bias parts (LayerNorm beta, projection biases) are
terms of their own, so a difference can be "explained" by a constant.

Supported: BERT, GPT-2, Llama / Mistral / Qwen 2, BART, T5 (self, causal and cross-attention). Any other
model type is refused by name.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import pandas as pd
import torch

from inspector.attribute.families import FAMILIES, Family
from inspector.attribute.routes import CHECK, record
from inspector.capture.output import Output
from inspector.capture.value_norm import head_slices
from inspector.errors import InspectorError
from inspector.store.masks import MASKED

TERM_COLUMNS = ["q_component", "q_kind", "k_component", "k_kind", "term"]
MARGIN_COLUMNS = ["component", "kind", "term"]
POSITION_BIAS = "position bias"

__all__ = ["MARGIN_COLUMNS", "POSITION_BIAS", "TERM_COLUMNS", "ScoreParts", "decompose", "site_names"]


_MLP_OUT = ("c_proj", "down_proj", "wo", "fc2")  # the MLP's last projection, when the step's module is the whole MLP


@dataclass
class ScoreParts:
    """The decomposition of one head's score difference ``s(i, WRONG) - s(i, RIGHT)`` (module docstring).

    ``terms``: one row per (q-side part, k-side part) -- (q-side parts) x (k-side parts) rows, q-side parts in
    residual order (embeddings, then each sub-layer's parts layer by layer, then the pre-attention norm's beta
    and the projection bias), each with every k-side part in the same order -- columns :data:`TERM_COLUMNS`: ``q_component``,
    ``k_component`` (names such as ``token embedding``, ``transformer.h.0.attn:2``, ``transformer.h.0:mlp``,
    ``transformer.h.1.ln_1.bias``, ``SITE:q_bias``), their kinds (``embedding``, ``head``, ``attention bias``,
    ``mlp``, ``mlp bias``, ``norm bias``, ``projection bias``, ``position bias``) and ``term`` (float64, logit
    units; positive pushes toward WRONG); T5 adds one ``position bias`` row (and so would any other additive term
    on a visible key; none in the other supported families). ``by_query`` / ``by_key``: the
    terms summed per q-side / k-side component (columns :data:`MARGIN_COLUMNS`; the position bias is a row of
    both, so each sums to ``total``). ``difference``: the model's own ``mean s(i, WRONG) - mean s(i, RIGHT)``
    from the recorded q and k; ``total``: the sum of the terms; ``gap``: ``total - difference``.
    ``score_wrong`` / ``score_right``: the mean scores; ``q_error`` / ``k_error``: the relative error of the
    reconstructed q and k against the recorded ones (the layout check, refused above 1e-4). Positions and tokens
    say what was compared (``right_positions`` / ``wrong_positions`` without repeats)."""

    site: str
    head: int
    kv_head: int
    query_position: int
    right_positions: list[int]
    wrong_positions: list[int]
    query_token: str
    right_tokens: list[str]
    wrong_tokens: list[str]
    scaling: float
    terms: pd.DataFrame
    by_query: pd.DataFrame
    by_key: pd.DataFrame
    difference: float
    total: float
    score_right: float
    score_wrong: float
    q_error: float
    k_error: float

    @property
    def gap(self) -> float:
        """``total - difference``: how far the sum of the terms is from the model's own difference (rounding)."""
        return self.total - self.difference

    def top(self, n: int = 10, towards: str = "wrong") -> pd.DataFrame:
        """The ``n`` largest terms pushing ``towards`` ``"wrong"`` (positive terms, largest first) or ``"right"``
        (negative terms, most negative first). Raises :class:`InspectorError` for another ``towards``."""
        if towards not in ("wrong", "right"):
            raise InspectorError(f"towards must be 'wrong' or 'right', got {towards!r}")
        t = self.terms
        picked = t[t["term"] > 0].sort_values("term", ascending=False) if towards == "wrong" else \
            t[t["term"] < 0].sort_values("term")
        return picked.head(n).reset_index(drop=True)


def _prefixes(model) -> dict[str, str]:
    mt = getattr(model.config, "model_type", "")
    if mt not in FAMILIES:
        raise InspectorError(f"why decomposes the attention scores of {', '.join(sorted(FAMILIES))} models; {mt!r} is not "
                             "among them (its blocks' layout is not known to inspector)")
    names = dict(model.named_modules())
    out = {}
    for stack, (prefixes, _) in FAMILIES[mt].stacks.items():
        prefix = next((p for p in prefixes if p in names), None)
        if prefix is None:
            raise InspectorError(f"{type(model).__name__} ({mt}) has no block list at {' or '.join(prefixes)}")
        out[stack] = prefix
    return out


def site_names(model) -> dict[str, tuple[str, int, str]]:
    """The attention sites :func:`decompose` can explain, ``{site: (stack, block, step kind)}``, in the
    capture's names, read from the model's modules (nothing runs). Raises :class:`InspectorError` for a
    family it does not support (by name)."""
    names = dict(model.named_modules())
    out = {}
    for stack, prefix in _prefixes(model).items():
        for b in range(len(names[prefix])):
            for step in FAMILIES[model.config.model_type].stacks[stack][1]:
                if step.site:
                    out[f"{prefix}.{b}.{step.site}"] = (stack, b, step.kind)
    return out


def _index(value, what: str) -> int:
    try:
        if isinstance(value, bool | float | str):
            raise TypeError
        n = operator.index(value)
    except TypeError:
        raise InspectorError(f"{what} must be a token index (a whole number >= 0), got {value!r}") from None
    if n < 0:
        raise InspectorError(f"{what} must be a token index (a whole number >= 0), got {n}")
    return n


def _positions(value, what: str) -> list[int]:
    items = [value] if not isinstance(value, list | tuple | range) and not hasattr(value, "tolist") else list(value)
    if not items:
        raise InspectorError(f"{what} must be one or more token indices, got none")
    return list(dict.fromkeys(_index(p, what) for p in items))  # a repeated index counts once


# ---- recording --------------------------------------------------------------------------------
class _Extra:
    """Hooks for what routes' record does not keep: the embedding LayerNorm's input and BERT's token type
    embedding (post-LN families), and the rotary cos/sin the target site is called with."""

    def __init__(self, model, mt: str, site: str, prefixes: dict[str, str]):
        self.names = dict(model.named_modules())
        self.seen: dict[str, object] = {}
        self.targets: dict[str, str] = {}  # module name -> what to keep
        for stack, prefix in prefixes.items():
            norm = _embed_norm(mt, prefix)
            if norm is not None:
                self.targets[norm] = f"norm_input:{stack}"
        if mt == "bert":
            self.targets[_bert_base(next(iter(prefixes.values()))) + "embeddings.token_type_embeddings"] = "token_type"
        self.site = site
        self.rotary = FAMILIES[mt].rotary

    def __enter__(self):
        self.handles = []
        for name, what in self.targets.items():
            if name not in self.names:
                raise InspectorError(f"the model has no module {name}: its embeddings are not laid out as its family's")
            hook = self._input if what.startswith("norm_input") else self._output
            self.handles.append(self.names[name].register_forward_hook(lambda m, a, o, what=what, hook=hook: hook(what, a, o)))
        if self.rotary:
            self.handles.append(self.names[self.site].register_forward_pre_hook(self._rotary, with_kwargs=True))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()

    def _input(self, what, args, _out):
        self.seen.setdefault(what, _f64(args[0][0]).clone())

    def _output(self, what, _args, out):
        self.seen.setdefault(what, _f64(out[0]).clone())

    def _rotary(self, _m, _args, kwargs):
        pe = kwargs.get("position_embeddings")
        if pe is not None and "rotary" not in self.seen:
            self.seen["rotary"] = (_f64(pe[0][0]).clone(), _f64(pe[1][0]).clone())


def _bert_base(prefix: str) -> str:
    return prefix[: -len("encoder.layer")]


def _embed_norm(mt: str, prefix: str) -> str | None:
    if mt == "bert":
        return _bert_base(prefix) + "embeddings.LayerNorm"
    if mt == "bart":
        return prefix[: -len("layers")] + "layernorm_embedding"
    return None


# ---- linear algebra ---------------------------------------------------------------------------
def _f64(t: torch.Tensor) -> torch.Tensor:
    """A float64 CPU copy (the model may sit on an accelerator; the capture's tensors are on the CPU)."""
    return t.detach().to("cpu", torch.float64)


def _linear_norm(module, x: torch.Tensor):
    """``(f, beta)``: the norm linearised at its actual input ``x [position, hidden]`` (float64): ``f(z, r)`` maps
    a component of row r; ``beta`` the norm's bias (None without)."""
    w = getattr(module, "weight", None)
    gamma = _f64(w) if isinstance(w, torch.Tensor) else torch.ones(x.shape[-1], dtype=torch.float64)
    if isinstance(module, torch.nn.LayerNorm):
        sigma = torch.sqrt(x.var(-1, unbiased=False) + module.eps)  # [row]
        bias = getattr(module, "bias", None)
        beta = _f64(bias) if isinstance(bias, torch.Tensor) else None
        return (lambda z, r: gamma * (z - z.mean(-1, keepdim=True)) / sigma[r]), beta
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if not type(module).__name__.endswith(("RMSNorm", "T5LayerNorm")) or eps is None:
        raise InspectorError(f"{type(module).__name__} is neither a LayerNorm nor an RMSNorm: it cannot be linearised")
    rms = torch.sqrt(x.pow(2).mean(-1) + eps)
    return (lambda z, r: gamma * z / rms[r]), None


def _affine(module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(W [out, in], b [out] or None)`` of an ``nn.Linear`` or a transformers ``Conv1D``, float64."""
    w = _f64(module.weight)
    w = w.t() if type(module).__name__ == "Conv1D" else w
    b = getattr(module, "bias", None)
    return w, (_f64(b) if isinstance(b, torch.Tensor) else None)


def _projections(site_module, fam: Family, site):
    """``(W_q [head, d, hidden], b_q [head, d] | None, W_k [kv_head, d, hidden], b_k)`` of the site."""
    out = []
    for which, name, heads in (("q", fam.q, site.num_heads), ("k", fam.k, site.num_kv_heads)):
        mod = getattr(site_module, name, None)
        if mod is None:
            raise InspectorError(f"{site.name} has no {name} projection: its {which} cannot be decomposed")
        w, b = _affine(mod)
        if fam.fused:  # GPT-2's c_attn: q | k | v along the output
            n = heads * site.d_head
            start = 0 if which == "q" else site.num_heads * site.d_head
            w, b = w[start:start + n], None if b is None else b[start:start + n]
        if w.shape[0] != heads * site.d_head:
            raise InspectorError(f"{site.name}.{name} has {w.shape[0]} outputs, not {heads} x {site.d_head}: its heads "
                                 "cannot be told apart")
        out += [w.reshape(heads, site.d_head, -1), None if b is None else b.reshape(heads, site.d_head)]
    return tuple(out)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Llama's rotary embedding of ``x [..., d]`` at one position (``cos``/``sin [d]``): linear in x."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


# ---- the residual's components ---------------------------------------------------------------
def _level0(g, mt: str, fam: Family, stack: str, positions: list[int], ids: torch.Tensor, extra: _Extra
            ) -> dict[str, tuple[str, torch.Tensor]]:
    model = g.model
    label = "" if stack == "none" else f"{stack} "
    x0 = _f64(g.stacks[stack].nodes[0][positions])
    if not fam.positions:  # rotary and T5: the first block's input is the token embedding itself
        return {f"{label}token embedding": ("embedding", x0)}
    holder = model.get_encoder() if stack == "encoder" else model.get_decoder() if stack == "decoder" else None
    emb = getattr(holder, "embed_tokens", None) or model.get_input_embeddings()
    with torch.no_grad():
        token = _f64(emb(ids[positions][None].to(emb.weight.device))[0])
    parts = {f"{label}token embedding": token}
    norm = _embed_norm(mt, g.stacks[stack].prefix)
    total = x0 if norm is None else extra.seen[f"norm_input:{stack}"][positions]
    if "token_type" in extra.seen:
        parts[f"{label}token type embedding"] = extra.seen["token_type"][positions]
    parts[f"{label}position embedding"] = total - sum(parts.values())
    if norm is None:
        return {n: ("embedding", v) for n, v in parts.items()}
    f, beta = _linear_norm(extra.names[norm], total)
    comps = {n: ("embedding", torch.stack([f(v[r], r) for r in range(len(positions))])) for n, v in parts.items()}
    if beta is not None:
        comps[f"{norm}.bias"] = ("norm bias", beta.expand(len(positions), -1).clone())
    return comps


def _head_parts(g, stack: str, block: int, step, positions: list[int]) -> dict[str, tuple[str, torch.Tensor]]:
    cap, names = g.capture, dict(g.model.named_modules())
    site = cap.site(g.sites[(stack, block, step.kind)])
    proj_name = f"{g.stacks[stack].prefix}.{block}.{step.out_proj}"
    w_o = head_slices(names[proj_name], site.num_heads, site.d_v)
    if w_o is None:
        raise InspectorError(f"{proj_name} does not take {site.num_heads} x {site.d_v} inputs: its heads cannot be told apart")
    w_o = _f64(w_o)
    lo = min(positions)
    a = cap.weights(site, 0, queries=slice(lo, max(positions) + 1))[:, [p - lo for p in positions]].double()  # [h, p, key]
    v = cap.tensor(site, "v")[0].double()[torch.as_tensor(site.head_map)]  # [head, key, d_v]
    out = {f"{site.name}:{h}": ("head", a[h] @ v[h] @ w_o[h]) for h in range(site.num_heads)}
    bias = getattr(names[proj_name], "bias", None)
    if isinstance(bias, torch.Tensor):
        out[f"{proj_name}.bias"] = ("attention bias", _f64(bias).expand(len(positions), -1).clone())
    return out


def _mlp_parts(g, stack: str, level: int, block: int, step, positions: list[int]) -> dict[str, tuple[str, torch.Tensor]]:
    st, names = g.stacks[stack], dict(g.model.named_modules())
    after = st.sums[level] if step.norm else st.nodes[level]
    delta = _f64(after[positions]) - _f64(st.nodes[level - 1][positions])
    base = f"{st.prefix}.{block}.{step.delta}"
    last = base if hasattr(names[base], "weight") else next((f"{base}.{c}" for c in _MLP_OUT if f"{base}.{c}" in names), None)
    bias = getattr(names[last], "bias", None) if last is not None else None
    if not isinstance(bias, torch.Tensor):
        return {f"{st.prefix}.{block}:mlp": ("mlp", delta)}
    b = _f64(bias).expand(len(positions), -1).clone()
    return {f"{st.prefix}.{block}:mlp": ("mlp", delta - b), f"{last}.bias": ("mlp bias", b)}


def _components(g, mt: str, fam: Family, stack: str, level: int, positions: list[int], ids: torch.Tensor,
                extra: _Extra) -> dict[str, tuple[str, torch.Tensor]]:
    """The components (name -> (kind, ``[position, hidden]`` float64)) of ``stack``'s residual state at
    ``level`` and ``positions``; they sum to the recorded state (checked, relative :data:`CHECK`)."""
    st = g.stacks[stack]
    comps = _level0(g, mt, fam, stack, positions, ids, extra)
    for lv in range(1, level + 1):
        block, step = st.step(lv)
        new = _mlp_parts(g, stack, lv, block, step, positions) if step.kind == "mlp" else \
            _head_parts(g, stack, block, step, positions)
        if step.norm is None:
            comps.update(new)
            continue
        norm = f"{st.prefix}.{block}.{step.norm}"
        f, beta = _linear_norm(extra.names[norm], _f64(st.sums[lv][positions]))
        comps = {n: (k, torch.stack([f(v[r], r) for r in range(len(positions))])) for n, (k, v) in {**comps, **new}.items()}
        if beta is not None:
            comps[f"{norm}.bias"] = ("norm bias", beta.expand(len(positions), -1).clone())
    state = _f64(st.nodes[level][positions])
    made = sum(v for _, v in comps.values())
    if float((made - state).norm()) > CHECK * max(float(state.norm()), 1e-12):
        raise InspectorError(f"the components of {stack} level {level} do not add up to the recorded state: "
                             f"{type(g.model).__name__}'s residual is not laid out as its {mt} family's")
    return comps


# ---- q and k ----------------------------------------------------------------------------------
def _project(comps, norm_module, state: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, rot, bias_name: str,
             norm_name: str | None) -> tuple[list[str], list[str], torch.Tensor]:
    """Names, kinds and ``[part, position, d]`` projected parts of one head's q or k: each component through the
    linearised norm (at ``state``, the norm's actual input) and ``w [d, hidden]``, the norm's beta and the
    projection bias as parts of their own, each rotated at its position (``rot``: ``[position] -> (cos, sin)``)."""
    names, kinds = list(comps), [k for k, _ in comps.values()]
    vecs = torch.stack([v for _, v in comps.values()])  # [part, position, hidden]
    if norm_module is not None:
        f, beta = _linear_norm(norm_module, state)
        vecs = torch.stack([torch.stack([f(vecs[c, r], r) for r in range(vecs.shape[1])]) for c in range(len(names))])
        if beta is not None:
            names.append(f"{norm_name}.bias")
            kinds.append("norm bias")
            vecs = torch.cat([vecs, beta.expand(1, vecs.shape[1], -1)])
    parts = vecs @ w.t()  # [part, position, d]
    if b is not None:
        names.append(bias_name)
        kinds.append("projection bias")
        parts = torch.cat([parts, b.expand(1, parts.shape[1], -1)])
    if rot is not None:
        parts = torch.stack([_rotate(parts[:, r], *rot[r]) for r in range(parts.shape[1])], 1)
    return names, kinds, parts


def _relative_error(made: torch.Tensor, recorded: torch.Tensor) -> float:
    return float((made - recorded).norm() / max(float(recorded.norm()), 1e-12))


@dataclass(frozen=True)
class _Pass:
    """The recorded forward pass a decomposition reads: the graph, the model type, its family and the extra
    tensors the hooks saw (norm inputs, token types, rotary cos/sin)."""

    g: object
    mt: str
    fam: Family
    extra: _Extra


def _side(run: _Pass, site, where, *, query: bool, positions: list[int], ids, w, b):
    """One side's parts ``(names, kinds, [part, position, d])`` at ``positions`` of the site's query or key axis."""
    g, mt, fam, extra = run.g, run.mt, run.fam, run.extra
    stack, block, kind = where
    st_q = g.stacks[stack]
    level_in = block * len(st_q.steps) + [s.kind for s in st_q.steps].index(kind)
    if kind == "cross" and not query:
        enc = g.stacks["encoder"]
        level, stack, norm_name = g.level_count("encoder") - 1, "encoder", (
            f"{enc.prefix[: -len('block')]}final_layer_norm" if mt == "t5" else None)
    else:
        level = level_in
        norm_name = f"{st_q.prefix}.{block}.{fam.norms[kind]}" if kind in fam.norms else None
    comps = _components(g, mt, fam, stack, level, positions, ids[stack], extra)
    state = _f64(g.stacks[stack].nodes[level][positions])
    rot = None
    if fam.rotary:
        if "rotary" not in extra.seen:
            raise InspectorError(f"{site.name} was not called with rotary cos/sin (position_embeddings): its q and k "
                                 "cannot be rotated part by part")
        cos, sin = extra.seen["rotary"]
        rot = [(cos[p], sin[p]) for p in positions]
    return _project(comps, extra.names[norm_name] if norm_name else None, state, w, b, rot,
                    f"{site.name}:{'q' if query else 'k'}_bias", norm_name)


def _ids(g) -> dict[str, torch.Tensor]:
    out = {}
    for stack in g.stacks:
        site = g.capture.site(g.sites[(stack, 0, "attention")])
        out[stack] = torch.tensor([rec.ids[i] for rec, i in g.capture.axis(site, "query")], dtype=torch.long)
    return out


def _check_positions(cap, site, head: int, i: int, right: list[int], wrong: list[int]) -> torch.Tensor | None:
    """Ranges and visibility; returns the site's additive mask row ``[key]`` (with T5's position bias) or None."""
    if not 0 <= head < site.num_heads:
        raise InspectorError(f"--head must be 0..{site.num_heads - 1} at {site.name}, got {head}")
    if not 0 <= i < site.query_len:
        raise InspectorError(f"--query-position must be 0..{site.query_len - 1} (the query axis of {site.name}), got {i}")
    for what, ps in (("--right-positions", right), ("--wrong-positions", wrong)):
        bad = [p for p in ps if p >= site.key_len]
        if bad:
            raise InspectorError(f"{what} must be 0..{site.key_len - 1} (the key axis of {site.name}), got {bad[0]}")
    if site.softcap is not None:
        raise InspectorError(f"{site.name} soft-caps its scores (tanh): a capped score is not bilinear in q and k")
    mask = cap.mask_rows(site, 0, slice(i, i + 1))
    if mask is None:
        return None
    row = mask[head if mask.shape[0] > 1 else 0, 0].double()
    hidden = [p for p in right + wrong if float(row[p]) <= MASKED]
    if hidden:
        raise InspectorError(f"key position {hidden[0]} is hidden from query {i} at {site.name} (causal mask or padding): "
                             "pick keys the query sees")
    return row


def decompose(model, tokenizer, text: str, target: str | Output | None = None, *,
              site: str, head: int, query_position: int, right_positions, wrong_positions) -> ScoreParts:
    """Decompose head ``head``'s score difference at ``site`` for query ``query_position`` between the keys
    ``wrong_positions`` and ``right_positions`` (token indices, an int or a list: the mean score over a list)
    into the residual components at the query and the keys (module docstring). One forward pass.

    ``site``: a capture site name (:func:`site_names`); positions are on the site's query and key axes. Returns
    :class:`ScoreParts` (``terms`` ``[q part x k part]`` rows in logit units, the marginals, ``difference``,
    ``total``, ``gap``). Raises :class:`InspectorError` for an unsupported family (by name), an unknown site, a
    head or position off its axis, a key the query does not see, RIGHT equal to WRONG, or a model whose
    recorded q, k or residual states differ from what its family's layout gives (1e-4 relative)."""
    sites = site_names(model)
    right, wrong = _positions(right_positions, "right_positions"), _positions(wrong_positions, "wrong_positions")
    query_position, head = _index(query_position, "query_position"), _index(head, "head")
    if sorted(set(right)) == sorted(set(wrong)):
        raise InspectorError(f"RIGHT and WRONG are the same key positions ({right}): give two different sets")
    if site not in sites:
        near = ", ".join(list(sites)[:6])
        raise InspectorError(f"no attention site {site!r} in this model; sites are: {near}{' ...' if len(sites) > 6 else ''}")
    mt = model.config.model_type
    fam = FAMILIES[mt]
    prefixes = _prefixes(model)
    extra = _Extra(model, mt, site, prefixes)
    said = Output.coerce(target)
    _encode_first(model, tokenizer, text, said.text, said.id_lists)
    with extra:
        g = record(model, tokenizer, text, said)
    return _decompose(_Pass(g, mt, fam, extra), site, sites[site], head, query_position, right, wrong)


def _encode_first(model, tokenizer, text, target, target_ids) -> None:
    """The inputs checked (as the capture encodes them) before any hook goes on."""
    from inspector.capture.inputs import encode

    if not isinstance(text, str):
        raise InspectorError("why explains one text at a time: pass one text, not a list")
    encode(model, tokenizer, text, target, target_ids=target_ids)


def _decompose(run: _Pass, name, where, head, i, right, wrong) -> ScoreParts:
    g, mt, extra = run.g, run.mt, run.extra
    cap = g.capture
    site = cap.site(name)
    row = _check_positions(cap, site, head, i, right, wrong)
    kvh = site.head_map[head]
    w_q, b_q, w_k, b_k = _projections(extra.names[name], run.fam, site)
    ids = _ids(g)
    keys = sorted(set(right) | set(wrong))
    qn, qk, qp = _side(run, site, where, query=True, positions=[i], ids=ids, w=w_q[head],
                       b=None if b_q is None else b_q[head])
    kn, kk, kp = _side(run, site, where, query=False, positions=keys, ids=ids, w=w_k[kvh],
                       b=None if b_k is None else b_k[kvh])
    q_rec = cap.tensor(site, "q")[0, head, i].double()
    k_rec = cap.tensor(site, "k")[0, kvh, keys].double()  # [key, d]
    q_err, k_err = _relative_error(qp[:, 0].sum(0), q_rec), _relative_error(kp.sum(0), k_rec)
    if max(q_err, k_err) > CHECK:
        raise InspectorError(f"{site.name}'s recorded {'q' if q_err > CHECK else 'k'} differs from its {mt} layout's "
                             f"(relative error {max(q_err, k_err):.2g}): its scores cannot be decomposed")
    mean_w = torch.tensor([1.0 / len(wrong) if p in wrong else 0.0 for p in keys], dtype=torch.float64)
    mean_r = torch.tensor([1.0 / len(right) if p in right else 0.0 for p in keys], dtype=torch.float64)
    sel = mean_w - mean_r  # [key]: the mean over WRONG minus the mean over RIGHT
    kdiff = torch.einsum("k,pkd->pd", sel, kp)
    matrix = site.scaling * (qp[:, 0] @ kdiff.t())  # [q part, k part]
    bias = 0.0 if row is None else float(sel @ row[keys])  # T5's position bias (0 on visible keys elsewhere)
    scores = site.scaling * (k_rec @ q_rec) + (row[keys] if row is not None else 0.0)
    rows = [{"q_component": a, "q_kind": ka, "k_component": b, "k_kind": kb, "term": float(matrix[x, y])}
            for x, (a, ka) in enumerate(zip(qn, qk, strict=True)) for y, (b, kb) in enumerate(zip(kn, kk, strict=True))]
    if row is not None and (mt == "t5" or bias != 0.0):
        rows.append({"q_component": POSITION_BIAS, "q_kind": POSITION_BIAS, "k_component": POSITION_BIAS,
                     "k_kind": POSITION_BIAS, "term": bias})
    terms = pd.DataFrame(rows, columns=TERM_COLUMNS)
    tokens_q, tokens_k = cap.tokens(site, "query"), cap.tokens(site, "key")
    return ScoreParts(
        site=name, head=head, kv_head=kvh, query_position=i, right_positions=right, wrong_positions=wrong,
        query_token=tokens_q[i], right_tokens=[tokens_k[p] for p in right], wrong_tokens=[tokens_k[p] for p in wrong],
        scaling=site.scaling, terms=terms, by_query=_margin(terms, "q"), by_key=_margin(terms, "k"),
        difference=float(sel @ scores), total=math.fsum(terms["term"]),
        score_right=float(mean_r @ scores), score_wrong=float(mean_w @ scores), q_error=q_err, k_error=k_err)


def _margin(terms: pd.DataFrame, side: str) -> pd.DataFrame:
    grouped = terms.groupby([f"{side}_component", f"{side}_kind"], sort=False)["term"].sum().reset_index()
    grouped.columns = MARGIN_COLUMNS
    return grouped
