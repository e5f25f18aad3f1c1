"""The MCP-layer differences from the Go reference, pinned (docs/interop.md
"Differences and decisions"): where we match the reference the answers
must be identical; where we keep ours, both sides' answers are asserted
exactly so a change on either side shows up here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from brmcp.testing import Fabric
from brmcp.wire import encode, parse

from .live import BOT, CLIENT, go_harness, py_harness

pytestmark = pytest.mark.interop

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}


async def _session(kind: str, tmp_path: Path, binary: Path) -> dict[str, dict[int, bytes]]:
    """Raw JSON-RPC exchanges with one harness; returns the raw answers by
    sid and id."""
    answers: dict[str, dict[int, bytes]] = {}
    pending = {"n": 0}
    done = anyio.Event()

    def collect(_from: str, text: str) -> None:
        part = parse(text)
        assert part is not None
        assert part.total == 1
        answer = json.loads(part.chunk)
        if "id" not in answer:
            return  # a notification
        answers.setdefault(part.sid, {})[answer["id"]] = part.chunk
        pending["n"] -= 1
        if pending["n"] == 0:
            done.set()

    async with Fabric() as fabric:
        fabric.attach(CLIENT, collect)
        cm: Any = (
            go_harness(fabric, binary, tmp_path / kind)
            if kind == "go"
            else py_harness(fabric, tmp_path / kind)
        )
        async with cm:
            sender = fabric.sender(CLIENT)

            async def send(sid: str, message: dict[str, Any], expect: bool = True) -> None:
                nonlocal done
                if expect:
                    pending["n"] += 1
                    done = anyio.Event()
                for text in encode(json.dumps(message).encode(), sid=sid):
                    await sender.send_pm(BOT, text)
                if expect:
                    with anyio.fail_after(20):
                        await done.wait()

            await send("aa", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            await send("bb", INIT)
            await send("bb", {"jsonrpc": "2.0", "method": "notifications/initialized"}, expect=False)
            await send("bb", {"jsonrpc": "2.0", "id": 2, "method": "foo/bar"})
            await send(
                "bb",
                {
                    "jsonrpc": "2.0",
                    "id": 3,
                    "method": "tools/call",
                    "params": {"name": "echo", "arguments": {"text": "<a&b> é \u2028"}},
                },
            )
            await send("bb", {"jsonrpc": "2.0", "id": 4, "method": "tools/list"})
    return answers


@pytest.fixture(scope="module")
def exchanges(
    tmp_path_factory: pytest.TempPathFactory, goref_binary: Path
) -> dict[str, dict[str, dict[int, bytes]]]:
    tmp = tmp_path_factory.mktemp("mcp-layer")
    return {kind: anyio.run(_session, kind, tmp, goref_binary) for kind in ("go", "py")}


def _result(raw: bytes) -> Any:
    return json.loads(raw)["result"]


def test_example_tools_list_the_same_schemas_and_no_output_schema(exchanges: Any) -> None:
    go = {t["name"]: t for t in _result(exchanges["go"]["bb"][4])["tools"]}
    py = {t["name"]: t for t in _result(exchanges["py"]["bb"][4])["tools"]}
    for name in ("echo", "fortune"):
        assert py[name] == go[name], name
        assert "outputSchema" not in py[name]


def test_tool_text_escapes_html_characters_as_go_does(exchanges: Any) -> None:
    go = _result(exchanges["go"]["bb"][3])
    py = _result(exchanges["py"]["bb"][3])
    # The text content a user (or an LLM) reads is the same string.
    assert py["content"][0]["text"] == go["content"][0]["text"]
    assert go["content"][0]["text"] == '{"echo":"\\u003ca\\u0026b\\u003e é \\u2028"}'
    # structuredContent decodes to the same value; only the JSON-RPC bytes differ.
    assert py["structuredContent"] == go["structuredContent"] == {"echo": "<a&b> é \u2028"}
    assert b"\\u003c" in exchanges["go"]["bb"][3]
    assert b"<a&b>" in exchanges["py"]["bb"][3]


def test_success_results_differ_only_by_an_explicit_is_error_false(exchanges: Any) -> None:
    go = _result(exchanges["go"]["bb"][3])
    py = _result(exchanges["py"]["bb"][3])
    assert "isError" not in go
    assert py["isError"] is False
    assert {k: v for k, v in py.items() if k != "isError"} == go


def test_initialize_capabilities_kept_as_ours(exchanges: Any) -> None:
    go = _result(exchanges["go"]["bb"][1])
    py = _result(exchanges["py"]["bb"][1])
    assert go["capabilities"] == {"logging": {}, "tools": {"listChanged": True}}
    assert py["capabilities"] == {"tools": {"listChanged": False}}
    assert {k: v for k, v in py.items() if k != "capabilities"} == {
        k: v for k, v in go.items() if k != "capabilities"
    }


def test_unknown_method_and_pre_initialize_errors_kept_as_ours(exchanges: Any) -> None:
    go_unknown = json.loads(exchanges["go"]["bb"][2])["error"]
    py_unknown = json.loads(exchanges["py"]["bb"][2])["error"]
    assert go_unknown == {"code": 0, "message": 'JSON RPC not handled: "foo/bar" unsupported'}
    assert py_unknown["code"] == -32601
    assert py_unknown["message"] == "Method not found"
    go_early = json.loads(exchanges["go"]["aa"][1])["error"]
    py_early = json.loads(exchanges["py"]["aa"][1])["error"]
    assert go_early == {"code": 0, "message": 'method "tools/list" is invalid during session initialization'}
    # Both refuse: an error response, no result, and the session stays usable.
    assert py_early["code"] < 0
    assert "result" not in json.loads(exchanges["py"]["aa"][1])
