"""Values that travel between stages have types, not long parameter lists (issue 30).

Every function in ``inspector/`` with more than 8 parameters is listed here with the reason it may have them;
a new one fails until it takes a value (``Output``, ``Question``, ``CaptureOptions``, ``WhereOptions``...) or is
listed with a reason. Apart from the list, a function may never take more than 8 parameters of which 4 or more
are only handed on to another call (a chain that passes the same arguments down): that is what the values are for.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "inspector"
LIMIT = 8

# may hand their parameters on: they are the settings of a library call (Ray Data) made in one place
HANDS_ON = {"corpus/ray_engine.py:ray_batches"}
ENTRY = "public entry point: each keyword is a documented option of its own (a CLI flag maps to it one to one)"
ALLOWED = {
    "corpus/scan.py:scan": ENTRY + " (fields, reduction options as one Options value, engine, Ray's address, "
                                   "workers and CPUs, device, progress)",
    "investigate/evaluation.py:evaluate": ENTRY + " (the evaluation as one Evaluation value, fields, batch size, "
                                                  "device, remote code, progress, a loaded model, status, engine, Ray's "
                                                  "address and workers), as scan's",
    "intervene/effects.py:exact_effects": ENTRY + " (ablation method, the metric before, the rerun's reuse, memory "
                                                  "bound, batch and a kept clean pass: issue 42's rerun options)",
    "investigate/matter.py:does_it_matter": ENTRY + " (variants, --top, --global, --budget and --memory-budget of "
                                                    "debug, one to one)",
    "intervene/sources.py:sources": ENTRY + " (ContextCite's ablations, alpha, seed, mode, span, batch size)",
    "intervene/attribution.py:attribute": ENTRY + " (methods and integrated gradients' steps, batch and memory budget)",
    "analysis/split.py:split_heads": ENTRY + "; investigations call it once with a Question's fields (split_for)",
    "analysis/explain.py:explain": ENTRY + "; a word's explanation builds one Question and passes only it on",
    "intervene/routes.py:routes": ENTRY + " (position, contrast, query, occurrence, threshold, stack, graph)",
    "intervene/effects.py:effects": ENTRY + " (contrast, query, occurrence, top, method, confirm)",
    "intervene/effects.py:patch": ENTRY + "; the output is one Output value",
    "intervene/effects.py:ablate": ENTRY + "; the output is one Output value",
    "intervene/effects.py:attribute": ENTRY + "; the output is one Output value",
    "intervene/logit_parts.py:decompose": ENTRY + " (site, head, query and the two key sets being compared)",
    "analysis/rank.py:rank_heads": ENTRY + " (sites, sort, rule, weighting, chunk, batch row)",
    "analysis/rank.py:rank_heads_both": ENTRY + " (rank_heads' options; both special-token choices in one pass, "
                                               "for the app's toggle)",
    "investigate/debug.py:investigate": ENTRY + "; the question and the output are one value each",
    "investigate/matter.py:matter_of": ENTRY + " behind `effects --confirm/--variant/--matter-csv`; the output and "
                                       "the question are one value each",
    "ui/show.py:head_heatmap": ENTRY + " of the plotting API (window, colours, the query to mark)",
    "intervene/sources.py:evaluate": ENTRY + " (ContextCite's protocol on any scoring function: ablations, hold-out, "
                                     "seed, LASSO alpha, baselines, top-k)",
    "intervene/logit_parts.py:_side": "one side (query or key) of the bilinear decomposition: tensors read here",
    "intervene/logit_parts.py:_decompose": "the decomposition's inner step: tensors and positions read here",
    "intervene/routes.py:_attention_edges": "one attention block's edges (Ferrando & Voita 2024): tensors read here",
    "investigate/debug.py:_commands": "the reproduce commands: each argument is a part of the command line written",
    "corpus/batch_reduce.py:_keep_block_rows": "a hot loop over block rows: plain tensors, no value boxing",
    "corpus/ray_engine.py:ray_batches": "the Ray engine's settings as scan received them (address, actors, CPUs, "
                                        "device, remote code): handed to Ray Data's map_batches",
    "cli/common.py:check_capture_words": "the CLI's word check over a capture's header before torch loads: the "
                                         "word list, its role, case rule, occurrence and axis are each read here",
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
