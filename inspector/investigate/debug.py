"""The summariser investigation as one path: capture what the model said, rank heads, find split
heads, compare prompt variants, and write CSVs plus a self-contained HTML report.

``investigate`` is the Python API behind ``inspector debug`` and ``inspector demo``;
``compare_captures`` is behind ``inspector compare``. Functions only: the commands themselves
live in :mod:`inspector.cli.investigate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from inspector import analysis
from inspector.analysis.moves import variant_moves
from inspector.analysis.placement import Placement, place
from inspector.analysis.question import Question
from inspector.capture.output import Output
from inspector.capture.recorder import capture
from inspector.errors import InspectorError
from inspector.investigate.defaults import (
    DEBUG_BUDGET,
    DEBUG_TOP,
    FULL_CAPTURE_TOKENS,
    MARKER,
    REPORT,
    WHERE_TOKENS,
)
from inspector.investigate.reproduce import Command, CommandFormat, format_plainly
from inspector.store.capture_file import Capture
from inspector.store.files import check_folder_target, swap_folder, write_csv, write_text
from inspector.store.schema import HEAD_KEY
from inspector.store.words import occurs_in

LEGAL_SOURCE = (
    "The Lessee shall indemnify the Lessor against all claims arising from the use of the premises. "
    "Such indemnity survives termination."
)
LEGAL_QUOTED = (
    'The lease states, in the words of the clause: "The Lessee shall indemnify the Lessor against all claims '
    'arising from the use of the premises." Such indemnity survives termination.'
)
KEYS = list(HEAD_KEY)
Options = tuple[tuple[str, object], ...]  # a Command's options: (argparse dest, value) pairs


@dataclass
class Investigation:
    """What :func:`investigate` wrote and computed: the folder, the capture (and its file), ``rank`` and
    ``split`` tables, the report's path, the commands that reproduce the run (``commands``, as
    :class:`~inspector.investigate.reproduce.Command` data; ``command_lines``, the same as the report writes
    them), the variants' files and
    comparisons, the "Does it matter?" result (``matter``, with a contrast) and the per-head ``moves``;
    with a contrast too, the "Where did the word come from?" result (``where``,
    :class:`inspector.investigate.wherefrom.WhereFrom`), or ``where_note`` saying why there is none."""

    out_dir: Path
    capture: Capture
    capture_path: Path
    rank: pd.DataFrame
    split: pd.DataFrame
    report_path: Path
    commands: list[Command]
    command_lines: list[str]  # the commands as shell lines, as the report shows them
    variants: dict[str, Path] = field(default_factory=dict)
    comparisons: dict[str, pd.DataFrame] = field(default_factory=dict)
    matter: Any = None  # inspector.investigate.matter.Matter when a contrast was given
    moves: pd.DataFrame | None = None  # variant_moves(): the flagged heads in every variant, first
    where: Any = None  # inspector.investigate.wherefrom.WhereFrom when a contrast was given (and routes apply)
    where_note: str | None = None  # why there is no "Where did the word come from?" (a contrast was given)
    verdict: Any = None  # inspector.analysis.verdict.Verdict when a contrast was given: the culprits first
    question: Question | None = None  # the question as the run read it (a defaulted query resolved to its row)
    notes: list[str] = field(default_factory=list)  # on the question: which row was read and why
    why: Any = None  # inspector.attribute.score_parts.ScoreParts: why the top culprit attends to WRONG
    why_note: str | None = None  # why there is no decomposition (with a contrast)

    @property
    def flagged(self) -> pd.DataFrame:
        """The split table's flagged rows."""
        return self.split[self.split["flagged"]]


def roles_of(cap: Capture, question: Question) -> tuple[str | None, str]:
    """Where the query and the referents are looked for: the question's roles where it names them; else the
    query in the output when it is there (what the model said), else in the source; referents in the source. A
    token index (``@I``) is on every site's query axis (None)."""
    ref_role = question.referent_role or "source"
    if question.query_role is not None:
        return question.query_role, ref_role
    if question.query_index is not None:
        return None, ref_role
    has_target = any(r.role == "target" for r in cap.inputs)
    if has_target and occurs_in(cap.records("target").text, question.query, question.case_sensitive):
        return "target", ref_role
    return "source", ref_role


