"""Bot config files, certificate/URL errors, TLS pinning, client certificates
and Basic auth: every failure is one line naming the file or address."""

from __future__ import annotations

import io
import logging
import re
import stat
from pathlib import Path

import anyio
import pytest
from websockets.exceptions import InvalidStatus

from brmcp._ops.botlog import bot_logging
from brmcp.clientrpc import (
    BotConfig,
    Client,
    ClientrpcConfigError,
    ClientrpcConnectError,
    load_bot_config,
    load_or_create_bot_config,
    write_bot_config,
)
from brmcp.testing.fakebr import FakeBRClient
from tests.kit.clientrpc import FAST, fake_network, raw_ws


async def _first_dial_error(client: Client) -> ClientrpcConnectError:
    async with client:
        for _ in range(2000):
            error = client.last_error
            if error is not None:
                return error
            await anyio.sleep(0.005)
    raise AssertionError("the client never reported a dial error")


def _one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text
    return text


# -- config files ------------------------------------------------------------------------


def test_defaults_and_generation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    datadir = tmp_path / "serve"
    cfg, created = load_or_create_bot_config(datadir, "brmcp-serve")
    assert created
    path = datadir / "brmcp-serve.conf"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    brclient = tmp_path / "home" / ".brclient"
    assert cfg.brrpcurl == "wss://127.0.0.1:7676/ws"
    assert cfg.servercertpath == str(brclient / "rpc.cert")
    assert cfg.clientcertpath == str(brclient / "rpc-client.cert")
    assert cfg.clientkeypath == str(brclient / "rpc-client.key")
    assert re.fullmatch(r"[0-9a-f]{8}", cfg.rpcuser)
    assert re.fullmatch(r"[0-9a-f]{16}", cfg.rpcpass)
    assert (cfg.debug, cfg.maxlogfiles, cfg.maxbufferlines) == ("info", 5, 1000)
    assert cfg.logfile == str(datadir / "logs" / "brmcp-serve.log")
    assert cfg.datadir == str(datadir)
    again, created = load_or_create_bot_config(datadir, "brmcp-serve")
    assert not created
    assert again == cfg
    assert BotConfig.defaults(datadir, "x").rpcpass != cfg.rpcpass


def test_parse_rules_and_extras_round_trip(tmp_path: Path) -> None:
    text = (
        "brrpcurl = wss://10.0.0.2:7676/ws\n"
        "\n"
        "# a comment without an equals sign\n"
        "# comment=not really\n"
        "brstatusurl=https://x/y?a=b\n"
        "rpcpass=p=q\n"
        "maxlogfiles= 7 \n"
        "rpcuser=first\n"
        "rpcuser=second\n"
    )
    cfg = BotConfig.parse(text)
    assert cfg.brrpcurl == "wss://10.0.0.2:7676/ws"
    assert cfg.rpcpass == "p=q"
    assert cfg.rpcuser == "second"
    assert cfg.maxlogfiles == 7
    assert cfg.extra == {"# comment": "not really", "brstatusurl": "https://x/y?a=b"}
    path = tmp_path / "bot.conf"
    write_bot_config(path, cfg)
    assert load_bot_config(path) == cfg
    assert path.read_text().endswith("# comment=not really\nbrstatusurl=https://x/y?a=b\n")


def test_existing_files_are_not_backfilled(tmp_path: Path) -> None:
    (tmp_path / "b.conf").write_text("brrpcurl=wss://127.0.0.1:1/ws\n")
    cfg, created = load_or_create_bot_config(tmp_path, "b")
    assert not created
    assert (cfg.brrpcurl, cfg.rpcuser, cfg.logfile) == ("wss://127.0.0.1:1/ws", "", "")
    assert (tmp_path / "b.conf").read_text() == "brrpcurl=wss://127.0.0.1:1/ws\n"
    with pytest.raises(ClientrpcConfigError, match="datadir is required"):
        cfg.with_runtime_defaults()
    cfg.datadir, cfg.logfile = str(tmp_path), str(tmp_path / "l.log")
    filled = cfg.with_runtime_defaults()
    assert (filled.maxlogfiles, filled.maxbufferlines, filled.debug) == (5, 1000, "info")


