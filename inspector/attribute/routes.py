"""Information-flow routes (Ferrando & Voita 2024, "Information Flow Routes: Automatically Interpreting
Language Models at Scale", EMNLP): which residual states, through which heads and MLPs, built one
position's final state.

Graph. A node is a residual state ``(stack, level, position)``: level 0 is the input of the first
block; each sub-layer (self-attention, cross-attention, MLP) of block ``b`` makes the next level. The
incoming edges of a node ``y`` at position i are its exact decomposition:

* ``residual``: the previous level's state at i;
* ``attention``: for each head h and key position j, ``A[h, i, j] * v_j W_O^h`` (the head's weight times
  its value through its slice of the output projection), from the previous level's state at j, or,
  for cross-attention, from the encoder's last state at j;
* ``mlp``: the MLP's output at i, from the previous level's state at i;

plus the output projection's bias (not an edge: it comes from no node). Pre-LN blocks (GPT-2, Llama,
T5) add these as they are: ``y = sum of edges + bias``. Post-LN blocks (BERT, BART) apply a LayerNorm
to the sum ``s``; with the node's own ``sigma = sqrt(var(s) + eps)`` it is linear, so each edge's
vector is ``gamma * (z - mean(z)) / sigma`` and the LayerNorm's ``beta`` joins the bias (the exact
treatment of ALTI, Ferrando et al. 2022). Either way the edges and the bias sum to the node's state
(tests check 1e-4 relative on every supported family); the model's own states are recorded by hooks
during the one forward pass and the decomposition is checked against them before any route is drawn.

Importance (the paper's proximity, L1 as in ALTI): ``proximity(z, y) = max(0, ||y||_1 - ||y - z||_1)``,
``importance = proximity / sum of the node's incoming proximities``, the incoming edges being the
residual, the MLP and, for attention, one edge per key position j carrying ``z_j = sum_h A[h, i, j] v_j
W_O^h`` (the paper's token-to-token edge; ``head = -1`` in the table). Each head's own part ``z_hj`` is
scored against the same denominator, and listed as its own row (``head = h``) when above the threshold.
The route of one position keeps, from its top node down, every edge with importance above
``threshold`` (default 0.04) and continues from the nodes those edges start at.

Supported: BERT, GPT-2, Llama / Mistral / Qwen 2 (grouped-query), BART, T5. Any other model type, or a
model whose blocks do not compute what the family's layout says (checked on the recorded states), is
refused by name. What routes cannot tell: importance is geometric closeness, not causal effect; a head
can matter by a small, well-aimed vector (use ``effects`` for that).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import torch

from inspector.attribute.families import FAMILIES, Step
from inspector.capture.inputs import TOKENIZER_LOCK, encode
from inspector.capture.interface import model_alone
from inspector.capture.output import Output
from inspector.capture.value_norm import head_slices
from inspector.errors import InspectorError
from inspector.store.capture_file import Capture

THRESHOLD = 0.04
KEY_BLOCK = 128  # key positions per block when forming head contributions (memory: head x block x hidden)
EDGE_COLUMNS = ["stack", "layer", "sublayer", "from_stack", "from_level", "from_position", "from_token", "to_level",
                "to_position", "to_token", "kind", "site", "head", "importance"]

__all__ = ["EDGE_COLUMNS", "THRESHOLD", "Graph", "check_model", "heads_on_route", "record", "routes"]


CHECK = 1e-4  # the recorded states must equal the layout's sums to this relative tolerance


def _first(x):
    return x[0] if isinstance(x, tuple | list) else x


@dataclass
class _Stack:
    name: str
    prefix: str
    steps: tuple[Step, ...]
    n_blocks: int
    nodes: list[torch.Tensor | None] = field(default_factory=list)  # level -> [position, hidden] float32
    sums: dict[int, torch.Tensor] = field(default_factory=dict)  # post-LN: level -> the LayerNorm's input
    outputs: dict[int, torch.Tensor] = field(default_factory=dict)  # block -> the block's own output

    def step(self, level: int) -> tuple[int, Step]:
        return (level - 1) // len(self.steps), self.steps[(level - 1) % len(self.steps)]


@dataclass
class Graph:
    """The recorded pass: per stack the residual states of every level, the lazy capture (Q, K, V,
    masks), the model (for the output projections and LayerNorms) and the token labels."""

    model: object
    capture: Capture
    stacks: dict[str, _Stack]
    tokens: dict[str, list[str]]
    sites: dict[tuple[str, int, str], str]  # (stack, block, step kind) -> site name
    # (stack, level, position) -> the node's incoming edges without vectors, decomposed once per pass: the route,
    # heads_on_route and the figure read the same nodes (read-only)
    decomposed: dict[tuple[str, int, int], dict] = field(default_factory=dict, repr=False)

    def level_count(self, stack: str) -> int:
        """How many residual levels ``stack`` has: one per step (attention, cross-attention, MLP) of each block,
        plus the embeddings. Raises ``KeyError`` for a stack the graph does not hold."""
        s = self.stacks[stack]
        return s.n_blocks * len(s.steps) + 1

    def memory_bytes(self) -> int:
        """Bytes held: the capture's tensors and the recorded states."""
        cap = sum(t.numel() * t.element_size() for t in self.capture.tensors.values())
        states = sum(t.numel() * t.element_size() for s in self.stacks.values() for t in [*s.nodes, *s.sums.values()]
                     if t is not None)
        return cap + states

    def incoming(self, stack: str, level: int, position: int, *, keep_vectors: bool = False) -> dict:
        """The node's incoming edges: ``edges`` (list of dicts with kind, from_stack, from_level,
        from_position, site, head, importance, and ``vector`` when ``keep_vectors``), ``bias`` (hidden),
        ``state`` (the recorded state), ``total`` (the sum of the edges' vectors, plus the bias)."""
        if keep_vectors:
            return _incoming(self, stack, level, [position], True)[0]
        return _nodes(self, stack, level, [position])[0]


