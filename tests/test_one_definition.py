"""One definition of what several stages share (issue 43's second copies): the model-family table, a head's name and
the refusal of an empty source text, the integrated-gradients routine. Each test fails on a second copy anywhere in ``inspector/``."""

from __future__ import annotations

import ast
from pathlib import Path

from inspector.analysis.heads import head_label
from inspector.attribute.families import FAMILIES
from inspector.errors import EMPTY_SOURCE, InspectorError, check_source, empty_source

ROOT = Path(__file__).resolve().parent.parent / "inspector"
# files another engineer is changing for issue 42: fixed after that merge (the message: errors.empty_source)
PENDING_42: dict[str, str] = {}  # none left after issue 42's merge


def _trees():
    for path in sorted(ROOT.rglob("*.py")):
        yield str(path.relative_to(ROOT)), ast.parse(path.read_text(encoding="utf-8"))


def _family_tables(tree: ast.Module) -> list[int]:
    """Lines of module-level dict literals keyed by two or more model types of the family table."""
    found = []
    for node in tree.body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.Dict):
            keys = {k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            if len(keys & set(FAMILIES)) >= 2:
                found.append(node.lineno)
    return found


def test_one_model_family_table():
    tables = {name: lines for name, tree in _trees() if (lines := _family_tables(tree))}
    assert tables == {"attribute/families.py": tables.get("attribute/families.py")} and tables.get("attribute/families.py"), \
        f"model-family tables outside attribute/families.py (routes and score_parts read that one): {tables}"


def test_the_family_check_sees_a_second_table():
    tree = ast.parse('_OTHER = {"gpt2": 1, "bart": 2}\nNOT = {"x": 1}\n')
    assert _family_tables(tree) == [1]


def test_one_head_naming_function():
    defs = sorted(f"{name}:{n.name}" for name, tree in _trees() for n in ast.walk(tree)
                  if isinstance(n, ast.FunctionDef) and n.name in ("head_label", "head_name"))
    assert defs == ["analysis/heads.py:head_label"], defs


def test_the_head_names_every_view_prints():
    row = {"layer": 5, "head": 9, "site": "encoder.layer.5.attention.self", "kind": "self"}
    assert head_label(row) == "layer 5 head 9 (encoder.layer.5.attention.self)"
    assert head_label(row, form="plain") == "layer 5 head 9"
    assert head_label(row, form="short") == "L5 H9"
    assert head_label({**row, "kind": "cross"}, form="short") == "L5 H9 cross"
    assert head_label({"site": "s", "head": 2}, form="short") == "s H2"


def _strings(tree: ast.Module) -> list[str]:
    """The string constants of a module but its docstrings."""
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_one_empty_source_message():
    copies = sorted(name for name, tree in _trees() for text in _strings(tree) if EMPTY_SOURCE in text)
    assert copies == ["errors.py", *sorted(PENDING_42)], copies
    assert str(empty_source()) == "the source text is empty: pass --source TEXT or --source-file FILE"
    assert check_source("a") == "a"
    for blank in (None, "", " \n"):
        try:
            check_source(blank)
        except InspectorError as e:
            assert str(e) == str(empty_source())
        else:
            raise AssertionError(blank)


def _ig_routines(tree: ast.Module) -> list[int]:
    """Lines that build an integrated-gradients path of their own: Captum's ``IntegratedGradients`` or numpy's
    Gauss-Legendre nodes (``leggauss``), named anywhere in the module."""
    return sorted({n.lineno for n in ast.walk(tree)
                   if (isinstance(n, ast.Name) and n.id in ("IntegratedGradients", "leggauss"))
                   or (isinstance(n, ast.Attribute) and n.attr in ("IntegratedGradients", "leggauss"))
                   or (isinstance(n, ast.alias) and n.name in ("IntegratedGradients", "leggauss"))})


def test_one_integrated_gradients_routine():
    """``attribute`` and ``sources`` share :func:`inspector.attribute.attribution.integrated_gradients` and its one
    completeness record; no other module builds a path of its own."""
    found = {name: lines for name, tree in _trees() if (lines := _ig_routines(tree))}
    assert set(found) == {"attribute/attribution.py"}, f"integrated gradients written outside attribution: {found}"
    src = (ROOT / "attribute" / "sources.py").read_text(encoding="utf-8")
    assert ".integrated_gradients(f, " in src and "Completeness" in src


def test_the_routine_check_sees_a_second_one():
    assert _ig_routines(ast.parse("import numpy as np\nnodes, w = np.polynomial.legendre.leggauss(8)\n")) == [2]
    assert _ig_routines(ast.parse("from captum.attr import IntegratedGradients\n")) == [1]
