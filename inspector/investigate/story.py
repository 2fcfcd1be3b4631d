"""The seed's story on a real summariser: generate a summary that swaps the parties, name the heads that cause
it, trace the source sentence it came from, and test prompt variants by regenerating.

The summariser is the fixture ``fixtures/parties/seq2seq`` (a small BART trained by
``fixtures/make_parties.py`` on a generated lease corpus; its ``heldout.json`` records the model's own greedy
summary of every held-out lease). :func:`pick` takes the first held-out lease whose summary swaps the parties;
:func:`variants_of` builds the prompt variants the seed suggests (the key clause quoted, moved first, restated
actively); :func:`tell` runs :func:`inspector.investigate.debug.investigate` on it (the verdict first), then
:func:`inspector.attribute.sources.sources` on the wrong summary, and says for each variant whether its own
regenerated summary is right and how the contrast and the top culprit's effect moved under it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from inspector.analysis.question import Question
from inspector.capture.output import Output
from inspector.errors import InspectorError
from inspector.investigate.reproduce import CommandFormat

SUMMARISER = Path(__file__).resolve().parents[2] / "fixtures" / "parties" / "seq2seq"
GENERATE = 16  # tokens: a one-sentence summary and its end token
QUOTE = 'the lease states : " {} "'
OUTCOME_COLUMNS = ["variant", "output", "fixed", "metric", "metric_change", "culprit_effect", "culprit_effect_change"]


def summariser_path() -> Path:
    """The shipped summariser's folder; :class:`InspectorError` naming the fix when this install has none."""
    if not (SUMMARISER / "model.safetensors").is_file():
        raise InspectorError(f"the trained summariser is not at {SUMMARISER}: run `inspector demo` from a source "
                             "checkout (or `python fixtures/make_parties.py`), or `inspector demo --minilm`")
    return SUMMARISER


def pick(folder: Path | None = None) -> dict:
    """The first held-out lease whose recorded summary swaps the parties (``heldout.json``); InspectorError when
    the summariser swaps none."""
    items = json.loads(((folder or summariser_path()) / "heldout.json").read_text())["items"]
    swaps = [x for x in items if x.get("swaps")]
    if not swaps:
        raise InspectorError("the summariser swaps the parties on no held-out lease: nothing to debug")
    plain = [x for x in swaps if not x["kind"].get("quoted")]  # quoting is a variant: start from an unquoted clause
    return (plain or swaps)[0]


def _shown(item: dict) -> str:
    """The key clause as the source shows it (inside its quotes when quoted)."""
    src, clause = item["source"], item["clause"]
    if clause not in src:
        raise InspectorError(f"the key clause is not in the source of held-out lease {item.get('id')}")
    return clause


def variants_of(item: dict) -> dict[str, str]:
    """The prompt variants of one lease: ``quoted`` (the key clause quoted, unless it is), ``first`` (the key clause
    moved to the front), ``active`` (the key clause restated as the plain active sentence it means)."""
    src, clause = item["source"], _shown(item)
    out = {}
    if not item["kind"].get("quoted"):
        out["quoted"] = src.replace(clause, QUOTE.format(clause), 1)
    rest = " ".join(src.replace(clause, " ", 1).split())
    if not src.startswith(clause):
        out["first"] = f"{clause} {rest}".strip()
    active = item["gold"] + " ."
    if active != clause:
        out["active"] = src.replace(clause, active, 1)
    return out


def contrast_of(gold: str, said: str) -> tuple[str, str]:
    """(RIGHT, WRONG): the first words where the right summary and the one the model gave differ."""
    for a, b in zip(gold.split(), said.split(), strict=False):
        if a != b:
            return a, b
    raise InspectorError("the summary is right: there is no wrong word to contrast")


@dataclass
class Story:
    """What :func:`tell` found: the lease (``item``), the summary the model generated (``said``) and the right one
    (``gold``), the investigation (``inv``: verdict, culprits, effects, report), the source attribution
    (``sources``, or ``sources_note`` saying why not), and per variant its regenerated summary and whether it is
    right, with the contrast and the top culprit's effect under the variant (``outcomes``,
    :data:`OUTCOME_COLUMNS`)."""

    item: dict
    said: str
    gold: str
    contrast: tuple[str, str]
    inv: Any
    outcomes: pd.DataFrame
    sources: Any = None
    sources_note: str | None = None
    notes: list[str] = field(default_factory=list)


