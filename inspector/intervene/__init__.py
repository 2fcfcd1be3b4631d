"""Interventions: change what a head sends on and measure what the output does.

* :mod:`~inspector.intervene.seam`: the attention seam set and restored in one context manager
  (zero and mean ablation, patching, recording head outputs);
* :mod:`~inspector.intervene.contrast`: the log-probability table and the contrast metric;
* :mod:`~inspector.intervene.effects`: :func:`ablate`, :func:`patch` and :func:`effects` (attribution
  patching and exact effects).

Imports :mod:`inspector.analysis`, :mod:`inspector.capture` and :mod:`inspector.store`.
"""
