"""The command line (``inspector ...``, ``python -m inspector ...``): the top stage, a thin layer over the API.

* :mod:`~inspector.cli.parser`: the parser (each command's builder, in ``--help``'s order) and ``main``;
* :mod:`~inspector.cli.arguments`: argument types, the one-line-error parser and the options commands share;
* :mod:`~inspector.cli.files`: text arguments read, a command's outputs and inputs checked before anything runs;
* :mod:`~inspector.cli.words`: checks of words and capture headers before torch loads;
* :mod:`~inspector.cli.loading`: the model ``--model`` names, its config checked and the model loaded;
* :mod:`~inspector.cli.printing`: tables and lines fitted to the terminal; :mod:`~inspector.cli.signals`: the one
  signal handler of every command; :mod:`~inspector.cli.serve`: ``inspector app``'s server;
* :mod:`~inspector.cli.commands`: the capture, analysis, intervention and corpus commands;
* :mod:`~inspector.cli.investigate`: ``debug``, ``compare`` and ``demo``;
* :mod:`~inspector.cli.routes`: ``attribute`` and ``routes``; :mod:`~inspector.cli.why`: ``why``;
* :mod:`~inspector.cli.sources`: ``sources`` (ContextCite);
* :mod:`~inspector.cli.evaluate`: ``scan``'s contrast per document and ``corpus``'s views of an evaluation scan;
* :mod:`~inspector.cli.reproduce`: the reproduce commands of ``debug`` and ``demo`` as shell lines, spelt by the
  parser (a renamed flag renames them).

Nothing imports this package. ``inspector --help`` and argument errors answer without importing torch,
transformers or pandas: every command imports what it needs when it runs.
"""

from inspector.cli.parser import build_parser, main

__all__ = ["build_parser", "main"]
