"""The verdict: which heads cause the wrong output, ranked by their exact effect, each with the attention
signature that says why.

Sign convention (the one used everywhere: CLI, ``culprits.csv``, report and app). The contrast metric is
``m = logit(RIGHT) - logit(WRONG)`` at the row that predicts the contrasted token (for a model without an LM
head, the cosine form of :mod:`inspector.intervene.contrast`); positive ``m`` means the model prefers RIGHT.
A head's **effect** is ``m(head zero-ablated) - m(clean)`` (head importance, Michel et al. 2019), so

* ``effect > 0``: with the head as it is, the model leans **towards WRONG** (removing it moves the output
  towards RIGHT): the head is a **culprit**;
* ``effect < 0``: the head pushes **towards RIGHT**: it supports the right answer and is never a cause.

Effects within :data:`NEGLIGIBLE` of the largest ``|effect|`` are ``negligible``; heads whose exact effect
was not computed (outside the ``--top`` heads by attribution patching) are ``not confirmed``.

Attention signature of a head at the row the metric is read at, over the two referents (the contrast's
words in the source: ``w_R`` on RIGHT's tokens, ``w_W`` on WRONG's, every occurrence, as
:func:`inspector.analysis.split.split_heads` sums them), with ``wrong_share = w_W / (w_R + w_W)``:

* ``wrong referent``: ``wrong_share >= lean`` (2/3): most of its referent weight is on WRONG, so its
  attention explains the error;
* ``right referent``: ``wrong_share <= 1 - lean``: it attends correctly, so the error travels through what it
  writes (its values and output projection), or comes from upstream;
* ``split``: in between, the seed's case: the weight is divided between both;
* ``elsewhere``: ``w_R + w_W < min_mass``: little weight on either referent;
* ``not read``: its query axis does not hold that row, or no referent is visible to it.

Pure: tables in, tables out (no model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from inspector.analysis.heads import head_label
from inspector.errors import InspectorError
from inspector.store.schema import HEAD_KEY

NEGLIGIBLE = 0.05  # |effect| below this share of the largest |effect| (or below 1e-6) is negligible
TOWARDS_WRONG, TOWARDS_RIGHT, NEGLIGIBLE_LABEL, UNCONFIRMED = "towards WRONG", "towards RIGHT", "negligible", "not confirmed"
SIGNATURES = ("wrong referent", "split", "right referent", "elsewhere", "not read")
SIGN_CONVENTION = ("effect = metric with the head zero-ablated - metric as it is, where the metric measures RIGHT over "
                   "WRONG (logit(RIGHT) - logit(WRONG); without an LM head, the cosine form): a positive effect means the "
                   "head pushes towards WRONG (a culprit), a negative one towards RIGHT")
MEANING = {
    "wrong referent": "it attends to the wrong referent, so its attention explains the error",
    "split": "its weight is split between both referents (the seed's case): quoting or disambiguating the clause may fix it",
    "right referent": "it attends to the right referent, so the error travels through what it writes (its values and "
                      "output projection), or comes from upstream",
    "elsewhere": "little of its weight is on either referent: the error travels through other tokens",
    "not read": "its attention at the row the metric reads is not available (another axis, or no referent visible)",
}
COLUMNS = ["rank", *HEAD_KEY, "effect", "attribution", "direction", "signature",
           "weight_right", "weight_wrong", "wrong_share", "referent_mass", "split_score", "query_row", "query_token"]


@dataclass(frozen=True)
class SignatureRule:
    """``lean``: the share of the referent weight on one referent to call the head that referent's (2/3);
    ``min_mass``: below this referent mass (``w_R + w_W``) the head looks ``elsewhere`` (0.2)."""

    lean: float = 2 / 3
    min_mass: float = 0.2

    def __post_init__(self) -> None:
        if not 0.5 < self.lean <= 1 or not 0 <= self.min_mass <= 1:
            raise InspectorError(f"signature rule needs 0.5 < lean <= 1 and 0 <= min_mass <= 1, got {self}")

    def label(self, weight_right: float, weight_wrong: float) -> str:
        """The signature of one head from its weights on RIGHT's and WRONG's tokens (module docstring)."""
        if weight_right != weight_right or weight_wrong != weight_wrong:  # NaN: not read
            return "not read"
        mass = weight_right + weight_wrong
        if mass < self.min_mass or mass <= 0:
            return "elsewhere"
        share = weight_wrong / mass
        if share >= self.lean:
            return "wrong referent"
        if share <= 1 - self.lean:
            return "right referent"
        return "split"


def direction(effect: float, scale: float) -> str:
    """``towards WRONG`` / ``towards RIGHT`` / ``negligible`` / ``not confirmed`` for one effect, ``scale`` being
    the largest ``|effect|`` among the confirmed heads (module docstring)."""
    if effect != effect:
        return UNCONFIRMED
    if abs(effect) < max(1e-6, NEGLIGIBLE * scale):
        return NEGLIGIBLE_LABEL
    return TOWARDS_WRONG if effect > 0 else TOWARDS_RIGHT


@dataclass
class Verdict:
    """``table``: :data:`COLUMNS`, culprits first (largest effect first, ``rank`` 1..n), then the heads that push
    towards RIGHT (most supportive first), the negligible ones and the unconfirmed ones (by ``|attribution|``).
    ``metric``/``definition``: the contrast before any ablation; ``right``/``wrong``: its words; ``row``: where
    the signature was read (``query_row``/``query_token`` per head); ``notes``: caveats in words."""

    right: str
    wrong: str
    metric: float
    definition: str
    table: pd.DataFrame
    rule: SignatureRule = SignatureRule()
    notes: list[str] = field(default_factory=list)

    @property
    def culprits(self) -> pd.DataFrame:
        """The rows whose effect pushes towards WRONG, ranked."""
        return self.table[self.table["direction"] == TOWARDS_WRONG]

    @property
    def supporters(self) -> pd.DataFrame:
        """The rows whose effect pushes towards RIGHT (never causes)."""
        return self.table[self.table["direction"] == TOWARDS_RIGHT]

    @property
    def top(self) -> dict | None:
        """The top culprit as a dict of :data:`COLUMNS`, or None when no confirmed head pushes towards WRONG."""
        c = self.culprits
        return c.iloc[0].to_dict() if len(c) else None


def culprits(effects: pd.DataFrame, signatures: pd.DataFrame | None, *, right: str, wrong: str, metric: float,
             definition: str = "", rule: SignatureRule = SignatureRule(), notes: list[str] | None = None) -> Verdict:
    """The verdict from the exact effects and the attention signatures.

    ``effects``: one row per head with ``site, stack, kind, layer, head, attribution, effect`` (effect NaN where
    not computed; :func:`inspector.intervene.effects.effects`). ``signatures``: a
    :func:`~inspector.analysis.split.split_heads` table whose referents are ``right`` and ``wrong`` (columns
    ``weight:<right>``, ``weight:<wrong>``, ``referent_mass``, ``split_score``, ``query_positions``, ``query``),
    read at the row the metric reads, or None. Raises :class:`InspectorError` when ``effects`` lacks a column."""
    need = {*HEAD_KEY, "attribution", "effect"}
    if not need <= set(effects.columns):
        raise InspectorError(f"the effects table lacks {sorted(need - set(effects.columns))}")
    t = effects[[*HEAD_KEY, "effect", "attribution"]].copy()
    t["head"] = t["head"].astype(int)
    t["layer"] = t["layer"].astype(int)
    wr, ww = f"weight:{right}", f"weight:{wrong}"
    if signatures is not None and len(signatures) and {wr, ww} <= set(signatures.columns):
        s = signatures.copy()
        s["head"] = s["head"].astype(int)
        s["query_row"] = [int(p[0]) if len(p) else -1 for p in s["query_positions"]]
        s["query_token"] = [str(q).split(" ", 1)[1] if str(q).startswith("@") and " " in str(q) else str(q) for q in s["query"]]
        s = s.rename(columns={wr: "weight_right", ww: "weight_wrong"})
        t = t.merge(s[["site", "head", "weight_right", "weight_wrong", "referent_mass", "split_score", "query_row",
                       "query_token"]], on=["site", "head"], how="left")
    else:
        for c in ("weight_right", "weight_wrong", "referent_mass", "split_score"):
            t[c] = math.nan
        t["query_row"], t["query_token"] = -1, ""
    t["query_row"] = t["query_row"].fillna(-1).astype(int)
    t["query_token"] = t["query_token"].fillna("")
    mass = t["weight_right"] + t["weight_wrong"]
    t["wrong_share"] = (t["weight_wrong"] / mass).where(mass > 0)
    t["signature"] = [rule.label(a, b) for a, b in zip(t["weight_right"], t["weight_wrong"], strict=True)]
    confirmed = t["effect"].dropna()
    scale = float(confirmed.abs().max()) if len(confirmed) else 0.0
    t["direction"] = [direction(float(e), scale) for e in t["effect"]]
    order = {TOWARDS_WRONG: 0, TOWARDS_RIGHT: 1, NEGLIGIBLE_LABEL: 2, UNCONFIRMED: 3}
    t["_group"] = t["direction"].map(order)
    # culprits by effect (largest first), supporters most supportive first, the rest by |effect| then |attribution|
    t["_key"] = [-e if d == TOWARDS_WRONG else (e if d == TOWARDS_RIGHT else -abs(e) if e == e else -abs(a))
                 for d, e, a in zip(t["direction"], t["effect"], t["attribution"], strict=True)]
    t = t.sort_values(["_group", "_key", "site", "head"], kind="stable").drop(columns=["_group", "_key"]).reset_index(drop=True)
    n = int((t["direction"] == TOWARDS_WRONG).sum())
    t.insert(0, "rank", pd.array(list(range(1, n + 1)) + [pd.NA] * (len(t) - n), dtype="Int64"))
    return Verdict(right=right, wrong=wrong, metric=float(metric), definition=definition, table=t[COLUMNS], rule=rule,
                   notes=list(notes or []))


def signature_sentence(row: dict, right: str, wrong: str) -> str:
    """One head's signature in words, with its numbers."""
    sig = row["signature"]
    if sig == "not read":
        return f"signature: not read ({MEANING['not read']})"
    at = f"at row {int(row['query_row'])} ({row['query_token']!r})" if int(row["query_row"]) >= 0 else ""
    return (f"{at} it puts {float(row['weight_wrong']):.2f} of its weight on {wrong!r} and {float(row['weight_right']):.2f} "
            f"on {right!r}: {sig}; {MEANING[sig]}")