def placement_for(cap: Capture, question: Question) -> Placement:
    """The question's positions on ``cap`` (:func:`inspector.analysis.placement.place` over every site), its words
    looked for where :func:`roles_of` says: the one lookup of an investigation's words on a capture."""
    q_role, r_role = roles_of(cap, question)
    return place(cap, replace(question, query_role=q_role, referent_role=r_role))


def split_for(cap: Capture, question: Question, placement: Placement | None = None) -> pd.DataFrame:
    """Every site where the question's query can attend to its referents in the source, cross sites first (a
    token index ``@I`` with ``query_role`` ``target`` is found on the sites whose queries are output positions).
    ``placement``: :func:`placement_for` of ``cap`` and ``question`` when the caller has it (made here otherwise)."""
    placement = placement if placement is not None else placement_for(cap, question)
    return analysis.split_heads(cap, placement.question, sites="all", cross_first=True, placement=placement)


def folder_stamp(command: str) -> dict[str, str]:
    """What an investigation folder's marker records besides its files: the ``command`` that wrote it (``debug``,
    ``demo``, or ``investigate`` from Python) and inspector's version."""
    from inspector import __version__

    return {"command": command, "version": __version__}


def rank_note(weighting: str) -> str:
    """One sentence saying how heads were ranked (``attention`` or ``value-norm`` weighting, Kobayashi et al.
    2020), for the report and the printout."""
    if weighting == "value-norm":
        return ("Heads ranked by normalized entropy of value-weighted attention (weight x ||v_j W_O^h||, renormalized "
                "per row; Kobayashi et al. 2020), as split.")
    return "Heads ranked by normalized entropy of the raw attention weights (the softmax the model computes), as split."


