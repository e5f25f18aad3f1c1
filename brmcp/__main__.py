"""``python -m brmcp``: the ``brmcp`` command."""

import sys

from .cli import main

sys.exit(main())
