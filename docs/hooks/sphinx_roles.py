"""Griffe extension for the API reference: the docstrings' Sphinx roles written as Markdown code.

The docstrings are written for reading in the source and in ``help()``: reStructuredText roles such as
``:func:`~inspector.analysis.rank.rank_heads``` and ``::`` before a literal block. mkdocstrings renders
docstrings as Markdown, where a role would show as ``:func:`` followed by the name; this extension rewrites
each role as a code span of the name (``~`` keeps its last part, as in Sphinx) and a paragraph's closing
``::`` as ``:``. Nothing else in a docstring changes.
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj|const):`(~?)([^`<]+?)(?:\s*<[^>]*>)?`")
LITERAL = re.compile(r"(\S)::$", re.MULTILINE)


def markdown_of(text: str) -> str:
    """A docstring with its Sphinx roles as code spans and its ``word::`` literal-block openers as ``word:``."""
    def role(m: re.Match) -> str:
        name = m.group(2).strip()
        if m.group(1):
            name = name.rsplit(".", 1)[-1]
        return f"`{name}`"

    return LITERAL.sub(r"\1:", ROLE.sub(role, text))


def _rewrite(obj) -> None:
    if obj.is_alias:
        return
    if obj.docstring is not None:
        obj.docstring.value = markdown_of(obj.docstring.value)
    for member in obj.members.values():
        if not member.is_alias:
            _rewrite(member)


class SphinxRoles(griffe.Extension):
    """Rewrite every docstring of a loaded package (see the module's docstring)."""

    def on_package(self, *, pkg, **kwargs) -> None:
        """Called once the whole package is loaded: rewrite its docstrings, members included."""
        _rewrite(pkg)
