"""Every public module, function, class and method of the API (inspector/, the command line's argparse
handlers aside) says what it is for: its docstring. Read from the source (ast), nothing imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "inspector"


def _api_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "cli" not in p.relative_to(PACKAGE).parts[:-1]
                  and p.name != "__main__.py")


def _undocumented(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    where = str(path.relative_to(ROOT))
    missing = [] if ast.get_docstring(tree) else [f"{where}: module"]

    def visit(nodes, prefix: str) -> None:
        for node in nodes:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or node.name.startswith("_"):
                continue
            if not ast.get_docstring(node):
                missing.append(f"{where}:{node.lineno} {prefix}{node.name}")
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")

    visit(tree.body, "")
    return missing


def test_every_public_name_of_the_api_has_a_docstring():
    missing = [m for p in _api_modules() for m in _undocumented(p)]
    assert not missing, "no docstring:\n" + "\n".join(missing)


def test_the_check_sees_a_missing_docstring(tmp_path):
    bare = tmp_path / "inspector" / "bare.py"
    bare.parent.mkdir()
    bare.write_text('"""A module."""\n\ndef shown(x):\n    return x\n\n\nclass Rule:\n    """Doc."""\n\n'
                    '    def passes(self):\n        return True\n\n    def _private(self):\n        return 0\n')
    global ROOT
    old, ROOT = ROOT, tmp_path
    try:
        assert _undocumented(bare) == ["inspector/bare.py:3 shown", "inspector/bare.py:10 Rule.passes"]
    finally:
        ROOT = old