def test_config_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ClientrpcConfigError) as info:
        load_bot_config(tmp_path / "missing.conf")
    assert _one_line(info.value) == f"bot config {tmp_path / 'missing.conf'}: file not found"
    bad = tmp_path / "bad.conf"
    bad.write_text("datadir=/x\nmaxbufferlines=lots\n")
    with pytest.raises(ClientrpcConfigError) as info:
        load_bot_config(bad)
    assert _one_line(info.value) == f"{bad}:2: maxbufferlines='lots' is not an integer"
    with pytest.raises(ClientrpcConfigError, match="newline"):
        BotConfig(rpcpass="a\nb").render()


# -- certificate paths and URLs ------------------------------------------------------------


async def test_bad_paths_and_urls_are_one_line_errors(tmp_path: Path) -> None:
    async with fake_network(tmp_path, "bot", "eve") as (_, (bot, eve)):
        certs = bot.certs
        good = {
            "server_cert": certs.server_cert,
            "client_cert": certs.client_cert,
            "client_key": certs.client_key,
        }
        missing = tmp_path / "nope" / "rpc.cert"
        with pytest.raises(ClientrpcConfigError) as info:
            Client(bot.url, **{**good, "server_cert": missing})
        assert _one_line(info.value) == f"servercertpath {missing}: file not found"
        with pytest.raises(ClientrpcConfigError) as info:
            Client(bot.url, **{**good, "client_key": tmp_path})
        assert _one_line(info.value) == f"clientkeypath {tmp_path}: is a directory, not a file"
        junk = tmp_path / "junk.cert"
        junk.write_text("not a certificate\n")
        with pytest.raises(ClientrpcConfigError) as info:
            Client(bot.url, **{**good, "client_cert": junk})
        assert _one_line(info.value) == f"clientcertpath {junk}: no PEM certificate block in the file"
        with pytest.raises(ClientrpcConfigError) as info:
            Client(bot.url, **{**good, "client_key": eve.certs.client_key})
        assert _one_line(info.value).startswith(f"clientkeypath {eve.certs.client_key}: key does not match")
        for url, needle in [
            ("https://127.0.0.1:7676/ws", "the scheme must be wss"),
            ("wss://127.0.0.1:7676", "the path must be exactly /ws"),
            ("wss://127.0.0.1:7676/ws/", "the path must be exactly /ws"),
            ("wss://:7676/ws", "no host"),
            ("wss://127.0.0.1:99999/ws", "brrpcurl"),
        ]:
            with pytest.raises(ClientrpcConfigError) as info:
                Client(url, **good)
            assert needle in _one_line(info.value)
            assert url in str(info.value)


