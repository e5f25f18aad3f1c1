"""An unexpected exception in a tool never reaches the peer as text (WIRE.md
§Errors): the peer gets ``internal error in tool <name>; the operator's log
has the details (ref <8 hex>)``, the log one line with the same ref and the
traceback; a deliberate ``ValueError``/``ToolRefusal`` keeps its own text,
and a paid call that fails either way is refunded."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from brmcp.protocol.payment import BALANCE_ATOMS_KEY, REFUNDED_ATOMS_KEY
from brmcp.server import CallContext, Harness, HarnessConfig, ToolRefusal
from tests.kit.harness import ALICE

_INTERNAL = re.compile(
    r"internal error in tool (\w+); the operator's log has the details \(ref ([0-9a-f]{8})\)"
)


def _text(result: Any) -> str:
    return str(result.content[0].text)


async def _call(harness: Harness, name: str) -> Any:
    spec = next(t for t in harness.tools() if t.name == name)
    return await harness.call(ALICE, spec, {}, {}, None)


async def test_an_unexpected_exception_is_a_short_error_with_a_logged_ref(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}))

    @harness.tool(price_atoms=100)
    async def leaky(ctx: CallContext) -> dict[str, Any]:
        raise RuntimeError("secret /path detail")

    @harness.tool(price_atoms=100)
    async def refusing(ctx: CallContext) -> dict[str, Any]:
        raise ToolRefusal("no such widget")

    @harness.tool()
    async def plain(ctx: CallContext) -> dict[str, Any]:
        raise ValueError("limit must be 1..50")

    async with harness:
        await harness.credit(ALICE, 1000)
        with caplog.at_level(logging.ERROR, logger="brmcp.server"):
            failed = await _call(harness, "leaky")
        assert failed.is_error
        match = _INTERNAL.fullmatch(_text(failed))
        assert match is not None, _text(failed)
        assert match.group(1) == "leaky"
        assert "secret" not in failed.model_dump_json()
        # The refund rule is unchanged: the paid call that failed is refunded.
        assert failed.meta == {REFUNDED_ATOMS_KEY: 100, BALANCE_ATOMS_KEY: 1000}
        logged = [r for r in caplog.records if match.group(2) in r.getMessage()]
        assert len(logged) == 1
        assert logged[0].exc_info is not None
        assert "secret /path detail" in str(logged[0].exc_info[1])

        refused = await _call(harness, "refusing")
        assert _text(refused) == "no such widget"
        assert refused.meta == {REFUNDED_ATOMS_KEY: 100, BALANCE_ATOMS_KEY: 1000}
        assert _text(await _call(harness, "plain")) == "limit must be 1..50"


async def test_python_s_own_value_errors_count_as_unexpected(tmp_path: Path) -> None:
    harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}))

    @harness.tool()
    async def decode(ctx: CallContext) -> dict[str, Any]:
        "\ud800".encode()
        return {}

    async with harness:
        failed = await _call(harness, "decode")
        assert _INTERNAL.fullmatch(_text(failed)) is not None, _text(failed)
        assert "surrogates" not in _text(failed)
