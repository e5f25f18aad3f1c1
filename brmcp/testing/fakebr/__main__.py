"""``python -m brmcp.testing.fakebr`` runs ``brmcp-fakebr``."""

import sys

from .cli import main

sys.exit(main())
