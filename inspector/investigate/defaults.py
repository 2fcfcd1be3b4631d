"""Defaults of the investigation that the command line shows in ``--help`` or checks before torch loads (no imports:
``--help`` stays light)."""

# an investigation folder is inspector's only where this file, written last by the run (inspector.store.files
# .write_marker: the command, the version and the files written), says so; a folder without it is never replaced
MARKER = ".inspector.json"
REPORT = "report.html"  # the report; a folder holding one but no MARKER was written by an older version (or a user)
DEBUG_TOP = 4  # heads whose exact effect debug always computes (the top ones by attribution patching)
DEBUG_BUDGET = 4.0  # then every other head's, in attribution order, while the reruns stay within these forward passes
# an investigation's capture stores the attention weights while its longest query axis has at most this many tokens;
# past it the capture is lazy (Q/K/V and masks, the weights recomputed exactly on demand: inspector.store.capture_file)
FULL_CAPTURE_TOKENS = 256
# "Where did the word come from?" runs by default while the input (source and output) has at most this many tokens:
# its integrated gradients take 32 points or more, each a forward and a backward pass over the whole input (a
# BART-large shape at 500 tokens: about 1.9 forward-equivalents a point, so some 60 for the part against about 10 for
# the rest of debug); past it the part is left out with a note, and ``--where`` runs it on any length
WHERE_TOKENS = 256