async def test_unreachable_address_is_reported_with_the_url(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot") as (_, (bot,)):
            certs = bot.certs
            port = bot.port
            await bot.__aexit__(None, None, None)
            url = f"wss://127.0.0.1:{port}/ws"
            client = Client(
                url,
                server_cert=certs.server_cert,
                client_cert=certs.client_cert,
                client_key=certs.client_key,
                **FAST,
            )
            error = await _first_dial_error(client)
            assert _one_line(error).startswith(f"brclient clientrpc at {url}: connection refused")
            await bot.__aenter__()


async def test_wrong_client_certificate_is_refused(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot", "eve") as (_, (bot, eve)):
            client = Client(
                bot.url,
                server_cert=bot.certs.server_cert,
                client_cert=eve.certs.client_cert,  # signed by eve's CA, not bot's
                client_key=eve.certs.client_key,
                **FAST,
            )
            error = await _first_dial_error(client)
            text = _one_line(error)
            assert text.startswith(f"brclient clientrpc at {bot.url}: ")
            assert str(eve.certs.client_cert) in text
            assert "client certificate" in text
            assert bot.total_connections == 0


async def test_server_certificate_is_pinned(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot", "eve") as (_, (bot, eve)):
            client = Client(
                bot.url,
                server_cert=eve.certs.server_cert,  # someone else's rpc.cert
                client_cert=bot.certs.client_cert,
                client_key=bot.certs.client_key,
                **FAST,
            )
            text = _one_line(await _first_dial_error(client))
            assert "server certificate not trusted" in text
            assert str(eve.certs.server_cert) in text


async def test_hostname_must_be_in_the_certificate(tmp_path: Path) -> None:
    """rpc.cert names 127.0.0.1, ::1, localhost and the hostname; another
    loopback address is refused by hostname verification."""
    with anyio.fail_after(20):
        try:
            network = fake_network(tmp_path, "bot", host="127.0.0.2")
            relay_and_fakes = await network.__aenter__()
        except OSError as exc:  # pragma: no cover - platforms without 127.0.0.0/8
            pytest.skip(f"cannot listen on 127.0.0.2: {exc}")
        try:
            (_, (bot,)) = relay_and_fakes
            text = _one_line(await _first_dial_error(bot.client(**FAST)))
            assert "server certificate not trusted" in text
            assert "mismatch" in text
        finally:
            await network.__aexit__(None, None, None)


# -- Basic auth --------------------------------------------------------------------------------


async def test_basic_auth_on(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot", auth_mode="basic", rpcuser="u1", rpcpass="p1") as (
            _,
            (bot,),
        ):
            async with bot.client(**FAST) as cb:
                await cb.wait_connected()
                assert (await cb.version()).app_name == "brclient"
            wrong = bot.client(**{**FAST, "rpcpass": "nope"})
            assert "HTTP 403 Forbidden" in _one_line(await _first_dial_error(wrong))
            empty = bot.client(**{**FAST, "rpcuser": "", "rpcpass": ""})  # sends "Basic Og=="
            assert "HTTP 403" in _one_line(await _first_dial_error(empty))
            with pytest.raises(InvalidStatus) as info:
                async with raw_ws(bot):
                    pass
            response = info.value.response
            assert response.status_code == 401
            assert response.headers["WWW-Authenticate"] == 'Basic realm="Restricted"'
            assert response.body == b"Unauthorized\n"
            cfg = bot.bot_config(tmp_path / "serve")
            assert (cfg.rpcuser, cfg.rpcpass) == ("u1", "p1")
            async with Client.from_config(cfg, **FAST) as cb:
                await cb.wait_connected()


async def test_basic_auth_mode_without_server_credentials_refuses_everyone(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot", auth_mode="basic") as (_, (bot,)):
            text = _one_line(await _first_dial_error(bot.client(**FAST)))
            assert "HTTP 401" in text


async def test_basic_auth_off_ignores_credentials(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot") as (_, (bot,)):
            async with bot.client(rpcuser="any", rpcpass="thing", **FAST) as cb:
                await cb.wait_connected()
            async with raw_ws(bot):
                pass
            assert "Authorization" not in bot.upgrade_headers[-1]


def test_fake_requires_running_relay_registration(tmp_path: Path) -> None:
    from brmcp.testing.fakebr import FakeRelay

    relay = FakeRelay()
    fake = FakeBRClient(relay, "bot", tmp_path / "bot", uid="11" * 32)
    assert fake.uid == "11" * 32
    assert relay.is_offline(fake.uid)  # not running yet: PMs to it are stored
    with pytest.raises(ValueError, match="already registered"):
        FakeBRClient(relay, "again", tmp_path / "again", uid="11" * 32)


def test_malformed_lines_are_errors_naming_the_line_without_echoing_it(tmp_path: Path) -> None:
    path = tmp_path / "brmcp-serve.conf"
    path.write_text("brrpcurl=wss://127.0.0.1:1/ws\n\nrpcpass hunter2-secret\n")
    with pytest.raises(ClientrpcConfigError) as caught:
        load_bot_config(path)
    message = str(caught.value)
    assert message == f"{path}:3: not a key=value line (a key, '=', then its value)"
    assert "hunter2" not in message


def test_unknown_keys_are_warned_with_their_line_numbers(caplog: pytest.LogCaptureFixture) -> None:
    cfg = BotConfig.parse(
        "brrpcurl=wss://h:1/ws\ndebgu=trace\n\nbrstatusurl=x\nbrstatusur=y\nother=z\n", source="b.conf"
    )
    assert cfg.extra == {"debgu": "trace", "brstatusurl": "x", "brstatusur": "y", "other": "z"}
    assert cfg.brstatusurl == "x"
    # brstatusurl is read by brmcp (KX suggestions): kept in extra, never warned about.
    assert cfg.unknown_key_warnings("b.conf") == [
        "b.conf:2: unknown key 'debgu' ignored (did you mean 'debug'?)",
        "b.conf:5: unknown key 'brstatusur' ignored (did you mean 'brstatusurl'?)",
        "b.conf:6: unknown key 'other' ignored",
    ]
    with caplog.at_level(logging.INFO), bot_logging(cfg, source="b.conf", stream=io.StringIO()):
        pass
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warned] == cfg.unknown_key_warnings("b.conf")
