"""The README's ``brclient.conf`` lines, checked against bisonrelay's own
option names and against brnet's clients (which run with those settings)."""

from __future__ import annotations

import configparser
import re
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from brmcp.clientrpc import RPCError, load_bot_config
from brmcp.testing.brnet import BrNet
from tests.kit.paths import REPO

README = REPO / "README.md"
# brclient's options in these sections (brclient/config.go at the pinned bisonrelay).
BRCLIENT_OPTIONS = {
    "clientrpc": {
        "jsonrpclisten",
        "rpccertpath",
        "rpckeypath",
        "rpcclientcapath",
        "rpcissueclientcert",
        "rpcuser",
        "rpcpass",
        "rpcauthmode",
        "rpcallowremotesendtip",
        "rpcmaxremotesendtipamt",
    },
    "payment": {"wallettype", "network", "lnrpchost", "lntlscert", "lnmacaroonpath"},
}


def readme_conf() -> configparser.ConfigParser:
    text = README.read_text()
    block = re.search(r"<!-- brclient-conf -->\n```ini\n(.*?)```", text, re.S)
    assert block, "README lost its brclient.conf block"
    conf = configparser.ConfigParser()
    conf.read_string(block.group(1))
    return conf


def test_readme_conf_uses_brclients_option_names() -> None:
    conf = readme_conf()
    assert set(conf.sections()) == {"clientrpc", "payment"}
    for section in conf.sections():
        assert set(conf[section]) <= BRCLIENT_OPTIONS[section], section
    rpc = conf["clientrpc"]
    assert rpc["jsonrpclisten"] == "127.0.0.1:7676"
    assert [Path(rpc[k]).name for k in ("rpccertpath", "rpckeypath", "rpcclientcapath")] == [
        "rpc.cert",
        "rpc.key",
        "rpc-ca.cert",
    ]
    assert conf["payment"]["wallettype"] != "disabled"


@pytest.mark.realnet
async def test_brnet_clients_match_the_readme_conf(brnet_factory: Callable[..., BrNet]) -> None:
    rpc = readme_conf()["clientrpc"]
    cap = rpc["rpcmaxremotesendtipamt"]
    net = await anyio.to_thread.run_sync(
        lambda: brnet_factory(
            extra_args=(
                "-rpcallowremotesendtip=" + rpc["rpcallowremotesendtip"],
                "-rpcmaxremotesendtipamt",
                cap,
            )
        )
    )
    alice, bob = net.user("alice"), net.user("bob")
    # Same file names as brclient, next to each other in the user's root.
    assert [
        p.name for p in (alice.servercertpath, alice.cacertpath, alice.clientcertpath, alice.clientkeypath)
    ] == [
        "rpc.cert",
        "rpc-ca.cert",
        "rpc-client.cert",
        "rpc-client.key",
    ]
    assert alice.clientcertpath.parent == alice.cacertpath.parent == alice.root
    assert re.fullmatch(r"wss://127\.0\.0\.1:\d+/ws", alice.brrpcurl)
    # The per-user conf is what brmcp-serve / brmcp-bridge read, as is.
    cfg = load_bot_config(alice.conf)
    assert (cfg.brrpcurl, cfg.servercertpath, cfg.clientcertpath, cfg.clientkeypath) == (
        alice.brrpcurl,
        str(alice.servercertpath),
        str(alice.clientcertpath),
        str(alice.clientkeypath),
    )
    async with alice.client(ping_interval=None) as ca, bob.client(ping_interval=None) as cb:
        await ca.wait_connected()
        await cb.wait_connected()
        received = cb.tip_stream()
        await received.wait_open()
        # A tip at the README's cap goes through; one atom more is refused by brclient's guard.
        await ca.tip_user(bob.uid, float(cap), 1)
        with anyio.fail_after(30):
            tip = await received.__anext__()
        assert tip.atoms == round(float(cap) * 1e8)
        with pytest.raises(RPCError) as err:
            await ca.tip_user(bob.uid, float(cap) + 1e-8, 1)
        assert err.value.message == f"tip exceeds max limit: {cap}"
