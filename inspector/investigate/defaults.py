"""Defaults of the investigation that the command line shows in ``--help`` (no imports: ``--help`` stays light)."""

DEBUG_TOP = 24  # heads whose exact effect debug computes by default (the top ones by attribution patching)
