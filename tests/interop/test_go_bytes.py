"""Byte-for-byte agreement with the Go reference on what users and peers see:
the ``payment_required`` refusal, the tools/list ``_meta``, the first-run
``brmcp.json``/``brmcp-serve.conf`` of brmcp-serve, and the bridge's
``mcpclient.json``/``mcpspend.json`` after the same operations."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession

from brmcp.protocol.payment import REFUSAL_KEY
from brmcp.testing import Fabric
from brmcp.testing.goref import GoRefError, build_reference_command

from .live import BOT, CLIENT, FORTUNE_PRICE, Tap, agent, go_bridge, go_harness, py_bridge, py_harness

pytestmark = pytest.mark.interop


def _ordered(raw: bytes) -> Any:
    return json.loads(raw, object_pairs_hook=lambda pairs: dict(pairs))


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@asynccontextmanager
async def _direct(kind: str, tmp_path: Path, binary: Path) -> AsyncIterator[tuple[ClientSession, Tap]]:
    """An MCP client session over the fabric straight to a harness (no bridge)."""
    async with Fabric() as fabric:
        tap = Tap()
        fabric.add_tap(tap)
        cm: AbstractAsyncContextManager[Any] = (
            go_harness(fabric, binary, tmp_path / kind)
            if kind == "go"
            else py_harness(fabric, tmp_path / kind)
        )
        # A client without batches, as the Go bridge is: what it is answered
        # carries no transport mark (WIRE.md §Batches).
        async with cm, fabric.router(CLIENT, batch=False) as router:
            conn = router.dial(BOT)
            async with ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=30) as session:
                await session.initialize()
                yield session, tap


def _response(tap: Tap, method: str) -> tuple[bytes, dict[str, Any]]:
    """The raw payload of BOT's answer to the last ``method`` request."""
    requests = [m for m in tap.json(CLIENT, BOT) if m.get("method") == method]
    assert requests
    want = requests[-1]["id"]
    for payload, _ in tap.messages(BOT, CLIENT):
        message = _ordered(payload)
        if message.get("id") == want and "method" not in message:
            return payload, message
    raise AssertionError(f"no answer to {method}")


async def _refusal_and_listing(kind: str, tmp_path: Path, binary: Path) -> dict[str, Any]:
    async with _direct(kind, tmp_path, binary) as (session, tap):
        await session.list_tools()
        raw_list, listing = _response(tap, "tools/list")
        await session.call_tool("fortune", {})
        raw_call, refusal = _response(tap, "tools/call")
    metas = {t["name"]: t["_meta"] for t in listing["result"]["tools"]}
    return {"raw_list": raw_list, "metas": metas, "raw_call": raw_call, "refusal": refusal["result"]}


async def test_payment_required_and_meta_are_byte_identical(tmp_path: Path, goref_binary: Path) -> None:
    go = await _refusal_and_listing("go", tmp_path, goref_binary)
    py = await _refusal_and_listing("py", tmp_path, goref_binary)

    go_text = go["refusal"]["content"][0]["text"]
    py_text = py["refusal"]["content"][0]["text"]
    assert py_text == go_text
    assert go_text == (
        '{"error":"payment_required","tool":"fortune","priceAtoms":10000,"balanceAtoms":0,'
        '"shortfallAtoms":10000,"acceptedRails":["tip"]}'
    )
    # The whole result: the same members and values (our SDK orders a content
    # block's keys "text","type" where Go writes "type","text"; docs/interop.md),
    # plus our genuine-refusal mark in _meta (WIRE.md §Payments), which Go ignores.
    ours = dict(py["refusal"])
    assert ours.pop("_meta") == {REFUSAL_KEY: True}
    assert ours == go["refusal"]
    assert set(go["refusal"]) == {"content", "isError"}

    # go-sdk lists tools sorted by name; ours keep registration order (docs/interop.md).
    assert list(go["metas"]) == ["blob", "dyn", "echo", "fortune"]
    assert sorted(py["metas"]) == list(go["metas"])
    for name, meta in go["metas"].items():
        encoded = _compact(meta)
        assert _compact(py["metas"][name]) == encoded, name
        # On the wire, byte for byte, in both payloads.
        assert b'"_meta":' + encoded.encode() in go["raw_list"]
        assert b'"_meta":' + encoded.encode() in py["raw_list"]
    assert go["metas"]["fortune"] == {"brmcp/priceAtoms": FORTUNE_PRICE}