def _nodes(g: Graph, stack: str, level: int, positions: list[int]) -> list[dict]:
    """The nodes at ``positions`` of one level (edges without vectors), each decomposed once per graph: the
    positions not decomposed yet are decomposed together, the others read from ``g.decomposed``."""
    missing = [p for p in positions if (stack, level, p) not in g.decomposed]
    if missing:
        for p, node in zip(missing, _incoming(g, stack, level, missing, False), strict=True):
            g.decomposed[(stack, level, p)] = node
    return [g.decomposed[(stack, level, p)] for p in positions]


def _resolve_stacks(model) -> dict[str, _Stack]:
    mt = getattr(model.config, "model_type", "")
    fam = FAMILIES.get(mt)
    if fam is None:
        raise InspectorError(f"routes decompose the residual of {', '.join(sorted(FAMILIES))} models; {mt!r} is not among "
                             "them (its blocks' layout is not known to inspector, so its residual is not decomposed)")
    names = dict(model.named_modules())
    out = {}
    for stack, (prefixes, steps) in fam.stacks.items():
        prefix = next((p for p in prefixes if p in names), None)
        if prefix is None:
            raise InspectorError(f"{type(model).__name__} ({mt}) has no block list at {' or '.join(prefixes)}: routes "
                                 "cannot find its layers")
        out[stack] = _Stack(stack, prefix, steps, len(names[prefix]))
    return out


def check_model(model) -> None:
    """Raise :class:`InspectorError` naming ``model`` (its class and ``model_type``) when routes cannot decompose
    its residual: a family inspector does not know, or no block list where the family keeps it. Loads
    nothing and runs nothing (:func:`record` also checks, on the recorded states, that the blocks add up)."""
    _resolve_stacks(model)


