"""``python -m brmcp.serve`` runs the ``brmcp-serve`` command."""

import sys

from .cli import main

sys.exit(main())