def _first_run_go(binary: Path, datadir: Path, home: Path) -> None:
    env = {**os.environ, "HOME": str(home)}
    proc = subprocess.Popen(
        [str(binary), "-datadir", str(datadir)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while not ((datadir / "brmcp.json").is_file() and (datadir / "brmcp-serve.conf").is_file()):
            assert time.monotonic() < deadline, "the reference brmcp-serve wrote no first-run files"
            assert proc.poll() is None, "the reference brmcp-serve exited"
            time.sleep(0.05)
        time.sleep(0.2)  # let both writes finish
    finally:
        proc.terminate()
        proc.wait(timeout=10)


_CREDENTIALS = re.compile(r"^(rpcuser|rpcpass)=(.*)$", re.MULTILINE)


def test_first_run_files_match_the_reference(tmp_path: Path, goref_binary: Path) -> None:
    try:
        serve = build_reference_command("cmd/brmcp-serve")
    except GoRefError as exc:  # pragma: no cover - the harness build succeeded, so this should too
        pytest.fail(str(exc))
    home = tmp_path / "home"
    home.mkdir()
    datadir = tmp_path / "data"  # the same path for both runs: the conf records it
    _first_run_go(serve, datadir, home)
    go_files = {name: (datadir / name).read_bytes() for name in ("brmcp.json", "brmcp-serve.conf")}
    go_modes = {name: (datadir / name).stat().st_mode & 0o777 for name in go_files}
    for name in go_files:
        (datadir / name).unlink()

    env = {**os.environ, "HOME": str(home)}
    proc = subprocess.run(
        [sys.executable, "-m", "brmcp.serve", "--datadir", str(datadir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    py_files = {name: (datadir / name).read_bytes() for name in go_files}
    py_modes = {name: (datadir / name).stat().st_mode & 0o777 for name in go_files}

    assert py_files["brmcp.json"] == go_files["brmcp.json"]
    go_creds = dict(_CREDENTIALS.findall(go_files["brmcp-serve.conf"].decode()))
    py_creds = dict(_CREDENTIALS.findall(py_files["brmcp-serve.conf"].decode()))
    # Fresh random credentials on each run; the same shape.
    assert (
        {k: len(v) for k, v in py_creds.items()}
        == {k: len(v) for k, v in go_creds.items()}
        == {
            "rpcuser": 8,
            "rpcpass": 16,
        }
    )
    assert all(re.fullmatch(r"[0-9a-f]+", v) for v in (*go_creds.values(), *py_creds.values()))

    def masked(raw: bytes) -> str:
        return _CREDENTIALS.sub(r"\1=<random>", raw.decode())

    assert masked(py_files["brmcp-serve.conf"]) == masked(go_files["brmcp-serve.conf"])
    assert py_modes == go_modes == {"brmcp.json": 0o600, "brmcp-serve.conf": 0o600}


async def _bridge_run(kind: str, tmp_path: Path, binary: Path) -> dict[str, bytes]:
    """The same operations through one bridge: list, echo, buy a fortune,
    buy dyn twice; return its data files."""
    root = tmp_path / f"bridge-{kind}"
    async with Fabric() as fabric:
        # Each bridge talks to the other implementation's harness.
        harness_cm: AbstractAsyncContextManager[Any] = (
            py_harness(fabric, root / "bot") if kind == "go" else go_harness(fabric, binary, root / "bot")
        )
        async with harness_cm as harness:
            bridge_cm: AbstractAsyncContextManager[Any] = (
                go_bridge(fabric, binary, root / "bridge", harness)
                if kind == "go"
                else py_bridge(fabric, root / "bridge", harness)
            )
            async with bridge_cm as bridge, agent(bridge.url) as s:
                await s.list_tools()
                assert not (await s.call_tool("echo", {"text": "x"})).is_error
                assert not (await s.call_tool("fortune", {})).is_error
                assert not (await s.call_tool("dyn", {"units": 2})).is_error
                assert not (await s.call_tool("dyn", {"units": 5})).is_error
                assert len(bridge.pays) == 3
                data_dir = bridge.data_dir
    return {name: (data_dir / name).read_bytes() for name in ("mcpclient.json", "mcpspend.json")}


async def test_bridge_files_match_after_the_same_operations(tmp_path: Path, goref_binary: Path) -> None:
    go = await _bridge_run("go", tmp_path, goref_binary)
    py = await _bridge_run("py", tmp_path, goref_binary)
    assert py["mcpclient.json"] == go["mcpclient.json"]
    # Our entries may also carry callKey, argsHash and answered (keys after
    # Go's own, which the Go reference ignores when it reads the file); the
    # rest is byte-identical.
    ours = json.loads(py["mcpspend.json"])
    assert all(re.fullmatch(r"[0-9a-f]{32}", e["callKey"]) for e in ours if "callKey" in e)
    assert all(re.fullmatch(r"[0-9a-f]{64}", e["argsHash"]) for e in ours if "argsHash" in e)
    assert any("argsHash" in e for e in ours)
    ours_only = rb',\n    "(callKey|argsHash)": "[0-9a-f]+"|,\n    "answered": true'
    stripped = re.sub(ours_only, b"", py["mcpspend.json"])
    assert stripped == go["mcpspend.json"]
    spend = json.loads(go["mcpspend.json"])
    assert [(e["tool"], e["atoms"], e["status"]) for e in spend] == [
        ("fortune", FORTUNE_PRICE, "paid"),
        ("dyn", 500, "paid"),
        ("dyn", 1250, "paid"),
    ]