def _outcomes(loaded, inv, variants: dict[str, str], contrast: tuple[str, str], gold: str) -> pd.DataFrame:
    """Per variant: its own regenerated summary, whether it is the right one, and, with the original (wrong)
    summary teacher-forced on the variant, the contrast metric and the top culprit's exact effect (and their
    change from the original)."""
    from inspector.investigate.matter import matter_of, said_output

    v = inv.verdict
    top = v.top
    said = said_output(loaded.model, loaded.tokenizer, inv.capture, inv.capture.records("source").text)
    flagged = [(top["site"], int(top["head"]))] if top is not None else []
    rows = []
    for name, text in variants.items():
        own = inv.comparisons and name in inv.variants
        output = ""
        if own:
            from inspector.store import load

            output = load(inv.variants[name]).records("target").text
        m = matter_of(loaded, text, said, Question(None, contrast=contrast), flagged=flagged, top=0)
        eff = float("nan")
        if top is not None:
            hit = m.effects[(m.effects["site"] == top["site"]) & (m.effects["head"] == int(top["head"]))]["effect"]
            eff = float(hit.iloc[0]) if len(hit) else float("nan")
        rows.append({"variant": name, "output": output, "fixed": output.strip() == gold.strip(), "metric": m.metric,
                     "metric_change": m.metric - v.metric, "culprit_effect": eff,
                     "culprit_effect_change": eff - float(top["effect"]) if top is not None else float("nan")})
    return pd.DataFrame(rows, columns=OUTCOME_COLUMNS)


def tell(loaded, item: dict, out_dir: str | Path, *, progress: bool = False, ablations: int = 64,
         commands_as: CommandFormat | None = None) -> Story:
    """The story on one lease (module docstring): generate, investigate with the contrast the swap gives (the
    verdict first), attribute the wrong summary to the source's sentences, and regenerate every variant. Writes the
    investigation folder (``out_dir``) and ``variants.csv`` and ``sources.csv`` into it; the report's commands are
    written by ``commands_as`` (:func:`~inspector.investigate.debug.investigate`'s)."""
    from inspector.capture.generation import generate_target
    from inspector.investigate.debug import investigate
    from inspector.store.files import write_csv

    source, gold = item["source"], item["gold"]
    ids = generate_target(loaded.model, loaded.tokenizer, source, GENERATE)
    said = loaded.tokenizer.decode(ids[0], skip_special_tokens=True).strip()
    right, wrong = contrast_of(gold, said)
    variants = variants_of(item)
    question = Question(None, (item["right_party"], item["wrong_party"]), contrast=(right, wrong))
    inv = investigate(loaded, source, question, Output(generate=GENERATE), out_dir=out_dir, variants=variants,
                      progress=progress, top=64, commands_as=commands_as)
    outcomes = _outcomes(loaded, inv, variants, (right, wrong), gold)
    found = note = None
    try:
        from inspector.attribute.sources import SourcesOptions, sources

        found = sources(loaded.model, loaded.tokenizer, source, Output(text=said),
                        options=SourcesOptions(ablations=ablations))
    except InspectorError as exc:
        note = str(exc)
    write_csv(Path(out_dir) / "variants.csv", outcomes)
    if found is not None:
        write_csv(Path(out_dir) / "sources.csv", found.table)
    return Story(item=item, said=said, gold=gold, contrast=(right, wrong), inv=inv, outcomes=outcomes, sources=found,
                 sources_note=note)


def opening(story: Story) -> list[str]:
    """The story's first lines: the lease, what the summariser said, and the swap."""
    right, wrong = story.contrast
    swapped = story.said == story.item.get("swapped")
    return [f"Lease: {story.item['source']}",
            f"The summariser wrote: {story.said!r}",
            f"The lease means:      {story.gold!r}"
            + (" -> it swaps the parties (the seed's mistake)." if swapped else f" -> it says {wrong!r} for {right!r}.")]


def closing(story: Story) -> list[str]:
    """Where the wrong words came from and what each variant did, one line each."""
    lines = []
    if story.sources is not None:
        t = story.sources.table
        best = t.iloc[0]
        key = story.item["clause"]
        hit = key in str(best["text"]) or str(best["text"]) in key
        m = story.sources.methods.set_index("method")
        fit = m.iloc[0]
        lines.append(f"Which source sentence did the summary come from? {best['text']!r} (weight {best['weight']:+.3f} nats; "
                     f"{'the key clause' if hit else 'not the key clause'}); surrogate LDS {fit['lds']:+.2f}, top-1 drop "
                     f"{fit['top1_drop']:+.3f} nats (ContextCite, Cohen-Wang et al. 2024; all units in sources.csv). "
                     + story.sources.trust())
    elif story.sources_note:
        lines.append(f"Which source sentence? not computed: {story.sources_note}")
    fixed = story.outcomes[story.outcomes["fixed"]]
    for r in story.outcomes.to_dict("records"):
        lines.append(f"Variant {r['variant']!r}: regenerated {r['output']!r}: {'FIXES the summary' if r['fixed'] else 'still wrong'}; "
                     f"with the wrong summary forced, the contrast moves {r['metric_change']:+.3f} (to {r['metric']:+.3f}) "
                     f"and the top culprit's effect {r['culprit_effect_change']:+.3f} (to {r['culprit_effect']:+.3f}).")
    lines.append(f"Variants that fix the summary on this model: {', '.join(fixed['variant']) or 'none'}.")
    return lines
