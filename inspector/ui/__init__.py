"""What a person sees: data for the app's views, figures, the HTML report, terminal output.

* :mod:`~inspector.ui.views`: data for the app's views, text and error helpers (a package: labels, windows,
  frames, shading, bertviz, limits);
* :mod:`~inspector.ui.show`: Altair figures for notebooks and ``inspector plot``, bertviz from a capture;
* :mod:`~inspector.ui.report` / :mod:`~inspector.ui.report_plots`: the self-contained HTML report and its charts;
* :mod:`~inspector.ui.terminal`: escaping for the terminal and tables fitted to its width;
* :mod:`~inspector.ui.verdict_view`, :mod:`~inspector.ui.sources_view`: the app's Verdict and Sources pages' data;
* :mod:`~inspector.ui.routes_figure`: the route figure; :mod:`~inspector.ui.vega_text`: text carried as Vega data.

Imports the stages below it; nothing below imports it.
"""
