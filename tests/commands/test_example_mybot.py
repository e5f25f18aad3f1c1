"""examples/serve/mybot.py, the short program a new operator copies: its
tools are listed with their prices, a paid call is refused until the caller
has credit and then charged once, and it uses only public names."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import mcp.types as types

from brmcp import parse_payment_required
from tests.kit.harness import ALICE, call, served
from tests.kit.paths import REPO

EXAMPLE = REPO / "examples" / "serve" / "mybot.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mybot", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_imports_only_public_names() -> None:
    tree = ast.parse(EXAMPLE.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("brmcp"):
            assert not any(part.startswith("_") for part in node.module.split(".")), node.module
            assert not any(alias.name.startswith("_") for alias in node.names), node.module


def test_the_example_explains_itself() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "--conf CONF" in done.stdout
    assert "--allow" in done.stdout


async def test_the_example_bot_sells_its_fortune(tmp_path: Path) -> None:
    harness = _load().build_harness(tmp_path, {ALICE})
    async with served(harness) as srv, srv.client(ALICE) as session:
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert {name: (tool.meta or {}).get("brmcp/priceAtoms") for name, tool in listed.items()} == {
            "hello": 0,
            "fortune": 10_000,
        }
        hello = await call(session, "hello")
        assert hello.structured_content == {"hello": ALICE[:8]}
        refused = await call(session, "fortune", key="k" * 32)
        found = parse_payment_required(refused)
        assert found is not None
        assert (found.price_atoms, found.balance_atoms) == (10_000, 0)
        await harness.credit(ALICE, 10_000)
        paid: types.CallToolResult = await call(session, "fortune", key="k" * 32)
        assert not paid.is_error
        assert isinstance((paid.structured_content or {}).get("fortune"), str)
        assert await harness.balance(ALICE) == 0
