"""brmcp-serve's ``directory`` block (brmcp/serve/config.py, brmcp/serve/app.py;
README §List your bot; karamble/brmcp, ``cmd/brmcp-serve/main.go``): the Go
reference's keys parsed and validated with one-line errors, the directories
it names admitted as callers, and a served bot (the example tools, and a
gateway) registering with a fake directory on the in-memory fabric."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession

from brmcp import ManualClock
from brmcp.clientrpc import BotConfig
from brmcp.directory.model import STATE_PENDING_REVIEW, TestSpec
from brmcp.directory.provider import FUND_FILE, AutoFund, RegistrantConfig
from brmcp.gateway import UpstreamConfig
from brmcp.serve import ServeApp, ServeConfig, ServeConfigError, load_serve_config
from brmcp.serve.app import GATEWAY_NAME
from brmcp.testing import Fabric, uid
from brmcp.testing.fakebr.certs import ensure_brclient_certs
from tests.directory.test_registrant import PROVIDER, FakeDirectory
from tests.kit import until

DIRECTORY = uid(41)
FUNDING_ONLY = uid(43)
CALLER = uid(44)
STRANGER = uid(45)

BLOCK: dict[str, Any] = {
    "description": "fortunes and echoes",
    "tags": ["fun", "demo"],
    "test": {"tool": "fortune", "args": {}, "maxAtoms": 10_000},
    "auto_fund": {
        "enabled": True,
        "max_atoms_per_request": 20_000,
        "max_atoms_per_month": 100_000,
        "allowed_directory_uids": [DIRECTORY, FUNDING_ONLY],
    },
    "register_at_uids": [DIRECTORY.upper()],
}


def brmcp_json(**directory: Any) -> str:
    return json.dumps({"allowed_uids": [CALLER], "directory": {**BLOCK, **directory}})


# -- parsing ---------------------------------------------------------------------------------


def test_the_block_parses_with_the_go_keys() -> None:
    cfg = ServeConfig.parse(brmcp_json())
    assert cfg.directory == RegistrantConfig(
        description="fortunes and echoes",
        tags=("fun", "demo"),
        test=TestSpec(tool="fortune", max_atoms=10_000),  # empty args are omitted, as in Go
        auto_fund=AutoFund(True, 20_000, 100_000, (DIRECTORY, FUNDING_ONLY)),
        register_at_uids=(DIRECTORY,),
    )
    assert cfg.allowed_uids == (CALLER,)
    assert cfg.directory_uids == (DIRECTORY, FUNDING_ONLY)
    # Keys match case-insensitively, as Go's decoder does; the file round-trips.
    folded = json.dumps({"Directory": {k.upper(): v for k, v in BLOCK.items()}})
    assert ServeConfig.parse(folded).directory == cfg.directory
    assert ServeConfig.parse(cfg.to_json()) == cfg


def test_no_block_null_block_and_empty_block(caplog: pytest.LogCaptureFixture) -> None:
    assert ServeConfig.parse('{"allowed_uids": []}').directory is None
    assert ServeConfig.parse('{"directory": null}').directory is None
    with caplog.at_level(logging.INFO, logger="brmcp.serve"):
        assert ServeConfig.parse('{"directory": {}}', source="f.json").directory is None
    assert caplog.messages == [
        "f.json: the directory block is empty: this bot is not listed in any directory"
    ]


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"description": " "}, 'f.json: directory.description: " " is not allowed: use a non-empty string'),
        (
            {"description": "x" * 1025},
            "f.json: directory.description: 1025 bytes is too long: use at most 1024",
        ),
        ({"tags": "fun"}, 'f.json: directory.tags: "fun" is not allowed: use a list of at most 16 strings'),
        ({"tags": ["x" * 33]}, "f.json: directory.tags[0]: "),
        (
            {"test": {"args": {}, "maxAtoms": 5}},
            "f.json: directory.test.tool: null is not allowed: name the paid",
        ),
        (
            {"test": {"tool": "t", "args": [1], "maxAtoms": 5}},
            "f.json: directory.test.args: [1] is not allowed",
        ),
        (
            {"test": {"tool": "t", "maxAtoms": 0}},
            "f.json: directory.test.maxAtoms: 0 is not allowed: use the most",
        ),
        ({"test": {"tool": "t", "maxAtoms": 1.5}}, "f.json: directory.test.maxAtoms: 1.5 is not allowed"),
        (
            {"register_at_uids": ["dir"]},
            'f.json: directory.register_at_uids[0]: "dir" is not a Bison Relay uid',
        ),
        (
            {"auto_fund": {"enabled": True, "max_atoms_per_request": 1}},
            "f.json: directory.auto_fund.max_atoms_per_month: 0 is not allowed while enabled is true",
        ),
        (
            {"auto_fund": {"max_atoms_per_request": "all"}},
            'f.json: directory.auto_fund.max_atoms_per_request: "all" is not allowed: use a whole number',
        ),
        ({"auto_fund": [True]}, "f.json: directory.auto_fund: [true] is not allowed: use a JSON object"),
    ],
)
def test_a_bad_block_is_one_line_naming_file_key_and_value(block: dict[str, Any], message: str) -> None:
    with pytest.raises(ServeConfigError) as info:
        ServeConfig.parse(brmcp_json(**block), source="f.json")
    text = str(info.value)
    assert text.startswith(message), text
    assert "\n" not in text


def test_a_block_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(
        ServeConfigError, match=r'^f\.json: directory: "yes" is not allowed: use a JSON object$'
    ):
        ServeConfig.parse('{"directory": "yes"}', source="f.json")


def test_an_unknown_key_in_the_block_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        ServeConfig.parse(brmcp_json(register_at=[DIRECTORY]), source="f.json")
    assert any('f.json: directory: unknown key "register_at" ignored' in m for m in caplog.messages)


# -- a served bot ----------------------------------------------------------------------------


class DirectoryPayer:
    """Pays the fake directory as a confirmed tip would credit it."""

    def __init__(self, directory: FakeDirectory) -> None:
        self.directory = directory
        self.payments: list[tuple[str, int]] = []

    async def pay(self, payee_uid: str, atoms: int) -> None:
        self.payments.append((payee_uid, atoms))
        self.directory.credit(atoms)


def make_app(
    tmp_path: Path, text: str, payer: DirectoryPayer, *, upstream: UpstreamConfig | None = None
) -> ServeApp:
    certs = ensure_brclient_certs(tmp_path / "brclient")
    datadir = tmp_path / "serve"
    datadir.mkdir(mode=0o700)
    bot_config = BotConfig.defaults(datadir, "brmcp-serve")
    bot_config.servercertpath = str(certs.server_cert)
    bot_config.clientcertpath = str(certs.client_cert)
    bot_config.clientkeypath = str(certs.client_key)
    (datadir / "brmcp.json").write_text(text)
    return ServeApp(
        datadir,
        bot_config,
        load_serve_config(datadir / "brmcp.json"),
        upstream=upstream,
        directory_payer=payer,
    )


@asynccontextmanager
async def served(app: ServeApp, directory: FakeDirectory) -> AsyncIterator[Fabric]:
    """The app's harness at PROVIDER and the fake directory on one fabric,
    the registrant started as brmcp-serve starts it."""
    async with Fabric() as fabric, app.harness, directory.harness:
        # Routers are started before the task group: the harnesses own them.
        router = await app.harness.start(fabric.sender(PROVIDER))
        fabric.attach(PROVIDER, router.handle_pm)
        directory_router = await directory.harness.start(fabric.sender(DIRECTORY))
        fabric.attach(DIRECTORY, directory_router.handle_pm)
        async with anyio.create_task_group() as tg:
            with anyio.fail_after(30):
                assert await app.start_registrant(router, tg)
                yield fabric
            tg.cancel_scope.cancel()


async def tool_names(fabric: Fabric, peer: str) -> list[str]:
    async with fabric.router(peer) as router:
        conn = router.dial(PROVIDER)
        async with ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=10) as session:
            await session.initialize()
            return [tool.name for tool in (await session.list_tools()).tools]


async def test_a_served_bot_registers_and_admits_its_directories(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = FakeDirectory(ManualClock(), tmp_path / "directory")
    payer = DirectoryPayer(directory)
    with caplog.at_level(logging.INFO, logger="brmcp.serve"):
        app = make_app(tmp_path, brmcp_json(), payer)
    admitting = [m for m in caplog.messages if "admitting the directories" in m]
    assert admitting == [
        f"{app.config_path}: admitting the directories of the directory block as callers (they crawl and "
        f"test-call this bot): {DIRECTORY}, {FUNDING_ONLY}"
    ]
    assert app.registrant is not None
    for peer in (CALLER, DIRECTORY, FUNDING_ONLY):
        assert app.harness.allowed(peer)
    assert not app.harness.allowed(STRANGER)
    async with served(app, directory) as fabric:
        # Registered at start: the invoice paid, exactly, by the bot's payer.
        await until(lambda: directory.state == STATE_PENDING_REVIEW)
        assert payer.payments == [(DIRECTORY, 1_000 + 10_000)]
        assert [r.description for r in directory.registrations] == ["fortunes and echoes"]
        history = json.loads((app.datadir / FUND_FILE).read_text())
        assert [(e["directoryUid"], e["atoms"]) for e in history] == [(DIRECTORY, 11_000)]
        # The directory can crawl the bot: the example tools and listing_invite.
        assert await tool_names(fabric, DIRECTORY) == ["echo", "fortune", "listing_invite"]
    # A reload that drops every caller keeps the directories admitted.
    (app.datadir / "brmcp.json").write_text(json.dumps({"allowed_uids": [], "directory": BLOCK}))
    app.reload()
    assert app.harness.allowed(DIRECTORY)
    assert not app.harness.allowed(CALLER)


async def test_a_gateway_bot_registers_too(tmp_path: Path) -> None:
    directory = FakeDirectory(ManualClock(), tmp_path / "directory")
    payer = DirectoryPayer(directory)
    upstream = UpstreamConfig(command=(sys.executable, "-c", "pass"))
    app = make_app(tmp_path, brmcp_json(), payer, upstream=upstream)
    assert app.gateway is not None
    assert app.harness.config.name == GATEWAY_NAME
    assert [spec.name for spec in app.harness.tools()] == ["listing_invite"]
    async with served(app, directory):
        await until(lambda: directory.state == STATE_PENDING_REVIEW)
        assert payer.payments == [(DIRECTORY, 11_000)]


def test_without_a_block_there_is_no_registrant(tmp_path: Path) -> None:
    directory = FakeDirectory(ManualClock(), tmp_path / "directory")
    app = make_app(tmp_path, json.dumps({"allowed_uids": [CALLER]}), DirectoryPayer(directory))
    assert app.registrant is None
    assert app.directory_payer is None
    assert [spec.name for spec in app.harness.tools()] == ["echo", "fortune"]
    assert app.harness.allowed(CALLER)
    assert not app.harness.allowed(DIRECTORY)


async def test_an_unreadable_fund_history_disables_the_registrant(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = FakeDirectory(ManualClock(), tmp_path / "directory")
    app = make_app(tmp_path, brmcp_json(), DirectoryPayer(directory))
    (app.datadir / FUND_FILE).write_text("[{")
    async with Fabric() as fabric, app.harness:
        router = await app.harness.start(fabric.sender(PROVIDER))
        async with anyio.create_task_group() as tg:
            with caplog.at_level(logging.ERROR, logger="brmcp.serve"):
                assert not await app.start_registrant(router, tg)
        assert any(m.startswith("directory registrant disabled: ") for m in caplog.messages)
        assert directory.registrations == []