def compare_captures(a: Capture, b: Capture, question: Question, *, names: tuple[str, str] = ("a", "b"),
                     split_a: pd.DataFrame | None = None, split_b: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per head: split score and referent weights in each capture and their change (b - a), sorted by
    the size of the change. Heads are matched by site name and head; captures of different models are
    refused. ``split_a``: ``a``'s split table (:func:`split_for` with the same question) when the caller
    has it already, so an investigation computes the original's split once; ``split_b`` likewise ``b``'s."""
    ma, mb = a.meta.get("model", {}), b.meta.get("model", {})
    if (ma.get("class"), ma.get("config_hash")) != (mb.get("class"), mb.get("config_hash")):
        raise InspectorError(
            f"the captures come from different models ({ma.get('name')} / {ma.get('class')} vs {mb.get('name')} / "
            f"{mb.get('class')}): compare captures of the same model"
        )
    na, nb = names
    if na == nb:
        na, nb = f"{na}:a", f"{nb}:b"
    sa = split_a if split_a is not None else split_for(a, question)
    sb = split_b if split_b is not None else split_for(b, question)
    refs = [c for c in sa.columns if c.startswith("weight:")]
    cols = ["split_score", "referent_mass", "lift", "flagged"] + refs
    merged = sa[KEYS + cols].merge(sb[KEYS + cols], on=KEYS, suffixes=(f"[{na}]", f"[{nb}]"))
    if merged.empty:
        raise InspectorError("the two captures share no site where the query sees the referents: check --query and --referents")
    out = merged[KEYS].copy()
    out[f"split_score[{na}]"] = merged[f"split_score[{na}]"]
    out[f"split_score[{nb}]"] = merged[f"split_score[{nb}]"]
    out["split_change"] = out[f"split_score[{nb}]"] - out[f"split_score[{na}]"]
    out[f"lift[{na}]"] = merged[f"lift[{na}]"]
    out[f"lift[{nb}]"] = merged[f"lift[{nb}]"]
    for r in refs:
        out[f"{r}[{na}]"] = merged[f"{r}[{na}]"]
        out[f"{r}[{nb}]"] = merged[f"{r}[{nb}]"]
        out[f"{r}_change"] = out[f"{r}[{nb}]"] - out[f"{r}[{na}]"]
    out[f"flagged[{na}]"] = merged[f"flagged[{na}]"]
    out[f"flagged[{nb}]"] = merged[f"flagged[{nb}]"]
    order = out["split_change"].abs().sort_values(ascending=False, kind="stable").index
    return out.loc[order].reset_index(drop=True)


def _capture_one(loaded, source: str, output: Output, progress: bool, global_tokens: list[str] | None = None):
    if output.generate:
        from inspector.capture.generation import generate_target

        output = Output.of(ids=generate_target(loaded.model, loaded.tokenizer, source, output.generate,
                                               global_tokens=global_tokens))
    return capture(loaded.model, loaded.tokenizer, source, output, model_name=loaded.name, progress=progress,
                   global_tokens=global_tokens, weights=stores_weights(loaded, source, output))


def stores_weights(loaded, source: str, output: Output) -> bool:
    """Whether an investigation's capture stores the attention weights (a full capture) or only Q, K, V and the
    masks they are recomputed from exactly on demand (a lazy one): weights while the longest query axis is at
    most :data:`~inspector.investigate.defaults.FULL_CAPTURE_TOKENS` tokens. Past that the weights (``heads x n x
    n`` a site) outgrow the Q/K/V they come from (``3 x heads x n x d_head``), and writing and reading them back
    costs more than recomputing the rows an analysis reads."""
    from inspector.capture.inputs import encode

    if output.generate:  # the ids are not known before generation (_capture_one generates first)
        raise InspectorError("stores_weights needs the output's text or ids, not a generation: generate first")
    encoded = encode(loaded.model, loaded.tokenizer, source, **output.kwargs())
    longest: dict[str, int] = {}
    for r in encoded.records:
        longest[r.role] = max(longest.get(r.role, 0), len(r.ids))
    axis = max(longest.values(), default=0) if encoded.layout == "encoder-decoder" else sum(longest.values())
    return axis <= FULL_CAPTURE_TOKENS


def resolve_question(loaded, cap: Capture, question: Question) -> tuple[Question, list[str]]:
    """The question the run reads, and notes on it. With a contrast and no query, a model with an LM head reads
    the row the contrast is read at (the row that predicts the contrasted token, ``@I``). A query word that is an
    output word of such a model is read on its own row, with a note naming the row that predicted it. Raises
    :class:`InspectorError` when there is no query to read. (A query word the model said is noted by
    :func:`output_word_note`, once the question is placed.)"""
    from inspector.intervene import contrast as _contrast

    lm = _contrast.model_has_lm_head(loaded.model)
    notes: list[str] = []
    if question.query is None:
        if question.contrast is None or not lm:
            raise InspectorError("no query given: pass --query WORD" + ("" if question.contrast is None or lm else
                                 " (this model has no LM head, so the contrast is read on the query word)"))
        c = _contrast.resolve(cap, loaded.tokenizer, True, question.right, wrong=question.wrong)
        enc_dec = cap.meta.get("layout") == "encoder-decoder"
        site = next(s for s in cap.sites if ("target" if enc_dec else "source") in s.query_input)
        tok = cap.tokens(site, "query")[c.row]
        notes.append(f"Query: row {c.row} ({tok!r}), the row that predicts {question.wrong!r} (where the contrast is read); "
                     "pass --query WORD to read another.")
        return question.at(f"@{c.row}", query_role="target" if enc_dec else None), notes
    return question, notes


def output_word_note(cap: Capture, question: Question, placement: Placement, lm: bool) -> list[str]:
    """With an LM head (``lm``), for a query word the model said (``placement`` looks for it in the output): one
    note naming the row that chose it (split reads the word's own row, the one after); else none."""
    if not lm or question.query_index is not None or placement.question.query_role != "target":
        return []
    site = next(s for s in cap.sites if "target" in s.query_input and s.kind != "cross")
    found = placement.at(site).occurrences
    k = question.occurrence or 1
    first = found[k - 1].positions[0] if len(found) >= k else None
    if not first:
        return []
    tok = cap.tokens(site, "query")[first - 1]
    return [f"Query {question.query!r} is an output word: split reads its own row {first}, the row after "
            f"the model chose it; the row that chose it is {first - 1} ({tok!r}): --query @{first - 1}."]


def investigate(
    loaded,
    source: str,
    question: Question,
    output: Output = Output(),
    *,
    out_dir: str | Path,
    variants: dict[str, str] | None = None,
    progress: bool = False,
    top: int = DEBUG_TOP,
    budget: float | None = DEBUG_BUDGET,
    memory_gib: float | None = None,
    global_tokens: list[str] | None = None,
    where: bool | None = None,
    commands_as: CommandFormat | None = None,
    command: str = "investigate",
) -> Investigation:
    """Capture, rank, split, compare variants, give the verdict and write everything into ``out_dir``.

    ``loaded`` is a :class:`~inspector.capture.models.LoadedModel`; ``question``
    (:class:`~inspector.analysis.question.Question`) names the query, the referents, the weighting and the
    split rule (one per run: ``rank.csv`` and ``split.csv`` say which) and the contrast ``RIGHT,WRONG``;
    ``output`` (:class:`~inspector.capture.output.Output`) what the model said (a text, ids, or generate N).
    ``variants`` maps a name to another version of the source (e.g. with the clause quoted), captured and
    compared with the same output (or generating again when the output is generated). With a contrast, the
    "Does it matter?" part (:mod:`inspector.investigate.matter`: exact effects of the ``top`` heads by attribution
    and of the flagged ones, then of every other head while the reruns stay within ``budget`` forward passes,
    what they keep within ``memory_gib``; patches from each variant) and the verdict (:mod:`inspector.investigate.verdict`:
    the heads that push towards WRONG first, ``culprits.csv``). ``global_tokens`` (LED, Longformer) marks global
    tokens of the source and of every variant (words or ``@i`` token indices,
    :func:`inspector.capture.inputs.global_attention_mask`), in the capture and in every effects and patching
    pass; "Where did the word come from?" is left out with them (its attribution and route passes take no
    global tokens; the printout says why). ``where``: run that part (``True``), leave it out (``False``), or by
    default run it while the input has at most :data:`~inspector.investigate.defaults.WHERE_TOKENS` tokens (its
    integrated gradients cost tens of forward and backward passes on a long input; the note says so and names
    ``--where``); its batch of points is chosen within ``memory_gib``. The commands that reproduce the run (:attr:`Investigation.commands`,
    :class:`~inspector.investigate.reproduce.Command` data) are written into the report by ``commands_as``: the
    command line passes its parser's format (:func:`inspector.cli.reproduce.formatter_for`); the default is
    :func:`~inspector.investigate.reproduce.format_plainly`. Raises :class:`InspectorError` (nothing written) for a
    question or output the capture cannot answer.

    ``out_dir`` is replaced whole, and only where it is inspector's (:func:`inspector.store.files.check_folder_target`,
    checked before any work and again when the new folder goes in): absent, empty, or marked by an earlier run's
    ``.inspector.json`` (:data:`~inspector.investigate.defaults.MARKER`, written last, naming ``command``, the version
    and every file written) with nothing in it that the marker does not list. A user's folder (a ``report.html`` of
    their own included), an older version's folder (``report.html``, no marker), a file and a dangling link raise
    :class:`InspectorError` and are kept byte for byte; a link to a folder is followed (the swap happens on the folder
    it points to, the link stays a link).
    """
    from inspector.capture.inputs import model_layout
    from inspector.intervene.contrast import model_has_lm_head
    from inspector.ui.report import Sections, render_report

    if model_layout(loaded.model) != "encoder" and not output.given:
        raise InspectorError(f"{type(loaded.model).__name__} produces text: pass what it said with --output, or --generate N")
    out = Path(out_dir)
    check_folder_target(out, MARKER, legacy=REPORT)  # a file, or a folder not inspector's, is refused before any work
    # everything is computed (and every mistake found) before anything is written into out_dir
    cap = _capture_one(loaded, source, output, progress, global_tokens)
    question, question_notes = resolve_question(loaded, cap, question)
    placement = placement_for(cap, question)  # the one lookup of the question's words on the capture
    question_notes += output_word_note(cap, question, placement, model_has_lm_head(loaded.model))
    weighting = question.weighting
    rank = analysis.rank_heads(cap, weighting=weighting)  # one weighting per run: rank and split alike
    split = split_for(cap, question, placement)
    said = cap.records("target").text if any(r.role == "target" for r in cap.inputs) else None
    comparisons: dict[str, pd.DataFrame] = {}
    variant_caps: dict[str, Capture] = {}
    variant_placements: dict[str, Placement] = {}
    for name, text in (variants or {}).items():
        vcap = _capture_one(loaded, text, output if output.generate else Output.of(said), progress, global_tokens)
        variant_placements[name] = placement_for(vcap, question)  # each variant capture's own positions, once
        comparisons[name] = compare_captures(cap, vcap, question, names=("original", name), split_a=split,
                                             split_b=split_for(vcap, question, variant_placements[name]))
        variant_caps[name] = vcap
    moves = variant_moves(split, comparisons) if comparisons else None
    # what each capture's command feeds as the output: the saved text when it tokenizes to the ids the run fed,
    # else (generated tokens whose text tokenizes otherwise) the same greedy generation again
    generate = output.generate
    said_args = {name: _said_arg(loaded, c, text, file, generate)
                 for name, c, text, file in [("", cap, source, "output.txt")]
                 + [(n, variant_caps[n], (variants or {})[n], f"output-{n}.txt" if generate else "output.txt")
                    for n in variant_caps]}
    commands = _commands(_RunFiles(loaded.name, out, said_args, tuple(variants or {}), global_tokens), question, split,
                         roles_of(cap, question), rank_weighting=rank.attrs.get("weighting", "attention"),
                         explainable=_explainable(cap, split))
    asked_where = where  # the option; ``where`` below is the part computed
    matter = where = where_section = where_note = verdict = why = why_note = None
    contrast = question.contrast_spec
    if contrast:
        from inspector.investigate import matter as _matter
        from inspector.investigate.verdict import verdict_of

        matter = _matter.does_it_matter(loaded, cap, source, split, question=question, variants=variants, top=top,
                                        global_tokens=global_tokens, budget=budget, memory_gib=memory_gib)
        verdict = verdict_of(cap, matter, question)
        from inspector.investigate.verdict import why_of

        why, why_note = why_of(loaded, cap, source, verdict, placement=placement)
        commands += _matter.commands(loaded.name, out, matter, query=question.query, occurrence=question.occurrence,
                                     said=_said_options(out, said_args[""]))
        tokens = _input_tokens(cap)
        if global_tokens:
            where, where_section, where_note = None, None, ("--global marks global tokens, which the attribution and "
                                                            "route passes do not take")
        elif asked_where is False or (asked_where is None and tokens > WHERE_TOKENS):
            where, where_section, where_note = None, None, (
                f"left out: the input has {tokens} tokens, past {WHERE_TOKENS}, where its integrated gradients "
                "(32 points or more, each a forward and a backward pass over the whole input) would cost several times "
                "the rest of debug; --where runs it" if asked_where is None else "left out: not asked for (--no-where)")
        else:
            where, where_section, where_note = _where(loaded, cap, source, split, matter, question, verdict, memory_gib)
        if where is not None:
            commands += _where_commands(loaded.name, out, contrast, question.query, question.occurrence,
                                        _said_options(out, said_args[""]), model_has_lm_head(loaded.model))
    comparison = pd.concat([df.assign(variant=name) for name, df in comparisons.items()],
                           ignore_index=True) if comparisons else None
    lines = [(commands_as or format_plainly)(c) for c in commands]
    html = render_report(cap, split, rank, question, commands=lines, sections=Sections(
        comparison=comparison, variants=variant_caps or None, moves=moves, placement=placement,
        variant_placements=variant_placements or None,
        rank_note=rank_note(rank.attrs.get("weighting", "attention")),
        matter=_matter.section(matter) if matter is not None else None, where=where_section, verdict=verdict, why=why))

    # built beside the target and swapped in whole: never two runs' files in one folder, and a failure midway
    # leaves the old folder as it was; its marker (written last) says which command and version wrote which files
    final = out
    with swap_folder(final, MARKER, folder_stamp(command), legacy=REPORT) as out:
        cap_path = cap.save(out / "capture.safetensors")
        write_csv(out / "rank.csv", rank)
        write_csv(out / "split.csv", split)
        write_text(out / "source.txt", source)
        if said is not None:
            write_text(out / "output.txt", said)
        variant_paths: dict[str, Path] = {}
        for name, vcap in variant_caps.items():
            variant_paths[name] = vcap.save(out / f"variant-{name}.safetensors")
            write_text(out / f"variant-{name}.txt", (variants or {})[name])
            if generate:  # the variant's own output, generated from its own source
                write_text(out / f"output-{name}.txt", vcap.records("target").text)
            write_csv(out / f"compare-{name}.csv", comparisons[name])
        if matter is not None:
            _matter.write(out, matter)
            from inspector.investigate import verdict as _verdict

            _verdict.write(out, verdict, why)
        if where is not None:
            from inspector.investigate import wherefrom

            wherefrom.write(out, where)
        report = write_text(out / REPORT, html)
    out = final
    cap_path, report = out / cap_path.name, out / report.name
    variant_paths = {name: out / p.name for name, p in variant_paths.items()}
    return Investigation(out_dir=out, capture=cap, capture_path=cap_path, rank=rank, split=split, report_path=report,
                         commands=commands, command_lines=lines, variants=variant_paths, comparisons=comparisons, matter=matter,
                         moves=moves, where=where, where_note=where_note, verdict=verdict, question=question,
                         notes=question_notes, why=why, why_note=why_note)


def _input_tokens(cap: Capture) -> int:
    """The input's tokens: the source's and the output's of the first batch row (padding included)."""
    return sum(len(r.ids) for r in cap.inputs if r.batch == 0)


def _where(loaded, cap: Capture, source: str, split: pd.DataFrame, matter, question: Question, verdict=None,
           memory_gib: float | None = None):
    """The "Where did the word come from?" part, its report section and None; or ``(None, None, why)`` for a
    model whose residual routes cannot decompose (refused by name: the rest of the investigation stands)."""
    from inspector.attribute.families import FAMILIES
    from inspector.investigate import wherefrom
    from inspector.ui.report import WhereSection

    mt = getattr(loaded.model.config, "model_type", "")
    if mt not in FAMILIES:
        return None, None, (f"routes decompose the residual of {', '.join(sorted(FAMILIES))} models; {mt!r} is not "
                            "among them")
    try:
        options = wherefrom.WhereOptions() if memory_gib is None else wherefrom.WhereOptions(memory_gib=memory_gib)
        w = wherefrom.where_from(loaded, cap, source, split, matter=matter, question=question, verdict=verdict,
                                 options=options)
    except InspectorError as exc:  # e.g. blocks that do not add up as the family's layout says
        return None, None, str(exc)
    return w, WhereSection(attribution=w.attribution, route=w.route, heads=w.heads, sentence=wherefrom.headline(w),
                           threshold=w.threshold), None


def _said_arg(loaded, cap: Capture, source: str, file: str, generate: int | None) -> tuple[str, str | int] | None:
    """How a command feeds ``cap``'s output exactly as the run did: ``("file", FILE)`` (the saved text, given with
    ``--output``, or generated text that tokenizes to the ids the run fed), ``("generate", N)`` (generated tokens
    whose text tokenizes otherwise, e.g. a word piece that starts the output or an encoder-decoder's output cut at
    N tokens without its end token: the same greedy generation gives the same ids), or None without an output."""
    if not any(r.role == "target" for r in cap.inputs):
        return None
    if not generate:
        return "file", file
    from inspector.investigate.matter import said_output

    return ("file", file) if said_output(loaded.model, loaded.tokenizer, cap, source).text is not None else ("generate", generate)


def _said_options(out: Path, said: tuple[str, str | int] | None, dest: str = "output_file") -> Options:
    """The options of :func:`_said_arg`'s answer: ``(dest, OUT/FILE)`` (``dest``: the subcommand's output-file
    argument, ``target_file`` for ``capture``), ``("generate", N)`` or none."""
    if said is None:
        return ()
    kind, value = said
    return ((dest, str(out / str(value))),) if kind == "file" else (("generate", value),)


def _model_options(model: str) -> Options:
    """``--model NAME``, left out for the embedded model (the commands' default)."""
    return () if model.startswith("embedded:") else (("model", model),)


def _where_commands(model: str, out: Path, contrast: str, query: str, occurrence: int | None, said: Options,
                    lm: bool) -> list[Command]:
    """``attribute`` and ``routes`` over the saved source, with ``said`` (:func:`_said_options`) for the output."""
    texts = (*_model_options(model), ("source_file", str(out / "source.txt")), *said)
    tail: Options = (("contrast", contrast),) + (() if lm else (("query", query),) + ((("occurrence", occurrence),)
                                                                                        if occurrence else ()))
    from inspector.investigate.wherefrom import STEPS

    return [Command("attribute", (), texts + tail + (("methods", ("input_x_gradient", "integrated_gradients")),
                                                      ("steps", STEPS),
                                                      ("csv", str(out / "attribution.csv")))),
            Command("routes", (), texts + tail + (("csv", str(out / "route.csv")),))]


def _explainable(cap: Capture, split: pd.DataFrame) -> bool:
    """Whether ``inspector explain`` works for the split table's top head: its site has weights, stored or
    computable from Q/K (a site stored as weights only, as LED's and Pegasus-X's, is explained without steps)."""
    from inspector.analysis.explain import no_steps

    if not len(split):
        return False
    try:
        no_steps(cap.site(split.sort_values("split_score", ascending=False).iloc[0]["site"]))
    except InspectorError:
        return False
    return True


@dataclass(frozen=True)
class _RunFiles:
    """What a run wrote that its reproduce commands name: the model, the folder, each capture's output as
    :func:`_said_arg` says (keyed ``""`` for the original and by variant name), the variants' names and the
    run's ``global_tokens`` (``--global``)."""

    model: str
    out: Path
    said_args: dict
    variants: tuple[str, ...] = ()
    global_tokens: list[str] | None = None


def _commands(run: _RunFiles, question: Question, split: pd.DataFrame, roles: tuple[str | None, str], *,
              rank_weighting: str = "attention", explainable: bool = True) -> list[Command]:
    """The commands that rewrite the run's files (the CSVs byte for byte; a capture's tensors and metadata equal
    but for its ``created`` time and, for an output the run generated, the output's ``word_ids``, which a capture
    of the saved text records and one of generated ids cannot): the capture(s) (marking the run's
    ``global_tokens``, ``--global``; each with its own output as ``said_args`` says, keyed ``""`` for the original
    and by variant name, :func:`_said_arg`), ``rank.csv``, ``split.csv``, each ``compare-NAME.csv`` (same thresholds,
    weighting and column labels), and explain of the top head when explain works there (``explainable``: its
    site has weights; without Q/K/V explain gives the weights without steps). Options at their defaults are
    left out."""
    model, out, said_args, variants, global_tokens = run.model, run.out, run.said_args, run.variants, run.global_tokens
    rule, default = question.rule, analysis.SplitRule()
    wt: Options = tuple((f, getattr(rule, f)) for f in ("min_split", "min_mass", "min_lift")
                        if getattr(rule, f) != getattr(default, f))
    wt += () if question.weighting == "attention" else (("weighting", question.weighting),)
    refs: Options = (("referents", tuple(question.referents)),)
    query: Options = (("query", question.query),) + ((("occurrence", question.occurrence),) if question.occurrence else ())
    cap = str(out / "capture.safetensors")
    glob: Options = (("global_tokens", tuple(global_tokens)),) if global_tokens else ()
    role: Options = (("query_role", roles[0]),) if roles[0] else ()

    def capture_of(text: str, said: tuple[str, str | int] | None, file: str) -> Command:
        return Command("capture", (), (*_model_options(model), ("text_file", str(out / text)),
                                       *_said_options(out, said, "target_file"), *glob, ("output", file)))

    cmds = [
        capture_of("source.txt", said_args[""], cap),
        Command("rank", (cap,), (() if rank_weighting == "attention" else (("weighting", rank_weighting),))
                + (("csv", str(out / "rank.csv")),)),
        Command("split", (cap,), query + refs + role + (("referent_role", roles[1]), ("cross_first", True)) + wt
                + (("csv", str(out / "split.csv")),)),
    ]
    if len(split) and explainable:
        top = split.sort_values("split_score", ascending=False).iloc[0]
        # the words looked up where split looked them up (a decoder-only model's prompt and output share one axis)
        cmds.append(Command("explain", (cap,), (("site", str(top["site"])), ("head", int(top["head"])), *query, *role,
                                                *refs, ("referent_role", roles[1]), *wt)))
    for name in variants:
        vcap = str(out / f"variant-{name}.safetensors")
        cmds.append(capture_of(f"variant-{name}.txt", said_args[name], vcap))
        cmds.append(Command("compare", (cap, vcap), query + role + refs + wt
                            + (("names", ("original", name)), ("csv", str(out / f"compare-{name}.csv")))))
    return cmds
