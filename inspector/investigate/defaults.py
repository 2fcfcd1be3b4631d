"""Defaults of the investigation that the command line shows in ``--help`` or checks before torch loads (no imports:
``--help`` stays light)."""

MARKER = "report.html"  # every investigation folder has one; a folder without it is not replaced
DEBUG_TOP = 24  # heads whose exact effect debug computes by default (the top ones by attribution patching)
