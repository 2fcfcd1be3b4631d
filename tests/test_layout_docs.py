"""The layout is documented completely: every module (and sub-package) of every stage is named in its stage's
docstring, every module of a sub-package in the sub-package's, and every module has a line in the layout table of
docs/development.md (a new module without a line there fails here)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "inspector"
# every package below inspector/: the stages ("ui") and their sub-packages ("ui/views")
STAGES = sorted(p.parent.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)


def _modules(stage: str) -> list[str]:
    return sorted(p.stem for p in (PACKAGE / stage).glob("*.py") if p.stem != "__init__")


def _subpackages(stage: str) -> list[str]:
    return sorted(p.name for p in (PACKAGE / stage).iterdir() if (p / "__init__.py").exists())


def test_sub_packages_are_checked_too():
    assert "ui" in STAGES and "ui/views" in STAGES and "views" in _subpackages("ui")


@pytest.mark.parametrize("stage", STAGES)
def test_every_module_is_named_in_its_stage_docstring(stage):
    doc = ast.get_docstring(ast.parse((PACKAGE / stage / "__init__.py").read_text(encoding="utf-8"))) or ""
    missing = [m for m in _modules(stage) + _subpackages(stage)
               if not re.search(rf"(?<![\w]){re.escape(m)}(?![\w])", doc)]
    assert not missing, f"inspector/{stage}/__init__.py's docstring does not name: {missing}"


def test_every_module_has_a_line_in_the_layout_table():
    text = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    cells = re.findall(r"^\| ([^|]+) \|", text, flags=re.M)
    named = set()
    for cell in cells:
        for path in re.findall(r"`([^`]+)`", cell):
            named.add(path)
            named.add(path.rsplit("/", 1)[-1])
    missing = [f"inspector/{s}/{m}.py" for s in STAGES for m in _modules(s)
               if f"inspector/{s}/{m}.py" not in named and not (f"{m}.py" in named and any(
                   f"inspector/{s}/" in c for c in cells if f"{m}.py" in c))]
    assert not missing, f"docs/development.md's layout table has no line for: {missing}"
