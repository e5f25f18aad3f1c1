"""``python -m brmcp.bridge`` runs the ``brmcp-bridge`` command."""

import sys

from brmcp.bridge.cli import main

sys.exit(main())
