"""Interventions: change what a head sends on and measure what the output does.

* :mod:`~inspector.intervene.seam`: the attention seam set and restored in one context manager
  (zero and mean ablation, patching, recording head outputs);
* :mod:`~inspector.intervene.contrast`: the log-probability table and the contrast metric;
* :mod:`~inspector.intervene.effects`: :func:`ablate`, :func:`patch` and :func:`effects` (attribution
  patching and exact effects);
* :mod:`~inspector.intervene.rerun`: exact effects that rerun only what a head changes (kept layer inputs, the
  encoder's output, ablations batched within a memory bound);
* :mod:`~inspector.intervene.long_sites`: where long-document attention's head outputs enter the output projection.

Imports :mod:`inspector.analysis`, :mod:`inspector.capture` and :mod:`inspector.store`; token attribution,
routes, score parts and ContextCite are the stage above (:mod:`inspector.attribute`), which imports this one.
"""
