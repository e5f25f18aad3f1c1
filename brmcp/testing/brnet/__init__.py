"""brnet: a real Bison Relay network on loopback for tests, the demo and
benchmarks. :func:`brnet_binary` builds the Go command (``interop/brnet``, shipped in
the package as ``gosrc``) into a cache; :class:`BrNet` runs it (a real relay, real clients with real
clientrpc servers, KX'd (every pair, or the pairs chosen), brclientd-style
status servers for KX suggestions, tips through a simulated wallet or brclient's
no-wallet client). Pytest fixtures live in :mod:`brmcp.testing.brnet.fixtures`.
"""

from .build import (
    BrNetBuildError,
    BrNetUnavailable,
    GoNotFound,
    Progress,
    brnet_binary,
    brnet_cache_dir,
    brnet_source_dir,
    go_executable,
)
from .network import BrNet, BrNetError, BrNetUser, mediated_kx

__all__ = [
    "BrNet",
    "BrNetBuildError",
    "BrNetError",
    "BrNetUnavailable",
    "BrNetUser",
    "GoNotFound",
    "Progress",
    "brnet_binary",
    "brnet_cache_dir",
    "brnet_source_dir",
    "go_executable",
    "mediated_kx",
]
