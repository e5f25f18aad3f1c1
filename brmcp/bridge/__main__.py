"""``python -m brmcp.bridge`` runs the ``brmcp-bridge`` command."""

import sys

from .cli import main

sys.exit(main())
