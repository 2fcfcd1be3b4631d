"""Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers", ACL): how much
each input token reaches each position through the stack, from the attention weights alone.

Per self-attention layer the heads' weights are averaged, the residual is added as an identity with
equal share, ``A_hat = 0.5 * mean_h(A_h) + 0.5 * I`` (rows sum to 1), and the layers are multiplied from
the first up: ``R = A_hat_L ... A_hat_1``; ``R[i, j]`` is the share of position i's final state that
rollout traces to input token j. Rows sum to 1.

The value-weighted form first multiplies each head's weights by ``||v_j W_O^h||`` (the capture's
``<site>/value_norm``, Kobayashi et al. 2020) and renormalizes each row
(:func:`inspector.analysis.keys.head_weights` with ``weighting="value-norm"``).

Encoder-decoders: the encoder's rollout ``R_enc [source, source]`` is computed first; the decoder
state ``M [target, source + target]`` starts as ``[0 | I]``, each decoder self-attention layer maps
``M <- A_hat M``, and each cross-attention layer mixes in the encoder's output with the same equal
share: ``M <- 0.5 M + 0.5 mean_h(A_cross) [R_enc | 0]``. Rows still sum to 1.

What rollout cannot tell: it ignores the MLPs, the value vectors' directions and the LayerNorms, and
its 0.5 residual share is an assumption, not a measurement; it says nothing about the sign of an
effect. Use it as a map of where attention *could* have carried information.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inspector.analysis.keys import head_weights
from inspector.errors import InspectorError
from inspector.store.capture_file import Capture, Site

__all__ = ["Rollout", "layer_matrix", "rollout"]


@dataclass
class Rollout:
    """``matrix [row, token]`` (float64): rollout from each output-axis row (the query axis of the
    top stack) to each input token; ``tokens``: ``(role, index, token)`` per column, source first;
    ``rows``: ``(role, index, token)`` per row."""

    matrix: torch.Tensor
    tokens: list[tuple[str, int, str]]
    rows: list[tuple[str, int, str]]
    weighting: str


def layer_matrix(w: torch.Tensor, residual: float = 0.5) -> torch.Tensor:
    """``A_hat = (1 - residual) * mean_h(w) + residual * I`` for weights ``w [head, query, key]`` of a
    self-attention site (query axis equal to key axis), float64, rows renormalized to sum 1."""
    a = w.double().mean(0)
    if a.shape[0] != a.shape[1]:
        raise InspectorError("rollout needs self-attention sites whose query and key axes are the same positions "
                             f"(this one has {a.shape[0]} queries and {a.shape[1]} keys, e.g. LongT5's transient-global keys, "
                             "computed from blocks of tokens): use the gradient methods")
    a = (1 - residual) * a + residual * torch.eye(a.shape[0], dtype=a.dtype)
    return a / a.sum(-1, keepdim=True).clamp_min(torch.finfo(a.dtype).tiny)


def _by_layer(sites: list[Site], what: str) -> list[Site]:
    layers = [s.layer for s in sites]
    if len(set(layers)) != len(layers):
        raise InspectorError(f"the capture has more than one {what} site per layer (repeated calls): rollout needs one "
                             "attention per layer")
    return sorted(sites, key=lambda s: s.layer)


def _stack(capture: Capture, sites: list[Site], batch: int, weighting: str) -> torch.Tensor:
    r = None
    for s in sites:
        a = layer_matrix(head_weights(capture, s, batch, weighting=weighting))
        r = a if r is None else a @ r
    return r


def _labels(capture: Capture, site: Site, which: str, batch: int) -> list[tuple[str, int, str]]:
    return [(rec.role, i, rec.tokens[i]) for rec, i in capture.axis(site, which, batch)]


def rollout(capture: Capture, *, batch: int = 0, weighting: str = "attention") -> Rollout:
    """Attention rollout of a capture (every layer must be captured); see the module docstring.

    Raises :class:`InspectorError` when a layer is missing, a site has repeated calls, or (value-norm
    weighting) a site has no value norms.
    """
    layout = capture.meta.get("layout")
    selfs = [s for s in capture.sites if s.kind != "cross"]
    if layout != "encoder-decoder":
        sites = _by_layer(selfs, "self-attention")
        if not sites:
            raise InspectorError("the capture has no self-attention sites: nothing to roll out")
        _check_complete(sites)
        r = _stack(capture, sites, batch, weighting)
        labels = _labels(capture, sites[0], "key", batch)
        return Rollout(matrix=r, tokens=labels, rows=_labels(capture, sites[-1], "query", batch), weighting=weighting)
    enc = _by_layer([s for s in selfs if s.stack == "encoder"], "encoder self-attention")
    dec = _by_layer([s for s in selfs if s.stack == "decoder"], "decoder self-attention")
    cross = {s.layer: s for s in _by_layer([s for s in capture.sites if s.kind == "cross"], "cross-attention")}
    if not enc or not dec:
        raise InspectorError("rollout of an encoder-decoder needs every encoder and decoder layer in the capture")
    _check_complete(enc)
    _check_complete(dec)
    if set(cross) != {s.layer for s in dec}:
        raise InspectorError("rollout of an encoder-decoder needs the cross-attention of every decoder layer")
    r_enc = _stack(capture, enc, batch, weighting)  # [encoder position, encoder input]
    # the rows the cross-attention reads: the encoder's output positions its keys are (Pegasus-X's encoder also
    # runs learned global tokens, whose states the decoder never sees)
    enc_rows = {label[:2]: i for i, label in enumerate(_labels(capture, enc[-1], "query", batch))}
    cross_keys = _labels(capture, cross[dec[0].layer], "key", batch)
    missing = [label for label in cross_keys if label[:2] not in enc_rows]
    if missing:
        raise InspectorError(f"rollout cannot follow {cross[dec[0].layer].name}: its key {missing[0][0]} {missing[0][1]} "
                             "is no position of the encoder's last layer")
    n_in, n_dec = r_enc.shape[1], dec[0].query_len
    r_out = r_enc[[enc_rows[label[:2]] for label in cross_keys]]  # [cross key, encoder input]
    enc_part = torch.cat([r_out, torch.zeros(len(cross_keys), n_dec, dtype=r_enc.dtype)], 1)  # [key, input + target]
    m = torch.cat([torch.zeros(n_dec, n_in, dtype=r_enc.dtype), torch.eye(n_dec, dtype=r_enc.dtype)], 1)
    for s in dec:
        m = layer_matrix(head_weights(capture, s, batch, weighting=weighting)) @ m
        c = head_weights(capture, cross[s.layer], batch, weighting=weighting).double().mean(0)  # [target, source]
        m = 0.5 * m + 0.5 * (c @ enc_part)
    labels = _labels(capture, enc[0], "key", batch) + _labels(capture, dec[0], "key", batch)
    return Rollout(matrix=m, tokens=labels, rows=_labels(capture, dec[-1], "query", batch), weighting=weighting)


def _check_complete(sites: list[Site]) -> None:
    layers = [s.layer for s in sites]
    if layers != list(range(len(layers))):
        missing = sorted(set(range(max(layers) + 1)) - set(layers))
        raise InspectorError(f"rollout needs every layer, but the capture lacks layer(s) {missing}: capture without --layers")
