"""``python -m kdsl.cli``: the same entry point as the ``kdsl`` command."""

import sys

from kdsl.cli import main

sys.exit(main())
