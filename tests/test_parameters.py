"""Values that travel between stages have types, not long parameter lists (issues 30 and 43).

Every function in ``inspector/`` with more than 8 parameters is listed here with the reason it may have them;
a new one fails until it takes a value (``Output``, ``Question``, ``CaptureOptions``, ``WhereOptions``...) or is
listed with a reason. Apart from the list, a function may never take more than 8 parameters of which 4 or more
are only handed on to another call (a chain that passes the same arguments down): that is what the values are for.

Issue 43: a private function (``_name``) never takes more than 8 parameters (no list: it groups them into a small
value instead), and a public one takes at most 4 positional parameters (``self``/``cls`` not counted): the rest are
keyword-only (``*``), so a call names what it passes.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "inspector"
LIMIT = 8

# may hand their parameters on (none left: the Ray engine's settings travel as one Engine value, issue 43)
HANDS_ON: set[str] = set()
ENTRY = "public entry point: each keyword is a documented option of its own (a CLI flag maps to it one to one)"
ALLOWED = {
    "corpus/scan.py:scan": ENTRY + " (the model and the engine as one ModelSpec and one Engine value, fields, "
                                   "reduction options as one Options value, progress, a loaded model, allowed "
                                   "files, status)",
    "investigate/evaluation.py:evaluate": ENTRY + " (the evaluation as one Evaluation value, the model and the "
                                                  "engine as scan's ModelSpec and Engine, fields, progress, a loaded "
                                                  "model, status), as scan's",
    "intervene/effects.py:exact_effects": ENTRY + " (ablation method, the metric before, the rerun's reuse, memory "
                                                  "bound, batch and a kept clean pass: issue 42's rerun options)",
    "investigate/matter.py:does_it_matter": ENTRY + " (variants, --top, --global, --budget and --memory-budget of "
                                                    "debug, one to one)",
    "attribute/attribution.py:attribute": ENTRY + " (methods and integrated gradients' steps, batch and memory budget)",
    "attribute/routes.py:routes": ENTRY + " (position, contrast, query, occurrence, threshold, stack, graph)",
    "intervene/effects.py:effects": ENTRY + " (contrast, query, occurrence, top, method, confirm)",
    "intervene/effects.py:patch": ENTRY + "; the output is one Output value",
    "intervene/effects.py:ablate": ENTRY + "; the output is one Output value",
    "intervene/effects.py:attribute": ENTRY + "; the output is one Output value",
    "attribute/score_parts.py:decompose": ENTRY + " (site, head, query and the two key sets being compared)",
    "analysis/rank.py:rank_heads": ENTRY + " (sites, sort, rule, weighting, chunk, batch row)",
    "investigate/debug.py:investigate": ENTRY + "; the question and the output are one value each",
    "investigate/matter.py:matter_of": ENTRY + " behind `effects --confirm/--variant/--matter-csv`; the output and "
                                       "the question are one value each",
    "ui/show.py:head_heatmap": ENTRY + " of the plotting API (window, colours, the query to mark)",
    "attribute/surrogate.py:evaluate": ENTRY + " (ContextCite's protocol on any scoring function: ablations, "
                                       "hold-out, seed, LASSO alpha, baselines, top-k)",
    "cli/words.py:check_capture_words": "the CLI's word check over a capture's header before torch loads: the "
                                         "word list, its role, case rule, occurrence and axis are each read here",
}


POSITIONAL = 4
# files another engineer is changing for issue 42: their offenders are fixed after that merge, not here
PENDING: dict[str, str] = {}  # none left: issue 42's files took their keyword-only parameters after the merge
# signatures another library calls positionally: they must take its arguments as it passes them
PROTOCOL = {
    "capture/interface.py:fast_attention": "transformers' attention interface: (module, query, key, value, "
                                           "attention_mask, **kwargs), as sdpa_attention_forward and the eager function",
}


def _functions():
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
                yield f"{path.relative_to(ROOT)}:{node.name}", node, names


def _handed_on(node, names: set[str]) -> set[str]:
    """The parameters used only as arguments of calls (positional or keyword), never read otherwise."""
    parents = {child: parent for parent in ast.walk(node) for child in ast.iter_child_nodes(parent)}
    as_arg, other = set(), set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, ast.Load):
            p = parents.get(n)
            if (isinstance(p, ast.Call) and n in p.args) or (isinstance(p, ast.keyword) and isinstance(parents.get(p), ast.Call)):
                as_arg.add(n.id)
            else:
                other.add(n.id)
    return as_arg - other


def test_every_long_parameter_list_is_listed_with_a_reason():
    long = {key: len(names) for key, _, names in _functions() if len(names) > LIMIT}
    unlisted = sorted(k for k in long if k not in ALLOWED)
    assert not unlisted, f"functions with more than {LIMIT} parameters: take a value or list them with a reason: {unlisted}"
    stale = sorted(k for k in ALLOWED if k not in long)
    assert not stale, f"listed but no longer long (remove them from ALLOWED): {stale}"
    assert all(reason.strip() for reason in ALLOWED.values())


def test_no_long_function_only_hands_its_parameters_on():
    """A chain that passes the same arguments down is what Output, Question and the options values replace."""
    chains = {}
    for key, node, names in _functions():
        if len(names) > LIMIT and not key.endswith(":__init__"):
            on = _handed_on(node, set(names))
            if len(on) >= 4 and not ALLOWED.get(key, "").startswith(ENTRY) and key not in HANDS_ON:
                chains[key] = sorted(on)
    assert not chains, f"long functions that hand 4 or more parameters on (take a value instead): {chains}"


def _positional(node) -> list[str]:
    a = node.args
    return [x.arg for x in a.posonlyargs + a.args if x.arg not in ("self", "cls")]


def test_no_private_function_takes_more_than_8_parameters():
    """No list: a private helper groups its parameters into a value (``score_parts._Pass``, ``debug._RunFiles``)."""
    long = {key: len(names) for key, node, names in _functions() if node.name.startswith("_") and len(names) > LIMIT}
    assert not long, f"private functions with more than {LIMIT} parameters (group them into a value): {long}"
    assert not [k for k in ALLOWED if k.rsplit(":", 1)[1].startswith("_")], "ALLOWED lists no private function"


def test_no_public_function_takes_more_than_4_positional_parameters():
    wide = {key: len(_positional(node)) for key, node, _ in _functions()
            if not node.name.startswith("_") and len(_positional(node)) > POSITIONAL}
    unlisted = sorted(k for k in wide if k not in PENDING and k not in PROTOCOL)
    assert not unlisted, (f"public functions with more than {POSITIONAL} positional parameters (make the rest "
                          f"keyword-only, after a `*`): {unlisted}")
    stale = sorted(k for k in {**PENDING, **PROTOCOL} if k not in wide)
    assert not stale, f"listed but no longer wide (remove them from PENDING / PROTOCOL): {stale}"
    assert all(reason.strip() for reason in {**PENDING, **PROTOCOL}.values())


def test_the_check_sees_a_wide_function(tmp_path):
    """The counts are of the signature: a hook's default-bound closure variables are positional unless after ``*``."""
    tree = ast.parse("def f(a, b, c, d, e): ...\ndef g(a, b, c, d, *, e): ...\n"
                     "class K:\n    def m(self, a, b, c, d): ...\n")
    counts = {n.name: len(_positional(n)) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert counts == {"f": 5, "g": 4, "m": 4}
