"""Defaults of the investigation that the command line shows in ``--help`` or checks before torch loads (no imports:
``--help`` stays light)."""

# an investigation folder is inspector's only where this file, written last by the run (inspector.store.files
# .write_marker: the command, the version and the files written), says so; a folder without it is never replaced
MARKER = ".inspector.json"
REPORT = "report.html"  # the report; a folder holding one but no MARKER was written by an older version (or a user)
DEBUG_TOP = 24  # heads whose exact effect debug computes by default (the top ones by attribution patching)
