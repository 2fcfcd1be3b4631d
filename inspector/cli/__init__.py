"""The command line (``inspector ...``, ``python -m inspector ...``): the top stage, a thin layer over the API.

* :mod:`~inspector.cli.common`: argument types and options, checks that run before a model loads, the app runner;
* :mod:`~inspector.cli.commands`: the parser, ``main`` and the capture, analysis, intervention and corpus commands;
* :mod:`~inspector.cli.investigate`: ``debug``, ``compare`` and ``demo``;
* :mod:`~inspector.cli.routes`: ``attribute`` and ``routes``; :mod:`~inspector.cli.why`: ``why``;
* :mod:`~inspector.cli.sources`: ``sources`` (ContextCite);
* :mod:`~inspector.cli.evaluate`: ``scan``'s contrast per document and ``corpus``'s views of an evaluation scan;
* :mod:`~inspector.cli.reproduce`: the reproduce commands of ``debug`` and ``demo`` as shell lines, spelt by the
  parser (a renamed flag renames them).

Nothing imports this package. ``inspector --help`` and argument errors answer without importing torch,
transformers or pandas: every command imports what it needs when it runs.
"""

from inspector.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