def _hooks(model, stacks: dict[str, _Stack]):
    names = dict(model.named_modules())
    handles = []
    for st in stacks.values():
        n_steps = len(st.steps)
        st.nodes = [None] * (st.n_blocks * n_steps + 1)

        def pre(_m, args, kwargs, st=st):
            if st.nodes[0] is None:
                x = args[0] if args else kwargs.get("hidden_states")
                st.nodes[0] = _first(x)[0].detach().float().clone()

        handles.append(names[f"{st.prefix}.0"].register_forward_pre_hook(pre, with_kwargs=True))
        for b in range(st.n_blocks):
            block = f"{st.prefix}.{b}"

            def out_hook(_m, _a, out, *, st=st, b=b):
                st.outputs[b] = _first(out)[0].detach().float().clone()

            handles.append(names[block].register_forward_hook(out_hook))
            for k, step in enumerate(st.steps):
                level = b * n_steps + k + 1
                if step.norm is None:
                    def delta(_m, _a, out, *, st=st, level=level):
                        st.nodes[level] = st.nodes[level - 1] + _first(out)[0].detach().float()

                    handles.append(names[f"{block}.{step.delta}"].register_forward_hook(delta))
                else:
                    def norm(_m, args, out, *, st=st, level=level):
                        st.sums[level] = args[0][0].detach().float().clone()
                        st.nodes[level] = _first(out)[0].detach().float().clone()

                    handles.append(names[f"{block}.{step.norm}"].register_forward_hook(norm))
    return handles


def record(model, tokenizer, text: str, target: str | Output | None = None) -> Graph:
    """One forward pass: a lazy capture (Q, K, V, masks) and every residual state of every level (hooks).

    Raises :class:`InspectorError` for an unsupported family, a list of texts, or blocks whose recorded
    output differs from the layout's sum (the residual is not what the family's layout says)."""
    from inspector.capture.recorder import capture

    if not isinstance(text, str):
        raise InspectorError("routes trace one text at a time: pass one text, not a list")
    stacks = _resolve_stacks(model)
    said = Output.coerce(target)
    target, target_ids = said.text, said.id_lists
    # the hooks see every pass of the model: where concurrent_captures shares it between threads, this pass runs
    # alone (model_alone); the tokenizer is one object for every thread
    with model_alone(model), TOKENIZER_LOCK:
        encode(model, tokenizer, text, target, target_ids=target_ids)  # user mistakes before the hooks go on
        handles = _hooks(model, stacks)
        try:
            cap = capture(model, tokenizer, text, Output.of(target, ids=target_ids), weights=False, value_norms=False)
        finally:
            for h in handles:
                h.remove()
    cap.output = None
    for st in stacks.values():
        for b, out in st.outputs.items():
            mine = st.nodes[(b + 1) * len(st.steps)]
            if mine is None or not torch.allclose(mine, out, rtol=CHECK, atol=CHECK * float(out.abs().max())):
                raise InspectorError(
                    f"{type(model).__name__} block {st.prefix}.{b} does not output the sum its {model.config.model_type} layout "
                    "says (another residual arrangement): its residual cannot be decomposed by routes")
        st.outputs.clear()
    sites, tokens = {}, {}
    for st in stacks.values():
        for b in range(st.n_blocks):
            for step in st.steps:
                if step.site:
                    sites[(st.name, b, step.kind)] = f"{st.prefix}.{b}.{step.site}"
    missing = [n for n in sites.values() if n not in {s.name for s in cap.sites}]
    if missing:
        raise InspectorError(f"the capture has no attention site {missing[0]}: routes need every attention layer")
    for st in stacks.values():
        site = cap.site(sites[(st.name, 0, "attention")])
        tokens[st.name] = cap.tokens(site, "query")
    return Graph(model=model, capture=cap, stacks=stacks, tokens=tokens, sites=sites)


