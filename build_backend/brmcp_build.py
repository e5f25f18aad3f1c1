"""brmcp's PEP 517 build backend: setuptools, after a Python version check.

pip installs a local checkout (``pip install .``) without first comparing
the interpreter with ``requires-python``; on Python 3.10 it then fails while
resolving a dependency, with a message that never names the real cause. This
backend runs first in every build, so the user sees one clear line instead.
"""

from __future__ import annotations

import sys

#: The oldest Python brmcp supports (pyproject.toml ``requires-python``).
MINIMUM = (3, 11)

if sys.version_info < MINIMUM:
    _found = ".".join(str(part) for part in sys.version_info[:3])
    raise SystemExit(
        f"brmcp requires Python >= {MINIMUM[0]}.{MINIMUM[1]}; this is Python {_found} ({sys.executable}). "
        "Create the virtual environment with a newer interpreter, e.g. python3.11 -m venv .venv"
    )

from setuptools.build_meta import *  # noqa: E402, F403
from setuptools.build_meta import __all__  # noqa: E402, F401
