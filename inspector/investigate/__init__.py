"""The debug workflow: capture, rank, split, compare variants, ask whether the flagged heads matter, report.

* :mod:`~inspector.investigate.debug`: :func:`investigate`, :func:`compare_captures`, the demo's texts;
* :mod:`~inspector.investigate.matter`: the "Does it matter?" part (effects, patches, report section);
* :mod:`~inspector.investigate.verdict`: the verdict of a run (culprits, signatures, why), written as CSV/JSON;
* :mod:`~inspector.investigate.wherefrom`: "Where did the word come from?" (attribution, route, heads on it);
* :mod:`~inspector.investigate.evaluation`: the verdict over an evaluation set (``scan`` with a contrast per document);
* :mod:`~inspector.investigate.story`: the summariser demo's story (variants, opening and closing lines);
* :mod:`~inspector.investigate.reproduce`: the commands that reproduce a run, as data (:class:`Command`), and
  the Python API's plain format of them (the command line spells them with its parser);
* :mod:`~inspector.investigate.defaults`: the investigation's defaults, torch-free for the command line.

Offers functions only; the command line over them is :mod:`inspector.cli`.
"""
