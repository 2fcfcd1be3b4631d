"""``inspector scan --routes``: which heads lie on the route of a document's query token.

For a document that names a query, :func:`document_route` records one forward pass of the document
alone with hooks (:func:`inspector.attribute.routes.record`), draws the information-flow route
(Ferrando & Voita 2024, :func:`~inspector.attribute.routes.routes`, threshold ``tau``) of the **query
token** and tells, for every head of every attention site, whether it lies on that route
(:func:`~inspector.attribute.routes.heads_on_route`: the definition ``inspector debug`` uses).

**The query token** (definition): the last token of the query word's occurrence -- the occurrence the
split analysis judges (the document's ``occurrence``, else the only one; a word that occurs more than
once without an occurrence is the document's error, as in the split). For an encoder that is the row
``debug`` traces with the cosine metric on the query word (the metric's last row). The word is looked
for on the top stack's axis (the decoder input of an encoder-decoder, the prompt and continuation of a
decoder-only model); only where it is not there (an encoder-decoder whose query is in the source) the
route starts at the encoder's last state of that token and stays in the encoder.

Columns per ``(site, head)``: ``on_route`` (bool) and ``route_share`` (the head's ``best_share``: its
largest own importance at the nodes the route reaches, in [0, 1], 0 where the route never reaches its
site). Cost: one more forward pass per document with a query, and the decomposition of the nodes the
route reaches (no gradient).
"""

from __future__ import annotations

import pandas as pd

from inspector.analysis import placement
from inspector.analysis.question import Question
from inspector.attribute.families import FAMILIES
from inspector.attribute.routes import THRESHOLD, check_model, heads_on_route, record, routes
from inspector.corpus.documents import Document
from inspector.errors import InspectorError

ROUTE_COLUMNS = ["on_route", "route_share"]

__all__ = ["ROUTE_COLUMNS", "check_config", "check_loaded", "document_route", "query_token"]


def _refusal(name: str, exc: InspectorError) -> InspectorError:
    return InspectorError(f"--routes cannot trace {name}: {exc}; scan without --routes")


def check_loaded(model, name: str) -> None:
    """Refuse (``InspectorError`` naming ``name``) a loaded model whose residual routes cannot decompose."""
    try:
        check_model(model)
    except InspectorError as exc:
        raise _refusal(name, exc) from None


def check_config(model: str | None, name: str, trust_remote_code: bool = False) -> None:
    """The same refusal from the model's config alone (its ``model_type``; no weights loaded): for the Ray
    engine, whose actors load the model."""
    from transformers import AutoConfig

    from inspector.capture.models import check_model_source, resolve_model_name

    path = resolve_model_name(model)
    local_only = check_model_source(path)  # a model that is nowhere: one line now
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, local_files_only=local_only)
    except Exception:  # noqa: BLE001 - the actors report a model that cannot load, with load_model's message
        return
    mt = getattr(config, "model_type", "")
    if mt not in FAMILIES:
        raise _refusal(name, InspectorError(f"routes decompose the residual of {', '.join(sorted(FAMILIES))} models; "
                                            f"{mt!r} is not among them"))


def query_token(graph, doc: Document) -> tuple[str, int]:
    """``(stack, position)`` of ``doc``'s query token (module docstring) on the axis of ``graph`` (a
    :func:`~inspector.attribute.routes.record` of the document alone). Raises :class:`InspectorError` as the
    split does: the word not in the text, or repeated without an occurrence."""
    cap = graph.capture
    order = [s for s in ("decoder", "none", "encoder") if s in graph.stacks]
    firsts = [cap.site(graph.sites[(stack, 0, "attention")]) for stack in order]
    found = placement.place(cap, Question(doc.query, occurrence=doc.occurrence), sites=firsts)
    for stack, site in zip(order, firsts, strict=True):
        axis = found.at(site)
        if stack != order[-1] and not axis.occurrences and not axis.lookup_failed:
            continue
        return stack, axis.picked().positions[-1]
    raise AssertionError("a graph has at least one stack")  # pragma: no cover


def document_route(model, tokenizer, doc: Document, threshold: float = THRESHOLD) -> pd.DataFrame:
    """Per ``(site, head)`` of the model: ``site, head, on_route, route_share`` for the route of ``doc``'s
    query token (module docstring). One forward pass with hooks. Raises :class:`InspectorError` for a
    model whose residual routes cannot decompose (by name) or a query the text does not hold."""
    g = record(model, tokenizer, doc.text, doc.target)
    stack, position = query_token(g, doc)
    route = routes(model, tokenizer, doc.text, doc.target, position=position, stack=stack, threshold=threshold, graph=g)
    heads = [(s.name, h) for s in g.capture.sites for h in range(s.num_heads)]
    on = heads_on_route(g, route, heads, threshold=threshold)
    return pd.DataFrame({"site": on["site"], "head": on["head"].astype("int64"), "on_route": on["on_route"].astype(bool),
                         "route_share": on["best_share"].astype("float64")})
