"""The admin surface's bearer token (BRIDGE.md §Admin surface): read from
``mcpadmin.token`` in the data directory, or minted and written there on the
first start."""

from __future__ import annotations

from pathlib import Path

from brmcp.bridge.base import ADMIN_TOKEN_FILE, BridgeError, mint_token, read_text, write_atomic

__all__ = ["load_admin_token"]


def load_admin_token(data_dir: Path) -> str:
    """The admin token of the bridge in ``data_dir`` (at least 16 characters,
    no whitespace), minting and writing it (atomically) when the file does
    not exist yet. Blocking. Raises :class:`BridgeError` naming the file when
    it cannot be read, is malformed or cannot be written."""
    path = data_dir / ADMIN_TOKEN_FILE
    try:
        text = read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise BridgeError(f"read {path}: {exc}") from None
    if text is not None:
        token = text.strip()
        if len(token) < 16 or any(ch.isspace() for ch in token):
            raise BridgeError(f"parse {path}: expected one token of at least 16 characters")
        return token
    token = mint_token()
    try:
        write_atomic(path, token + "\n")
    except OSError as exc:
        raise BridgeError(f"write {path}: {exc}") from None
    return token
