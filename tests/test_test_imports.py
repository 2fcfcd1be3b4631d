"""No test file imports another (issue 43): what several test files share lives in ``tests/helpers/`` (the browser
harness, the app's AppTest steps, the tiny long-attention models, the scan tables) or in ``conftest.py``'s fixtures,
so running one test file never collects, or depends on the import of, another."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
TEST_MODULES = {p.stem for p in TESTS.glob("test_*.py")}


def _imported(tree: ast.AST) -> set[str]:
    """The top-level module names a file imports (``import a.b``, ``from a import b``, ``importlib.import_module("a")``,
    ``pytest.importorskip("a")``), wherever the import is."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out |= {a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            out.add(n.module.split(".")[0])
        elif isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", None)) in (
                "import_module", "importorskip", "__import__") and n.args and isinstance(n.args[0], ast.Constant) \
                and isinstance(n.args[0].value, str):
            out.add(n.args[0].value.split(".")[0])
    return out


def test_no_test_file_imports_another():
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
        names = _imported(ast.parse(path.read_text(encoding="utf-8"))) & TEST_MODULES
        if names:
            found[str(path.relative_to(TESTS))] = sorted(names)
    assert not found, f"test files importing test files (move what they share to tests/helpers/ or conftest.py): {found}"


def test_the_check_sees_every_kind_of_import():
    tree = ast.parse("import test_a as x\nfrom test_b import y\ndef f():\n    import test_c\n"
                     "import importlib\nimportlib.import_module('test_d')\n")
    assert _imported(tree) >= {"test_a", "test_b", "test_c", "test_d"}
