"""What a person sees: data for the app's views, figures, the HTML report, terminal output.

* :mod:`~inspector.ui.views`: data for the app's views, text and error helpers;
* :mod:`~inspector.ui.show`: Altair figures for notebooks and ``inspector plot``, bertviz from a capture;
* :mod:`~inspector.ui.report` / :mod:`~inspector.ui.report_plots`: the self-contained HTML report and its charts;
* :mod:`~inspector.ui.terminal`: escaping for the terminal.

Imports the stages below it; nothing below imports it.
"""
