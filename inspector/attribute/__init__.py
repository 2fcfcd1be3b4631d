"""Attribution: where an output came from, in the input, the residual stream or the source's sentences.

* :mod:`~inspector.attribute.attribution`: input-token attribution: input x gradient (Shrikumar et al. 2016),
  integrated gradients with its completeness rule (Sundararajan et al. 2017), rollout (Abnar & Zuidema 2020);
* :mod:`~inspector.attribute.families`: the one table of the model families the residual decompositions know
  (the block layout routes read, the q/k projections score_parts reads);
* :mod:`~inspector.attribute.routes`: information-flow routes and the heads on them (Ferrando & Voita 2024, with
  ALTI's post-LN treatment, Ferrando et al. 2022);
* :mod:`~inspector.attribute.score_parts`: one head's attention-score difference decomposed exactly into residual
  parts at the query and the keys (:class:`~inspector.attribute.score_parts.ScoreParts`);
* :mod:`~inspector.attribute.units`: a source's units for ContextCite (Cohen-Wang et al. 2024): its sentences,
  or phrases and character spans the caller gives, and the tokens each holds;
* :mod:`~inspector.attribute.surrogate`: ContextCite's random masks, LASSO surrogate and its faithfulness (the
  LDS of Park et al. 2023's datamodels, top-k drops), numpy only;
* :mod:`~inspector.attribute.sources`: ContextCite on a model (:func:`~inspector.attribute.sources.sources`,
  its options :class:`~inspector.attribute.sources.SourcesOptions`): the masked or removed units scored in
  batched passes, beside integrated gradients and attention baselines.

Imports :mod:`inspector.intervene` (the contrast metric, the frozen seam), :mod:`inspector.analysis`,
:mod:`inspector.capture` and :mod:`inspector.store`. The package is callable, as the top-level API names it:
``inspector.attribute(model, tokenizer, text, ...)`` is :func:`~inspector.attribute.attribution.attribute`, while
``import inspector.attribute.routes`` still gives the module; nothing heavy is imported until it is called.
"""

from __future__ import annotations

import importlib
import sys
import types

__all__: list[str] = []


class _CallablePackage(types.ModuleType):
    """The package's type: calling it calls :func:`inspector.attribute.attribution.attribute`."""

    def __call__(self, *args, **kwargs):
        return importlib.import_module("inspector.attribute.attribution").attribute(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
