"""``python -m inspector``: the command line (the same as the ``inspector`` command)."""

import sys

from .cli import main

sys.exit(main())