def sentence(v: Verdict) -> str:
    """The verdict in one or two sentences: the top culprit named first as ``layer L head H``, its effect and
    its signature; or why there is none."""
    top = v.top
    prefer = (f"The model prefers {v.wrong!r} over {v.right!r} here (metric {v.metric:+.4f})" if v.metric < 0 else
              f"The model prefers {v.right!r} over {v.wrong!r} here (metric {v.metric:+.4f}), so there is no error at this "
              "row to explain")
    if top is None:
        return (f"Verdict: no confirmed head pushes towards {v.wrong!r}. {prefer}; the preference comes from elsewhere "
                "(MLPs, embeddings, or heads whose exact effect was not computed: raise --top).")
    lead = "Verdict" if v.metric < 0 else "Verdict (no error here)"
    return (f"{lead}: {head_label(top)} pushes hardest towards {v.wrong!r}: zero-ablating it moves the metric by "
            f"{float(top['effect']):+.4f} towards {v.right!r}. {prefer}. " + signature_sentence(top, v.right, v.wrong)[0].upper()
            + signature_sentence(top, v.right, v.wrong)[1:] + ".")


def summary_lines(v: Verdict, k: int = 3) -> list[str]:
    """The verdict sentence, then the next culprits and the strongest supporters, one line each (short)."""
    lines = [sentence(v)]
    more = v.culprits.iloc[1:k]
    if len(more):
        lines.append("Next culprits: " + "; ".join(f"{head_label(r)} effect {float(r['effect']):+.4f}, {r['signature']}"
                                                   for r in more.to_dict("records")) + ".")
    sup = v.supporters.head(k)
    if len(sup):
        lines.append(f"Pushing towards {v.right!r} (not causes): " + "; ".join(
            f"{head_label(r)} effect {float(r['effect']):+.4f}, {r['signature']}" for r in sup.to_dict("records")) + ".")
    lines.append(f"Sign convention: {SIGN_CONVENTION}.")
    return lines + list(v.notes)