def _norm_map(g: Graph, st: _Stack, block: int, step: Step, level: int, rows: list[int]):
    """``(f, beta)``: ``f(z [..., hidden], r)`` maps a contribution to row ``rows[r]``'s node. Post-LN: the
    LayerNorm's linear map with that row's own sigma, ``gamma * (z - mean(z)) / sigma``, and its ``beta``;
    pre-LN: the identity and None."""
    if step.norm is None:
        return (lambda z, r: z), None
    ln = dict(g.model.named_modules())[f"{st.prefix}.{block}.{step.norm}"]
    s = st.sums[level][rows]  # [row, hidden]
    sigma = torch.sqrt(s.var(-1, unbiased=False) + ln.eps)  # [row]
    gamma = ln.weight.detach().float()

    def f(z, r):
        return gamma * (z - z.mean(-1, keepdim=True)) / sigma[r]

    beta = ln.bias.detach().float() if getattr(ln, "bias", None) is not None else None
    return f, beta


def _proximity(y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """``max(0, ||y||_1 - ||y - z||_1)`` over the last axis; ``y [hidden]``, ``z [..., hidden]``."""
    return (y.abs().sum() - (y - z).abs().sum(-1)).clamp_min(0)


def _incoming(g: Graph, stack: str, level: int, rows: list[int], keep_vectors: bool) -> list[dict]:
    st = g.stacks[stack]
    block, step = st.step(level)
    f, beta = _norm_map(g, st, block, step, level, rows)
    prev = st.nodes[level - 1][rows]  # [row, hidden]
    y = st.nodes[level][rows]
    res = [{"edges": [], "bias": torch.zeros_like(y[0]), "state": y[r], "total": torch.zeros_like(y[0])} for r in range(len(rows))]
    fixed = [("residual", prev)]
    if step.kind == "mlp":
        fixed.append(("mlp", (st.sums[level][rows] if step.norm else st.nodes[level][rows]) - prev))
    for r in range(len(rows)):
        for kind, vecs in fixed:
            vec = f(vecs[r], r)
            res[r]["edges"].append({"kind": kind, "from_stack": stack, "from_level": level - 1, "from_position": rows[r],
                                    "site": "", "head": -1, "vector": vec, "proximity": _proximity(y[r], vec)})
            res[r]["total"] = res[r]["total"] + vec
    if step.kind != "mlp":
        _attention_edges(g, st, level, rows, f, y, res)
    for r in range(len(rows)):
        if beta is not None:
            res[r]["bias"] = res[r]["bias"] + beta
        res[r]["total"] = res[r]["total"] + res[r]["bias"]
        _normalise(res[r], keep_vectors)
    return res


def _attention_edges(g: Graph, st: _Stack, level: int, rows: list[int], f, y, res) -> None:
    """The edges into ``level`` of ``st`` from one attention block's heads (its block and step: ``st.step(level)``)."""
    block, step = st.step(level)
    cap = g.capture
    site = cap.site(g.sites[(st.name, block, step.kind)])
    proj = dict(g.model.named_modules())[f"{st.prefix}.{block}.{step.out_proj}"]
    w_o = head_slices(proj, site.num_heads, site.d_v)  # [head, d_v, hidden]
    if w_o is None:
        raise InspectorError(f"{step.out_proj} of block {block} does not take {site.num_heads} x {site.d_v} inputs: "
                             "its heads cannot be told apart")
    w_o = w_o.detach().float()
    bias = getattr(proj, "bias", None)
    v = cap.tensor(site, "v")[0].float()  # [kv_head, key, d_v]
    a = cap.weights(site, 0, queries=slice(min(rows), max(rows) + 1))[:, [r - min(rows) for r in rows]]  # [head, row, key]
    index = torch.as_tensor(site.head_map, dtype=torch.long)
    from_stack = "encoder" if step.kind == "cross" else st.name
    from_level = g.level_count("encoder") - 1 if step.kind == "cross" else level - 1
    prox = torch.zeros(len(rows), site.num_heads, site.key_len)
    prox_pos = torch.zeros(len(rows), site.key_len)
    for start in range(0, site.key_len, KEY_BLOCK):
        blk = slice(start, min(start + KEY_BLOCK, site.key_len))
        vw = torch.einsum("hkd,hde->hke", v[index, blk], w_o)  # [head, block, hidden]
        for r in range(len(rows)):
            z = f(a[:, r, blk, None] * vw, r)  # [head, block, hidden]
            prox[r, :, blk] = _proximity(y[r], z)
            prox_pos[r, blk] = _proximity(y[r], z.sum(0))
            res[r]["total"] = res[r]["total"] + z.sum((0, 1))
    for r in range(len(rows)):
        if bias is not None:
            res[r]["bias"] = res[r]["bias"] + f(bias.detach().float(), r)
        res[r]["attention"] = (prox[r], prox_pos[r], from_stack, from_level, site.name)


def _normalise(node: dict, keep_vectors: bool) -> None:
    att = node.pop("attention", None)
    total = sum(float(e["proximity"]) for e in node["edges"]) + (float(att[1].sum()) if att else 0.0)
    for e in node["edges"]:
        e["importance"] = float(e.pop("proximity")) / total if total > 0 else 0.0
        if not keep_vectors:
            e.pop("vector")
    if att is not None:
        prox, prox_pos, fs, fl, name = att
        scale = 1 / total if total > 0 else 0.0
        node["attention"] = {"importance": prox_pos * scale, "heads": prox * scale, "from_stack": fs, "from_level": fl,
                             "site": name}


def routes(model, tokenizer, text: str, target: str | Output | None = None, *, position: int | None = None,
           contrast: str | tuple[str, str] | None = None, query: str | None = None, occurrence: int | None = None,
           threshold: float = THRESHOLD, graph: Graph | None = None,
           stack: str | None = None) -> pd.DataFrame:
    """The route of one position's top residual state: every edge with importance above ``threshold``,
    found top-down (module docstring). Columns :data:`EDGE_COLUMNS`; ``attrs``: ``position``, ``threshold``,
    ``forward_calls`` (1), ``memory_bytes`` (capture and states held).

    ``position``: on the top stack's axis (the decoder input of an encoder-decoder; prompt and
    continuation of a decoder-only model), or on ``stack``'s (``"encoder"``: a route that stays in an
    encoder-decoder's encoder); default the row a contrast reads (``contrast``), else the last
    position. Raises :class:`InspectorError` for an unsupported model (by name), a position off the axis,
    or a threshold outside [0, 1).
    """
    if not 0 <= threshold < 1:
        raise InspectorError(f"--threshold must be in [0, 1), got {threshold}")
    said = Output.coerce(target)
    target, target_ids = said.text, said.id_lists
    g = graph or record(model, tokenizer, text, said)
    top = stack or ("decoder" if "decoder" in g.stacks else next(iter(g.stacks)))
    if top not in g.stacks:
        raise InspectorError(f"stack {top!r} is not one of this model's ({', '.join(g.stacks)})")
    n = len(g.tokens[top])
    if position is None and contrast is not None:
        from inspector.attribute.attribution import metric_for

        position = max(metric_for(model, tokenizer, encode(model, tokenizer, text, target, target_ids=target_ids),
                                  contrast=contrast, query=query, occurrence=occurrence).rows)
    position = n - 1 if position is None else position
    if not 0 <= position < n:
        raise InspectorError(f"--position must be 0..{n - 1} (positions of the {top if top != 'none' else 'input'}), got {position}")
    frontier: dict[tuple[str, int], set[int]] = {(top, g.level_count(top) - 1): {position}}
    order = [s for s in ("decoder", "none", "encoder") if s in g.stacks]
    rows = []
    for stack in order:
        for level in range(g.level_count(stack) - 1, 0, -1):
            positions = sorted(frontier.pop((stack, level), set()))
            if positions:
                rows += _kept(g, stack, level, positions, threshold, frontier)
    table = pd.DataFrame(rows, columns=EDGE_COLUMNS)
    table.attrs.update(position=position, threshold=threshold, forward_calls=1, memory_bytes=g.memory_bytes())
    return table


def _kept(g: Graph, stack: str, level: int, positions: list[int], threshold: float, frontier) -> list[dict]:
    block, step = g.stacks[stack].step(level)
    out = []
    for pos, node in zip(positions, _nodes(g, stack, level, positions), strict=True):
        base = {"stack": stack, "layer": block, "sublayer": step.kind, "to_level": level, "to_position": pos,
                "to_token": g.tokens[stack][pos]}
        for e in node["edges"]:
            if e["importance"] > threshold:
                out.append({**base, **e, "from_token": g.tokens[e["from_stack"]][e["from_position"]]})
                frontier.setdefault((e["from_stack"], e["from_level"]), set()).add(e["from_position"])
        att = node.get("attention")
        if att is not None:
            kept = [(-1, j, float(att["importance"][j])) for j in (att["importance"] > threshold).nonzero()[:, 0].tolist()]
            kept += [(h, j, float(att["heads"][h, j])) for h, j in (att["heads"] > threshold).nonzero().tolist()]
            for h, j, imp in kept:
                out.append({**base, "kind": "attention", "from_stack": att["from_stack"], "from_level": att["from_level"],
                            "from_position": j, "from_token": g.tokens[att["from_stack"]][j], "site": att["site"],
                            "head": h, "importance": imp})
                frontier.setdefault((att["from_stack"], att["from_level"]), set()).add(j)
    return out



def _reached(route: pd.DataFrame) -> set[tuple[str, int, int]]:
    """Nodes whose incoming edges the route examined: every edge's end, and every start above level 0."""
    ends = set(zip(route["stack"], route["to_level"].astype(int), route["to_position"].astype(int), strict=True))
    starts = {(s, int(lv), int(p)) for s, lv, p in zip(route["from_stack"], route["from_level"], route["from_position"],
                                                          strict=True) if lv > 0}
    return ends | starts


def heads_on_route(graph: Graph, route: pd.DataFrame, heads: list[tuple[str, int]], *,
                   threshold: float = THRESHOLD) -> pd.DataFrame:
    """Whether each head lies on the route (the definition ``inspector debug`` and ``inspector scan --routes``
    share): a head is **on the route** when, at some attention node the route reaches (a residual state at
    that head's site whose incoming edges the route examined), the head's own contribution from one key
    position, ``A[h, i, j] v_j W_O^h``, has importance above ``threshold`` -- the same proximity and
    denominator as the route's token-to-token edges, so exactly when the route table lists a row
    ``head = h`` for that site.

    Per ``(site, head)`` of ``heads``: ``site, head, best_share`` (its largest per-head importance over
    the attention nodes the route reaches, in [0, 1]; 0 where the route never reaches its site),
    ``from_token``, ``to_token`` (where that best share sits), ``on_route`` (``best_share > threshold``).
    ``graph`` is the :func:`record` of the pass ``route`` was drawn from. The reached nodes of one level
    are decomposed together (no forward pass); nodes the route drawn from ``graph`` decomposed are not
    decomposed again."""
    wanted: dict[str, set[int]] = {}
    for site, h in heads:
        wanted.setdefault(site, set()).add(int(h))
    by_level: dict[tuple[str, int], list[int]] = {}
    for stack, level, pos in sorted(_reached(route)):
        by_level.setdefault((stack, level), []).append(pos)
    best: dict[tuple[str, int], tuple[float, str, str]] = {}
    for (stack, level), positions in by_level.items():
        block, step = graph.stacks[stack].step(level)
        site = graph.sites.get((stack, block, step.kind))
        if step.kind == "mlp" or site not in wanted:
            continue
        for pos, node in zip(positions, _nodes(graph, stack, level, positions), strict=True):
            att = node["attention"]
            for h in wanted[site]:
                j = int(att["heads"][h].argmax())
                share = float(att["heads"][h, j])
                if share > best.get((site, h), (-1.0,))[0]:
                    best[(site, h)] = (share, graph.tokens[att["from_stack"]][j], graph.tokens[stack][pos])
    rows = []
    for site, h in heads:
        share, frm, to = best.get((site, int(h)), (0.0, "", ""))
        rows.append({"site": site, "head": int(h), "best_share": share, "from_token": frm, "to_token": to,
                     "on_route": share > threshold})
    return pd.DataFrame(rows, columns=["site", "head", "best_share", "from_token", "to_token", "on_route"])
