"""The keys a query sees and the weights it puts on them: one definition of each, for rank, split,
explain, the views, the report and the corpus scan.

* :func:`visible_keys`: boolean ``[1|head, query, key]``, the keys each query row can see (its mask and
  padding; :func:`inspector.store.masks.visible_by_mask` is the rule).
* Weighting (``weighting="value-norm"``, Kobayashi et al. 2020, "Attention is Not Only a Weight"):
  each weight times the norm of what its key sends through the head, ``||v_j W_O^h||`` (the capture's
  ``<site>/value_norm``), renormalized per query row; ``"attention"`` (default) uses the raw weights.
  :func:`head_weights` reads a site's weights either way, :func:`weighted_sites` names the sites that
  cannot be read value-weighted.

Pure functions: a :class:`~inspector.store.Capture` in, tensors out; no I/O, no model.
"""

from __future__ import annotations

import torch

from inspector.errors import InspectorError
from inspector.store.capture_file import Capture, Site
from inspector.store.masks import (
    MASKED,  # noqa: F401  (the one definition; re-exported)
    visible_by_mask,
)

WEIGHTINGS = ("attention", "value-norm")


def visible_keys(capture: Capture, site: Site, batch: int, queries: slice, *, pad_k: torch.Tensor) -> torch.Tensor:
    """Boolean ``[1 or head, query, key]``: keys each query row ``queries`` of ``capture``'s batch row ``batch`` can
    see at ``site``: its mask (:func:`inspector.store.masks.visible_by_mask`, the one rule) less the padding keys
    ``pad_k [key]``."""
    n = len(range(*queries.indices(site.query_len)))
    return visible_by_mask(site, (~pad_k).expand(1, n, -1), capture.mask_rows(site, batch, queries),
                   torch.arange(*queries.indices(site.query_len)))



def check_weighting(weighting: str) -> None:
    """InspectorError naming the choices unless ``weighting`` is one of :data:`WEIGHTINGS`."""
    if weighting not in WEIGHTINGS:
        raise InspectorError(f"unknown weighting {weighting!r}: use {' or '.join(WEIGHTINGS)}")


def check_batch(capture: Capture, batch: int) -> None:
    """InspectorError naming the rows there are unless ``batch`` is a batch row of ``capture``."""
    if not 0 <= batch < capture.batch_size:
        raise InspectorError(f"batch row {batch} does not exist: this capture has rows 0..{capture.batch_size - 1}")


def value_norms_of(capture: Capture, site: Site, batch: int = 0) -> torch.Tensor:
    """``[head, key]`` value norms ``||v_j W_O^h||`` of a site (float32); InspectorError naming the reason
    when the capture has none for it."""
    vn = capture.value_norms(site, batch)
    if vn is None:
        why = site.value_norm_note or "the capture was made before value norms were recorded"
        raise InspectorError(f"site {site.name} has no value norms ({why}): use --weighting attention"
                             + (", or capture again with this inspector" if _recapture_helps(site) else ""))
    return vn


def _recapture_helps(site: Site) -> bool:
    """Whether capturing again gives ``site`` value norms: only where they were not recorded (an older capture,
    ``value_norms=False``), not where the model cannot give them (output_attentions sites: LED, LongT5,
    Pegasus-X...; weights offloaded or quantized; heads not told apart)."""
    note = site.value_norm_note
    return site.eager_function != "output_attentions" and (note is None or "value_norms=False" in note)


def reweight_(w: torch.Tensor, value_norm: torch.Tensor) -> torch.Tensor:
    """Value-weighted attention in place: ``w [head, query, key] * value_norm [head, key]``, each row
    renormalized to sum 1 (Kobayashi et al. 2020). Rows with no weight left stay 0."""
    w.mul_(value_norm[:, None, :])
    return w.div_(w.sum(-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny))


def head_weights(capture: Capture, site: Site | str, batch: int = 0, heads: list[int] | None = None,
                 *, queries: slice | None = None, weighting: str = "attention") -> torch.Tensor:
    """Weights ``[head, query, key]`` (float32) as :meth:`Capture.weights` gives them, or value-weighted
    (``weighting="value-norm"``: times ``||v_j W_O^h||``, renormalized per row)."""
    check_weighting(weighting)
    site = capture.site(site) if isinstance(site, str) else site
    w = capture.weights(site, batch, heads=heads, queries=queries)
    if weighting == "value-norm":
        vn = value_norms_of(capture, site, batch)
        reweight_(w, vn if heads is None else vn[list(heads)])
    return w


def weighted_sites(capture: Capture, sites: list[Site], weighting: str) -> tuple[list[Site], dict[str, str]]:
    """The sites that can be read with ``weighting`` and, for the others, why not (site name -> reason)."""
    check_weighting(weighting)
    if weighting == "attention":
        return list(sites), {}
    ok = [s for s in sites if "value_norm" in s.parts]
    left = {s.name: s.value_norm_note or "no value norms in this capture" for s in sites if "value_norm" not in s.parts}
    if not ok and sites:
        name, why = next(iter(left.items()))
        again = ", or capture again with this inspector" if any(_recapture_helps(s) for s in sites) else ""
        raise InspectorError(f"no site of this capture has value norms (e.g. {name}: {why}): use --weighting attention"
                             + again)
    return ok, left
