"""Hypothesis against the bridge's HTTP app (SECURITY.md, BRIDGE.md
"Security model"): arbitrary methods, paths, headers and bodies never get a
500, never see the agent or admin token in a response unless they presented
the admin token, and never make the bridge send a PM to a bot without a
valid bearer token."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brmcp.bridge import Bridge, ManualClock
from brmcp.testing import Fabric
from tests.kit.bridge import (
    BOT,
    CLIENT,
    INIT,
    TOKEN,
    TestPayer,
    bridge_stack,
    build_harness,
    fixture_settings,
)


@dataclass
class _Recording:
    """A PMSender that forwards to the fabric and counts what it sent."""

    inner: Any
    sent: list[tuple[str, str]] = field(default_factory=list)

    async def send_pm(self, peer: str, text: str) -> None:
        self.sent.append((peer, text))
        await self.inner.send_pm(peer, text)


@dataclass
class _Env:
    bridge: Bridge
    sender: _Recording


@asynccontextmanager
async def _env(tmp: Path) -> Any:
    harness = build_harness(tmp / "bot", {})
    payer = TestPayer()
    payer.harness = harness
    fabric = Fabric()
    sender = _Recording(fabric.sender(CLIENT))
    async with bridge_stack(
        tmp,
        payer,
        bot=harness,
        settings=fixture_settings(),
        fabric=fabric,
        sender=sender,
        listen=None,
        clock=ManualClock(1_800_000_000),
    ) as built:
        yield _Env(built.bridge, sender)


@pytest.fixture(scope="module")
def portal_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BlockingPortal, _Env]]:
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(_env(tmp_path_factory.mktemp("fuzz"))) as env,
    ):
        yield portal, env


async def _request(
    app: Any, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes
) -> tuple[int, bytes]:
    """One request through the ASGI app; returns (status, headers and body as bytes).
    A response still streaming after 2 s is cut (the client goes away)."""
    sent: list[dict[str, Any]] = []
    delivered = False
    gone = anyio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode("utf-8", "surrogateescape"),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8891),
    }
    with anyio.move_on_after(2):
        await app(scope, receive, send)
    gone.set()
    start = next((m for m in sent if m["type"] == "http.response.start"), None)
    status = start["status"] if start else 0
    raw = b"".join(
        k + b": " + v + b"\n" for m in sent if m["type"] == "http.response.start" for k, v in m["headers"]
    )
    raw += b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, raw


_token_chars = st.text(alphabet="abcdefABCDEF0123456789-_.=", min_size=1, max_size=40)
_wrong_auth = st.one_of(
    _token_chars.map(lambda t: f"Bearer {t}"),
    st.sampled_from(
        [
            TOKEN,  # the bare token: the scheme is required
            f"Basic {TOKEN}",
            f"Bearer {TOKEN[:-1]}",
            f"Bearer {TOKEN}x",
            f"Bearer\t{TOKEN}",
            f"Bearer {TOKEN} ",
            f"Bearer {TOKEN.upper()}",
            "Bearer ",
            "",
        ]
    ),
    st.text(max_size=60),
)
_names = st.sampled_from(
    [
        "origin",
        "content-type",
        "content-length",
        "accept",
        "mcp-session-id",
        "mcp-protocol-version",
        "last-event-id",
        "transfer-encoding",
        "x-anything",
    ]
)
_values = st.one_of(
    st.sampled_from(
        [
            "127.0.0.1",
            "localhost:8891",
            "[::1]",
            "http://127.0.0.1",
            "application/json",
            "application/json, text/event-stream",
            "text/event-stream",
            "2025-11-25",
            "0",
            "-1",
            "99999999999999999999",
            "chunked",
        ]
    ),
    st.text(max_size=40),
)


def _encode(value: str) -> bytes:
    return value.encode("utf-8", "surrogateescape").replace(b"\r", b"").replace(b"\n", b"")


@st.composite
def _headers(draw: st.DrawFn, auth: st.SearchStrategy[str]) -> list[tuple[bytes, bytes]]:
    """Mostly well-formed MCP headers (so that requests get past the Host and
    content checks and exercise what lies behind them), sometimes not."""
    headers: list[tuple[bytes, bytes]] = []
    mostly = st.sampled_from([True, True, True, True, False])
    if draw(mostly):
        headers.append((b"host", draw(st.sampled_from([b"127.0.0.1:8891", b"localhost", b"[::1]:1"]))))
    elif draw(st.booleans()):
        headers.append((b"host", _encode(draw(_values))))  # hostile or missing Host
    if draw(mostly):
        headers.append((b"content-type", b"application/json"))
        headers.append((b"accept", b"application/json, text/event-stream"))
    for _ in range(draw(st.sampled_from([0, 0, 1, 2, 3]))):
        headers.append((_encode(draw(_names)), _encode(draw(_values))))
    for _ in range(draw(st.sampled_from([1, 1, 1, 0, 2]))):
        headers.append((draw(st.sampled_from([b"authorization", b"Authorization"])), _encode(draw(auth))))
    return headers


_paths = st.one_of(
    st.just(f"/mcp/{BOT}"),
    st.sampled_from(
        [
            f"/mcp/{BOT}",
            f"/mcp/{BOT.upper()}",
            f"/mcp/{BOT}/",
            "/mcp/",
            "/mcp",
            "/admin/settings",
            "/admin/spend",
            "/admin/approvals",
            "/admin/config-snippet/" + BOT,
            "/",
            "//mcp/" + BOT,
            "/mcp/../admin/settings",
        ]
    ),
    st.text(max_size=50).map(lambda t: "/" + t),
)
_methods = st.one_of(
    st.just("POST"),
    st.sampled_from(["GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS", "HEAD"]),
    st.text(max_size=10),
)
_json_bodies = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
_bodies = st.one_of(
    st.just(json.dumps(INIT).encode()),
    st.binary(max_size=200),
    _json_bodies.map(lambda v: json.dumps(v).encode()),
    st.sampled_from(
        [
            json.dumps(INIT).encode(),
            json.dumps([INIT, INIT]).encode(),
            b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"paid","arguments":{}}}',
            b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
            b"[" * 5000,
            b"",
        ]
    ),
)


_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@_SETTINGS
@given(method=_methods, path=_paths, headers=_headers(_wrong_auth), body=_bodies)
def test_without_a_valid_bearer_nothing_reaches_a_bot(
    portal_env: tuple[BlockingPortal, _Env],
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
) -> None:
    portal, env = portal_env
    status, raw = portal.call(_request, env.bridge.asgi_app, method, path, headers, body)
    assert status != 500
    assert TOKEN.encode() not in raw
    assert env.bridge.admin_token.encode() not in raw
    assert env.sender.sent == []  # no PM ever left the bridge


_any_auth = st.one_of(st.just(f"Bearer {TOKEN}"), st.just(f"bearer {TOKEN}"), _wrong_auth)


@_SETTINGS
@given(method=_methods, path=_paths, headers=_headers(_any_auth), body=_bodies)
def test_with_or_without_a_valid_bearer_no_500_and_no_token_leak(
    portal_env: tuple[BlockingPortal, _Env],
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
) -> None:
    portal, env = portal_env
    status, raw = portal.call(_request, env.bridge.asgi_app, method, path, headers, body)
    assert status != 500
    assert env.bridge.admin_token.encode() not in raw
    assert TOKEN.encode() not in raw
