"""The debug workflow: capture, rank, split, compare variants, ask whether the flagged heads matter, report.

* :mod:`~inspector.investigate.debug`: :func:`investigate`, :func:`compare_captures`, the demo's texts;
* :mod:`~inspector.investigate.matter`: the "Does it matter?" part (effects, patches, report section).

Offers functions only; the command line over them is :mod:`inspector.cli`.
"""
