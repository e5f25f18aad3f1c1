"""Ed25519 key files in the Go reference's format (karamble/brmcp,
``directory/snapshot.go``): ``{"pub": hex 32 bytes, "priv": hex 64 bytes
(seed then public key)}``, two-space indent, mode 0600 in a 0700 directory,
so a key file moves between a Go and a Python process unchanged. Used for
the directory's snapshot key and a bot's receipt key."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from . import gojson

__all__ = ["KeyFileError", "load_or_create_key", "public_hex"]


class KeyFileError(ValueError):
    """A key file that cannot be read or is not the format above; the
    message names the file and what is wrong."""


def public_hex(private: Ed25519PrivateKey) -> str:
    """The raw 32-byte public key of ``private``, as 64 lowercase hex characters."""
    return private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def load_or_create_key(path: str | os.PathLike[str], what: str) -> Ed25519PrivateKey:
    """The key in the file at ``path`` or, when the file does not exist, a
    new key written there (to a temporary name, fsynced, renamed into place).
    ``what`` names the key in errors (e.g. ``"snapshot key"``). Raises
    :class:`KeyFileError` for an unreadable file, a file not in the format
    above, or halves that disagree."""
    where = Path(path)
    try:
        raw = where.read_bytes()
    except FileNotFoundError:
        private = Ed25519PrivateKey.generate()
        _write(where, private)
        return private
    except OSError as exc:
        raise KeyFileError(f"{where}: cannot read the {what}: {exc.strerror or exc}") from None
    return _parse(where, raw, what)


def _parse(where: Path, raw: bytes, what: str) -> Ed25519PrivateKey:
    try:
        fields = gojson.decode_struct(gojson.loads(raw), {"pub": "string", "priv": "string"}, struct=what)
    except gojson.GoJSONError as exc:
        raise KeyFileError(f"{where}: {what} file corrupt: {exc}") from None
    try:
        pub = bytes.fromhex(fields.get("pub", ""))
        priv = bytes.fromhex(fields.get("priv", ""))
    except ValueError:
        raise KeyFileError(f'{where}: "pub" and "priv" must be hex') from None
    if len(pub) != 32:
        raise KeyFileError(f'{where}: "pub" must be 32 bytes of hex, got {len(pub)} bytes')
    if len(priv) != 64:
        raise KeyFileError(f'{where}: "priv" must be 64 bytes of hex (seed, public key), got {len(priv)}')
    private = Ed25519PrivateKey.from_private_bytes(priv[:32])
    if public_hex(private) != pub.hex() or priv[32:] != pub:
        raise KeyFileError(f'{where}: "pub" does not match the key in "priv"')
    return private


def _write(where: Path, private: Ed25519PrivateKey) -> None:
    seed = private.private_bytes_raw()
    pub = bytes.fromhex(public_hex(private))
    text = gojson.dumps({"pub": pub.hex(), "priv": (seed + pub).hex()}, indent=True)
    where.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{where.name}.", dir=where.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, where)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
