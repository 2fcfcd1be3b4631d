"""The "Does it matter?" part of an investigation: does the output depend on the heads we looked at?

Given the investigation's capture (what the model said), its split table and a contrast
``RIGHT,WRONG`` (:mod:`inspector.intervene.contrast`), :func:`does_it_matter` computes

* every head's attribution and the exact effect (zero ablation) of the top k heads by attribution, of every
  flagged head, and of every other head while the reruns stay within a budget of forward passes
  (:func:`inspector.intervene.effects.effects`, ``budget``; :data:`~inspector.investigate.defaults.DEBUG_BUDGET`
  for ``debug``) -> ``effects.csv``;
* for those heads (``matter.csv``), per variant, the change of the metric when that one head gets
  the variant's outputs at the aligned positions (:func:`inspector.intervene.effects.align`), and for all of
  them patched together (``patch.csv``).

:func:`section` turns the result into the report's "Does it matter?" section (rendered by the report's
Jinja2 template, which escapes every string); :func:`render_section` renders that section alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from inspector.analysis.question import Question
from inspector.capture.inputs import encode, encode_with_globals
from inspector.capture.output import Output
from inspector.errors import InspectorError
from inspector.intervene import effects as _effects
from inspector.intervene import seam as intervene
from inspector.intervene.contrast import model_has_lm_head
from inspector.investigate.defaults import DEBUG_BUDGET
from inspector.investigate.reproduce import Command
from inspector.store.capture_file import Capture
from inspector.store.schema import HEAD_KEY

HEAD_KEYS = list(HEAD_KEY)


@dataclass
class Matter:
    """``effects``: :data:`~inspector.intervene.effects.EFFECT_COLUMNS`, every head. ``heads``: the flagged and top
    heads with ``flagged``, ``attribution``, ``effect`` and per variant ``patch_effect[<name>]`` (the
    metric's change when that head alone is patched from the variant; empty where it cannot be aligned).
    ``patches``: per variant, all those heads patched together: ``variant, heads, before, after, change``.
    ``notes``: why some head could not be patched. ``global_tokens``: the global tokens (``--global``) every
    pass marked, or None. ``budget`` / ``memory_gib``: the effects' budget (forward passes) and memory bound
    (GiB) as asked (None: none / the default); ``confirmed``: :attr:`inspector.intervene.effects.Effects.confirmed`."""

    contrast: str
    definition: str
    metric: float
    effects: pd.DataFrame
    heads: pd.DataFrame
    patches: pd.DataFrame
    disagreements: pd.DataFrame
    top: int
    notes: list[str] = field(default_factory=list)
    global_tokens: list[str] | None = None  # LED / Longformer: the source's global tokens every pass marked
    row: int | None = None  # logit contrast: the output-axis row that predicts the contrasted token (None: cosine)
    budget: float | None = None
    memory_gib: float | None = None
    confirmed: dict = field(default_factory=dict)


def said_output(model, tokenizer, cap: Capture, source: str) -> Output:
    """The output exactly as the capture fed it, as an :class:`~inspector.capture.output.Output`: its text when
    that tokenizes to the same ids (so words are found with the text's own casing), else its ids (e.g. generated
    tokens); no output when the capture has none."""
    if "target" not in cap.roles():
        return Output()
    rec = cap.records("target")
    ids = [i for i, p in zip(rec.ids, rec.padding, strict=True) if not p]
    again = encode(model, tokenizer, source, rec.text).records
    if [r.ids for r in again if r.role == "target"] == [ids]:
        return Output(text=rec.text)
    return Output.of(ids=[ids])


def does_it_matter(loaded, cap: Capture, source: str, split: pd.DataFrame, *, question: Question,
                   variants: dict[str, str] | None = None, top: int = 10, global_tokens: list[str] | None = None,
                   budget: float | None = DEBUG_BUDGET, memory_gib: float | None = None) -> Matter:
    """Effects of the flagged and top heads on the question's contrast (and of every head while ``budget``
    lasts, :func:`matter_of`), and of patching them from each variant (the output exactly as ``cap`` fed it,
    :func:`said_output`), every pass marking ``global_tokens`` (LED, Longformer). Raises :class:`InspectorError`
    when the question has no contrast."""
    if question.contrast is None:
        raise InspectorError("does it matter? needs a contrast: pass --contrast RIGHT,WRONG")
    said = said_output(loaded.model, loaded.tokenizer, cap, source)
    flagged = split[split["flagged"].astype(bool)] if "flagged" in split.columns else split.iloc[:0]
    flagged_keys = list(dict.fromkeys(zip(flagged["site"], flagged["head"].astype(int), strict=True)))
    # without an LM head the contrast reads the investigation's query occurrence; with one, WRONG's first occurrence
    lm = model_has_lm_head(loaded.model)
    occurrence = question.occurrence
    return matter_of(loaded, source, said, question, flagged=flagged_keys, contrast_occurrence=None if lm else occurrence,
                     variants=variants, top=top, global_tokens=global_tokens, budget=budget, memory_gib=memory_gib)


def matter_of(loaded, source: str, output: Output, question: Question, *,
              flagged: list[tuple[str, int]], contrast_occurrence: int | None = None,
              variants: dict[str, str] | None = None, top: int = 10, global_tokens: list[str] | None = None,
              budget: float | None = None, memory_gib: float | None = None) -> Matter:
    """The part from texts alone (behind ``inspector effects --confirm/--variant/--matter-csv``, which rebuilds
    what ``debug`` wrote): :func:`inspector.intervene.effects.effects` of the ``top`` heads by attribution and of
    ``flagged`` (listed with ``flagged`` true), and of every other head within ``budget`` forward passes (in
    ``effects.csv``, not listed), then, per variant, each listed head and all of them patched in, each patch
    rerun from its head's layer (:mod:`inspector.intervene.rerun`; ``memory_gib`` bounds what is kept).
    ``question`` gives the contrast (required), the query and its occurrence (for aligning an encoder's patch);
    ``contrast_occurrence`` is the contrast's (WRONG's with an LM head, else the query's). ``global_tokens`` (LED, Longformer): marked in the source and every
    variant, in every pass. Raises :class:`InspectorError` for an unknown head or contrast."""
    if question.contrast is None:
        raise InspectorError("does it matter? needs a contrast: pass --contrast RIGHT,WRONG")
    model, tokenizer = loaded.model, loaded.tokenizer
    contrast, query = question.contrast, question.query
    said = output  # the Output value its caller built (the CLI from its flags, debug from the capture)
    flagged = list(dict.fromkeys((str(s), int(h)) for s, h in flagged))
    res = _effects.effects(model, tokenizer, source, said, contrast=contrast, query=query, occurrence=contrast_occurrence,
                           top=top, confirm=flagged, global_tokens=global_tokens, budget=budget, memory_gib=memory_gib)
    table = res.table
    shown = set(zip(table["site"].iloc[:top], table["head"].iloc[:top], strict=True)) | set(flagged)
    listed = table[table["effect"].notna() & pd.Series([k in shown for k in zip(table["site"], table["head"], strict=True)],
                                                       index=table.index)].copy()
    listed.insert(5, "flagged", [k in set(flagged) for k in zip(listed["site"], listed["head"], strict=True)])
    listed = listed.loc[listed["effect"].abs().sort_values(ascending=False, kind="stable").index].reset_index(drop=True)
    keys = list(zip(listed["site"], listed["head"], strict=True))

    encodings = {name: encode_with_globals(model, tokenizer, text, **said.kwargs(), global_tokens=global_tokens)
                 for name, text in (variants or {}).items()}
    encoded = encode_with_globals(model, tokenizer, source, **said.kwargs(), global_tokens=global_tokens) if encodings else None
    patches, notes = _patches(model, encoded, res, listed, keys, encodings, question, memory_gib)
    label = question.contrast_spec
    return Matter(contrast=label, definition=res.definition, metric=res.metric, effects=table, heads=listed,
                  patches=pd.DataFrame(patches, columns=["variant", "heads", "before", "after", "change"]),
                  disagreements=res.disagreements, top=top, notes=list(dict.fromkeys(notes)),
                  global_tokens=list(global_tokens) if global_tokens else None,
                  row=res.contrast.row if res.contrast.kind == "logit" else None, budget=budget, memory_gib=memory_gib,
                  confirmed=dict(res.confirmed))


def _patches(model, encoded, res, listed: pd.DataFrame, keys: list, variants: dict, question: Question,
             memory_gib: float | None) -> tuple[list[dict], list[str]]:
    """Per variant (name -> its encoding): ``listed[patch_effect[NAME]]`` (each of ``keys`` patched alone) and the
    row of all of them patched together; the notes on heads that could not be patched. Every patch reruns from its
    heads' layer on one clean pass of ``encoded`` kept (:func:`inspector.intervene.rerun.record`); none is run
    without variants."""
    if not variants:
        return [], []
    from inspector.intervene import rerun

    query, occurrence = question.query, question.occurrence
    rec = rerun.record(model, encoded, res.capture.sites, memory_gib=memory_gib)
    narrow = rerun.narrow_for(model, res.contrast, False)
    before = float(res.contrast.value(rec.output))

    def measured(seam, sites) -> float:
        return float(res.contrast.value(rec.run(seam, sites, narrow=narrow)))

    patches, notes = [], []
    for name, venc in variants.items():
        var = intervene.run(model, venc, intervene.Seam(record={s for s, _ in keys}))
        column, ok = [], []
        for s, h in keys:
            try:
                seam = _effects.patch_seam(res.capture, var.capture, var.seam.outputs, {s: [h]}, query=query,
                                           occurrence=occurrence)
            except InspectorError as exc:
                column.append(float("nan"))
                notes.append(f"{name}: {s}:{h} not patched: {exc}")
                continue
            ok.append((s, h))
            column.append(measured(seam, [s]) - before)
        listed[f"patch_effect[{name}]"] = column
        if ok:
            grouped: dict[str, list[int]] = {}
            for s, h in ok:
                grouped.setdefault(s, []).append(h)
            seam = _effects.patch_seam(res.capture, var.capture, var.seam.outputs, grouped, query=query, occurrence=occurrence)
            after = measured(seam, list(grouped))
            patches.append({"variant": name, "heads": len(ok), "before": before, "after": after, "change": after - before})
    return patches, notes


MATTER_LEAD = ("site", "layer", "head", "effect", "attribution")  # the terminal table's first columns


def _unpatched(m: Matter) -> list[str]:
    """The listed heads no variant could patch (``site:head``), from :attr:`Matter.notes`."""
    heads = []
    for note in m.notes:
        _, _, rest = note.partition(": ")
        head, sep, _ = rest.partition(" not patched: ")
        if sep:
            heads.append(head)
    return list(dict.fromkeys(heads))


def _why_unpatched(m: Matter) -> str:
    """Why those heads could not be patched, in words that hold for all of them (their sites' names left out)."""
    reasons = []
    for note in m.notes:
        _, _, rest = note.partition(": ")
        head, sep, reason = rest.partition(" not patched: ")
        if sep:
            site = head.rpartition(":")[0]
            reasons.append(reason.replace(f"{site}'s ", "their ").replace(site, "the site"))
    return "; ".join(dict.fromkeys(reasons))


def summary_text(m: Matter, format_table=lambda df, digits, **_: df.to_string(index=False),
                 width: int | None = None) -> str:
    """The part as plain text, for the terminal (``format_table(df, digits=, lead=)`` formats a table; its prose
    wrapped to ``width``, default the terminal's). The heads a variant could not patch are summed up in one line
    (the report's notes name each; their ``patch_effect`` cells in matter.csv are empty)."""
    from inspector.ui.terminal import terminal_width, wrap

    width = terminal_width() if width is None else width
    heads = len(m.effects) if m.effects is not None else len(m.heads)
    flagged = int(m.heads["flagged"].astype(bool).sum()) if "flagged" in m.heads.columns else 0
    if m.top >= heads:
        which = f"All {heads} heads"
    else:
        which = (f"The top {m.top} of {heads} heads by attribution"
                 + (f" and the {flagged} flagged ({len(m.heads)} heads)" if flagged else ""))
    listed = (which + ", largest |effect| first; effect = exact change of the metric under zero ablation"
              + (", patch_effect = change when the variant's outputs of that head are patched in" if m.patches.size else "")
              + ":")
    text = [f"Does it matter? metric: {m.definition} = {m.metric:.6f}", confirmed_line(m) + ".", listed]
    shown = m.heads.drop(columns=["stack"] if (m.heads["stack"] == "none").all() else [])
    lead = tuple(c for c in MATTER_LEAD if c in shown.columns)
    lead += tuple(c for c in shown.columns if c.startswith("patch_effect["))
    lines = [""] + [part for t in text for part in wrap(t, width)]
    lines.append(format_table(shown, digits=5, lead=lead, width=width))
    left = _unpatched(m)
    for r in m.patches.itertuples(index=False):
        which = (f"the {r.heads} heads with a patch_effect[{r.variant}]" if left else f"the {r.heads} heads above")
        lines += wrap(f"Patching {which} together from variant {r.variant!r}: metric {r.before:.6f} -> "
                      f"{r.after:.6f} ({r.change:+.6f})", width)
    if left:
        lines += wrap(f"Not patched: {len(left)} head{'s' if len(left) != 1 else ''} ({_why_unpatched(m)}); their "
                      "patch_effect cells are empty.", width)
    lines += [part for note in m.notes if " not patched: " not in note for part in wrap(note, width)]
    lines += [part for t in _effects.describe_disagreements(m.disagreements).splitlines() for part in wrap(t, width)]
    return "\n".join(lines)


def confirmed_line(m: Matter) -> str:
    """``"Confirmed N of M heads exactly (...)"``: how many heads have an exact effect in ``effects.csv``, and what
    their reruns cost (:func:`inspector.intervene.effects.confirmed_text`)."""
    c = m.confirmed or {}
    n = int(m.effects["effect"].notna().sum()) if m.effects is not None else len(m.heads)
    of = len(m.effects) if m.effects is not None else len(m.heads)
    text = f"confirmed {c.get('heads', n)} of {c.get('of', of)} heads exactly"
    if c:
        text += f" (reruns estimated at {c['cost']:.2f} forward passes"
        text += f" of a budget of {c['budget']:g})" if c.get("budget") is not None else ")"
    return text[0].upper() + text[1:]


def write(out_dir, m: Matter) -> list:
    """``effects.csv``, ``matter.csv`` and (with variants) ``patch.csv`` into ``out_dir``."""
    from pathlib import Path

    from inspector.store.files import write_csv

    out = Path(out_dir)
    paths = [write_csv(out / "effects.csv", m.effects), write_csv(out / "matter.csv", m.heads)]
    if len(m.patches):
        paths.append(write_csv(out / "patch.csv", m.patches))
    return paths


def section(m: Matter):
    """The part as the report's "Does it matter?" section (:class:`inspector.ui.report.MatterSection`), for
    :func:`inspector.ui.report.render_report` (``matter=``); the report's template escapes every string."""
    from inspector.ui.report import MatterSection

    return MatterSection(definition=m.definition, metric=m.metric, top=m.top, heads=m.heads, patches=m.patches,
                         disagreement_note=_effects.describe_disagreements(m.disagreements).splitlines()[0],
                         disagreements=m.disagreements, notes=[confirmed_line(m) + " (effects.csv)", *m.notes])


def render_section(m: Matter) -> str:
    """The part alone as an HTML fragment (the same template block the report includes)."""
    from inspector.ui.report import render_matter_section

    return render_matter_section(section(m))


def commands(model: str, out, m: Matter, *, query: str | None, occurrence: int | None,
             said: tuple[tuple[str, object], ...]) -> list[Command]:
    """The ``inspector effects`` command that rewrites ``effects.csv``, ``matter.csv`` and (with variants)
    ``patch.csv`` from the saved texts, as :class:`~inspector.investigate.reproduce.Command` data: the output as the
    ``said`` options give it (``("output_file", FILE)``, ``("generate", N)`` where the generated text tokenizes
    otherwise, or none), the same ``top``, ``budget`` and ``memory_budget`` (where set), the flagged heads confirmed too (``confirm``), each variant's saved text
    (``variant``, once per variant)."""
    from pathlib import Path

    out = Path(out)
    opts: list[tuple[str, object]] = [] if model.startswith("embedded:") else [("model", model)]
    opts += [("source_file", str(out / "source.txt")), *said, ("contrast", m.contrast), ("top", m.top)]
    if m.budget is not None:
        opts.append(("budget", m.budget))
    if m.memory_gib is not None:
        opts.append(("memory_budget", m.memory_gib))
    flagged = m.heads[m.heads["flagged"].astype(bool)]
    if len(flagged):
        opts.append(("confirm", tuple(f"{s}:{int(h)}" for s, h in zip(flagged["site"], flagged["head"], strict=True))))
    if m.global_tokens:
        opts.append(("global_tokens", tuple(m.global_tokens)))
    if query:  # the contrast reads it without an LM head; an encoder's patch aligns its tokens
        opts.append(("query", query))
    if occurrence and m.definition.startswith("cos("):  # with an LM head --occurrence would pick WRONG's occurrence
        opts.append(("occurrence", occurrence))
    names = [c[len("patch_effect["):-1] for c in m.heads.columns if c.startswith("patch_effect[")]
    opts += [("variant", f"{name}={out / f'variant-{name}.txt'}") for name in names]
    opts += [("csv", str(out / "effects.csv")), ("matter_csv", str(out / "matter.csv"))]
    if len(m.patches):
        opts.append(("patch_csv", str(out / "patch.csv")))
    return [Command("effects", (), tuple(opts))]
