"""Signed directory snapshots across implementations (karamble/brmcp,
``directory/snapshot.go``; ``brmcp-goref snapshot sign|verify``).

The reference signs with the key in ``snapshotkey.json`` and carries the
signed bytes as base64 in ``payload``; its verifier checks, in order, the
trusted key, the signer key, the signature, then the payload's version.
Where ``brmcp.directory.model._snapshot`` is installed, our verifier accepts the
reference's snapshots, the reference accepts ours, the key files move
between the two unchanged and the payload bytes are identical.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .godir import ADMIN, PROVIDER

pytestmark = pytest.mark.interop

GENERATED_AT = 1_800_000_000
CATALOG = [{"_meta": {"brmcp/priceAtoms": 5000}, "description": "a <b> & c", "name": "test"}]
LISTINGS: list[dict[str, Any]] = [
    # Out of uid order on purpose: the signer keeps the given order, the
    # directory sorts before it signs.
    {
        "uid": ADMIN,
        "description": "first",
        "catalog": CATALOG,
        "catalogCheckedAt": 1,
        "lastVerifiedExecution": 2,
        "expiresAt": 3,
    },
    {
        "uid": PROVIDER,
        "description": "ünïcode <tags> & more",
        "tags": ["x", "y"],
        "catalog": [],
        "catalogCheckedAt": 4,
        "lastVerifiedExecution": 5,
        "expiresAt": 6,
    },
]


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _go_compact(value: Any) -> str:
    """Compact JSON as Go's ``json.Marshal`` writes it: ``<``, ``>``, ``&``,
    U+2028 and U+2029 escaped (the form a catalog the reference crawled is
    stored in)."""
    text = _compact(value)
    for char in "<>&\u2028\u2029":
        text = text.replace(char, f"\\u{ord(char):04x}")
    return text


async def go_sign(binary: Path, key: Path, data: bytes, *, raw: bool = False) -> dict[str, Any]:
    argv = [str(binary), "snapshot", "sign", "-key", str(key), "-generated-at", str(GENERATED_AT)]
    if raw:
        argv.append("-raw")
    done = await anyio.run_process(argv, input=data)
    signed: dict[str, Any] = json.loads(done.stdout)
    return signed


async def go_verify(binary: Path, signed: dict[str, Any] | str, pub: str) -> dict[str, Any]:
    text = signed if isinstance(signed, str) else _compact(signed)
    done = await anyio.run_process([str(binary), "snapshot", "verify", "-pub", pub], input=text.encode())
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def key_pub(key: Path) -> str:
    return str(json.loads(key.read_text())["pub"])


async def test_go_signs_and_verifies(tmp_path: Path, goref_binary: Path) -> None:
    key = tmp_path / "snapshotkey.json"
    signed = await go_sign(goref_binary, key, _compact(LISTINGS).encode())
    pub = key_pub(key)
    assert set(signed) == {"payload", "sig", "pub"}
    assert signed["pub"] == pub
    # The key file: two hex fields, the private half is seed then public key.
    fields = json.loads(key.read_text())
    assert set(fields) == {"pub", "priv"}
    assert len(bytes.fromhex(fields["priv"])) == 64
    assert fields["priv"][64:] == pub
    assert key.stat().st_mode & 0o777 == 0o600

    # The signed bytes, as the reference writes them: compact, HTML
    # characters escaped (also inside the catalog), non-ASCII kept as UTF-8.
    payload = base64.b64decode(signed["payload"], validate=True)
    assert (
        payload
        == (
            '{"v":1,"generatedAt":1800000000,"listings":['
            '{"uid":"' + ADMIN + '","description":"first","catalog":[{"_meta":{"brmcp/priceAtoms":5000},'
            '"description":"a \\u003cb\\u003e \\u0026 c","name":"test"}],'
            '"catalogCheckedAt":1,"lastVerifiedExecution":2,"expiresAt":3},'
            '{"uid":"'
            + PROVIDER
            + '","description":"ünïcode \\u003ctags\\u003e \\u0026 more","tags":["x","y"],'
            '"catalog":[],"catalogCheckedAt":4,"lastVerifiedExecution":5,"expiresAt":6}]}'
        ).encode()
    )
    # An independent check of the signature over those bytes.
    Ed25519PublicKey.from_public_bytes(bytes.fromhex(pub)).verify(bytes.fromhex(signed["sig"]), payload)

    good = await go_verify(goref_binary, signed, pub)
    assert good == {"ok": True, "snapshot": {"v": 1, "generatedAt": GENERATED_AT, "listings": LISTINGS}}

    # Each check, in the reference's order, with its message.
    other = tmp_path / "other.json"
    stranger = await go_sign(goref_binary, other, b"[]")
    tampered = {**signed, "payload": base64.b64encode(payload.replace(b"first", b"FIRST")).decode()}
    bad_sig = {**signed, "sig": "zz"}
    wrong_sig = {**signed, "sig": stranger["sig"]}
    assert await go_verify(goref_binary, signed, "") == {
        "ok": False,
        "error": "no trusted key for snapshot verification",
    }
    assert await go_verify(goref_binary, signed, key_pub(other)) == {
        "ok": False,
        "error": "snapshot signed by an unexpected key",
    }
    assert await go_verify(goref_binary, bad_sig, pub) == {
        "ok": False,
        "error": "snapshot signature malformed",
    }
    assert await go_verify(goref_binary, wrong_sig, pub) == {
        "ok": False,
        "error": "snapshot signature invalid",
    }
    assert await go_verify(goref_binary, tampered, pub) == {
        "ok": False,
        "error": "snapshot signature invalid",
    }
    v2 = await go_sign(goref_binary, key, b'{"v":2,"generatedAt":1,"listings":null}', raw=True)
    assert await go_verify(goref_binary, v2, pub) == {"ok": False, "error": "snapshot version 2 unsupported"}
    not_json = await go_sign(goref_binary, key, b"not json", raw=True)
    verdict = await go_verify(goref_binary, not_json, pub)
    assert verdict["ok"] is False
    assert verdict["error"].startswith("snapshot payload corrupt: ")
    # A payload that is not base64 fails while the signed snapshot decodes.
    verdict = await go_verify(goref_binary, {**signed, "payload": "***"}, pub)
    assert verdict["ok"] is False
    assert verdict["error"].startswith("decode: ")
    # No listings: the reference writes null.
    empty = await go_sign(goref_binary, key, b"[]")
    assert base64.b64decode(empty["payload"]) == b'{"v":1,"generatedAt":1800000000,"listings":null}'


async def test_python_and_go_snapshots_interoperate(tmp_path: Path, goref_binary: Path) -> None:
    snapshot = pytest.importorskip(
        "brmcp.directory.model._snapshot",
        reason="brmcp.directory.model._snapshot (the Python directory) is not installed",
    )
    go_key = tmp_path / "go" / "snapshotkey.json"
    go_key.parent.mkdir()
    ordered = sorted(LISTINGS, key=lambda item: item["uid"])
    go_signed = await go_sign(goref_binary, go_key, _compact(ordered).encode())
    pub = key_pub(go_key)

    # Ours verifies the reference's and reads its key file.
    decoded = snapshot.verify_snapshot(go_signed, pub)
    assert (decoded.version, decoded.generated_at) == (1, GENERATED_AT)
    assert list(decoded.listings) == ordered
    with pytest.raises(snapshot.SnapshotError, match="snapshot signature invalid"):
        snapshot.verify_snapshot({**go_signed, "sig": "00" * 64}, pub)
    signer = snapshot.Signer.load_or_create(go_key)
    assert signer.public_hex == pub

    # The same listings give the same bytes, so the same signature (the
    # catalog text is carried as is, here in the form the reference stores).
    ours = [
        snapshot.SnapshotListing(
            uid=item["uid"],
            description=item["description"],
            catalog=_go_compact(item["catalog"]),
            tags=tuple(item.get("tags", ())),
            catalog_checked_at=item["catalogCheckedAt"],
            last_verified_execution=item["lastVerifiedExecution"],
            expires_at=item["expiresAt"],
        )
        for item in LISTINGS
    ]
    py_signed = signer.build_snapshot(ours, GENERATED_AT)
    assert py_signed == go_signed

    # The reference verifies ours, made with a key file we created.
    py_key = tmp_path / "py" / "snapshotkey.json"
    py_signer = snapshot.Signer.load_or_create(py_key)
    mine = py_signer.build_snapshot(ours, GENERATED_AT)
    verdict = await go_verify(goref_binary, mine, py_signer.public_hex)
    assert verdict == {"ok": True, "snapshot": {"v": 1, "generatedAt": GENERATED_AT, "listings": ordered}}
    assert (await go_verify(goref_binary, mine, pub))["error"] == "snapshot signed by an unexpected key"
    # And the reference signs with our key file.
    again = await go_sign(goref_binary, py_key, _compact(ordered).encode())
    assert again == mine
