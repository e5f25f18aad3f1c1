"""``python -m brmcp.directory``: the ``brmcpdir`` command (:mod:`.cli`)."""

from .cli import main

raise SystemExit(main())
