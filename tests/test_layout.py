"""The package's shape: stages that import one way (the import-linter contract runs in `make lint`), no module
using another's private names, and a command line that answers --help and argument errors without loading
torch, transformers or pandas."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "inspector"
HEAVY = ("torch", "transformers", "pandas")


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_imports_another_modules_private_names():
    found = []
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("inspector"):
                found += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, found


def test_every_stage_is_a_package_with_a_docstring():
    stages = ["store", "capture", "analysis", "intervene", "corpus", "ui", "investigate", "cli"]
    for stage in stages:
        init = PACKAGE / stage / "__init__.py"
        assert init.exists(), stage
        assert ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), stage
    loose = {p.name for p in PACKAGE.glob("*.py")}
    assert loose == {"__init__.py", "__main__.py", "errors.py"}, loose


def _heavy_after(code: str) -> tuple[list[str], subprocess.CompletedProcess]:
    probe = ("import atexit, sys\n"
             f"atexit.register(lambda: print('LOADED', ','.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr))\n"
             ) + code
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    line = [ln for ln in done.stderr.splitlines() if ln.startswith("LOADED")][-1]
    return [m for m in line.split(" ", 1)[1].split(",") if m], done


@pytest.mark.parametrize("argv", [["--help"], ["capture", "--help"], ["scan", "--help"], ["debug", "--help"],
                                  ["rank"], ["split", "x.safetensors"], ["nonsense"]])
def test_help_and_argument_errors_load_no_heavy_library(argv):
    loaded, done = _heavy_after(f"from inspector.cli import main\nsys.exit(main({argv!r}))")
    assert done.returncode in (0, 2), done.stderr
    assert loaded == [], (argv, loaded)


def test_import_inspector_is_light_until_a_function_is_used():
    loaded, _ = _heavy_after("import inspector\nassert callable(inspector.capture)\n")
    assert loaded == []  # the callable package imports the recorder (and torch) when it is called
    loaded, _ = _heavy_after("import inspector\nassert callable(inspector.rank_heads)\n")
    assert "torch" in loaded  # a function that needs torch loads it when first named
    loaded, _ = _heavy_after("import inspector\nimport inspector.cli\n")
    assert loaded == []


_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9-]*[\s>/]")


def _html_built_in_code(tree: ast.AST) -> list[ast.AST]:
    """f-strings with an HTML tag in their literal text, and string literals with a tag joined by ``+``,
    ``%`` or ``.format`` (HTML belongs in the autoescaping Jinja2 templates under inspector/*/templates)."""
    def tagged(node) -> bool:
        if isinstance(node, ast.JoinedStr):
            return bool(_TAG.search("".join(v.value for v in node.values if isinstance(v, ast.Constant))))
        return isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(_TAG.search(node.value))

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and tagged(node):
            found.append(node)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)) and (tagged(node.left) or tagged(node.right)):
            found.append(node)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"
              and tagged(node.func.value)):
            found.append(node)
    return found


def test_the_check_for_html_in_code_finds_it():
    src = 'a = f"<span>{x}</span>"\nb = "<p>" + body\nc = "<div %s>" % x\nd = "<b>{}</b>".format(x)\n' \
          'ok = "a < b"\nre_ok = r"<script\\s+src"\nalso_ok = f"{a} <= {b}"\n'
    assert [n.lineno for n in _html_built_in_code(ast.parse(src))] == [1, 2, 3, 4]


def test_no_html_in_f_strings_or_string_joins():
    found = [f"{path.relative_to(ROOT)}:{node.lineno}" for path in _modules()
             for node in _html_built_in_code(ast.parse(path.read_text(encoding="utf-8")))]
    assert not found, f"HTML built in code (move it to a Jinja2 template): {found}"


def test_the_corpus_api_is_named_as_readme_names_it():
    import types

    import inspector.corpus as corpus_api

    for name in ("connect", "summary", "head_documents", "query"):
        assert callable(getattr(corpus_api, name)), name
    from inspector.corpus import queries

    assert isinstance(queries, types.ModuleType) and callable(queries.queries)


def test_the_capture_package_is_the_package_and_calling_it_captures():
    """``import inspector.capture as c`` gives the package (its submodules import through it), and
    ``inspector.capture(model, tokenizer, text)`` is :func:`inspector.capture.recorder.capture`."""
    import types

    import inspector
    import inspector.capture as c
    import inspector.capture.recorder as recorder

    assert isinstance(c, types.ModuleType) and c is inspector.capture
    assert c.capture is recorder.capture and c.record is recorder.record
    import tiny

    model = tiny.build("gpt2")
    cap = inspector.capture(model, tiny.tokenizer(), "The Lessee shall pay the Lessor.", weights=False)
    assert repr(cap).startswith("Capture of ") and "; source " in repr(cap)


def test_the_head_key_is_spelled_once():
    """The columns that name a head (``inspector.store.schema.HEAD_KEY``) are written out in one place; every table
    builds on that tuple, so the CLI, CSV, report, app and corpus name a head the same way (a table that shows
    these columns in another order for reading, e.g. a route's edges, is not a key)."""
    import ast

    from inspector.store.schema import HEAD_KEY

    found = []
    for path in sorted((ROOT / "inspector").rglob("*.py")) + sorted((ROOT / "apps").glob("*.py")):
        if path.name == "schema.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
                words = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                n = len(HEAD_KEY)
                if any(tuple(words[i:i + n]) == HEAD_KEY for i in range(len(words) - n + 1)):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"the head key spelled out again (use inspector.store.schema.HEAD_KEY): {found}"
