"""brmcp._ops.botlog: the console daemons honour the bisonbotkit logging keys
``debug``, ``logfile`` and ``maxlogfiles`` (docs/clientrpc.md §Bot config file); ``maxbufferlines``
is accepted and ignored."""

from __future__ import annotations

import io
import logging
import stat
from pathlib import Path

import pytest

from brmcp._ops import botlog
from brmcp._ops.botlog import OFF, LogPlan, LogSetupError, bot_logging, parse_level, plan_logging
from brmcp.clientrpc import BotConfig


def test_level_words_are_slogs() -> None:
    expected = {
        "trace": logging.DEBUG,
        "TRC": logging.DEBUG,
        "debug": logging.DEBUG,
        "dbg": logging.DEBUG,
        "Info": logging.INFO,
        "inf": logging.INFO,
        "warn": logging.WARNING,
        "wrn": logging.WARNING,
        "warning": logging.WARNING,
        "error": logging.ERROR,
        "err": logging.ERROR,
        "critical": logging.CRITICAL,
        "crt": logging.CRITICAL,
        " off ": OFF,
    }
    assert {word: parse_level(word) for word in expected} == expected
    with pytest.raises(ValueError, match="unknown log level 'loud'"):
        parse_level("loud")
    assert all(parse_level(word) for word in botlog.LEVEL_CHOICES)


def test_plan_reads_the_config_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert plan_logging(None) == LogPlan()
    # bisonbotkit's defaults: info, <datadir>/logs/<name>.log, 5 rotated files.
    cfg = BotConfig.defaults(tmp_path / "d", "brmcp-serve")
    assert plan_logging(cfg) == LogPlan(logging.INFO, (), tmp_path / "d" / "logs" / "brmcp-serve.log", 5)
    cfg = BotConfig(debug="warn,brmcp.clientrpc=debug, RPC = trace", logfile="~/x.log", maxlogfiles=2)
    plan = plan_logging(cfg)
    assert plan.level == logging.WARNING
    assert plan.loggers == (("brmcp.clientrpc", logging.DEBUG), ("RPC", logging.DEBUG))
    assert (plan.logfile, plan.backups, plan.warnings) == (tmp_path / "x.log", 2, ())
    # --log-level replaces the whole debug value.
    assert plan_logging(cfg, level="error").level == logging.ERROR
    assert plan_logging(cfg, level="error").loggers == ()
    # Unset counts and empty values take the defaults; an empty logfile means stderr only.
    plan = plan_logging(BotConfig(debug="", logfile="", maxlogfiles=0, maxbufferlines=7))
    assert plan == LogPlan()
    # An unknown word means info, with a warning naming the file (bisonbotkit: silently info).
    plan = plan_logging(BotConfig(debug="loud"), source="/d/x.conf")
    assert plan.level == logging.INFO
    assert plan.warnings == ("/d/x.conf: debug='loud': unknown log level 'loud', using info",)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_logs_go_to_the_stream_and_a_private_rotated_file(tmp_path: Path) -> None:
    logfile = tmp_path / "a" / "logs" / "bot.log"
    cfg = BotConfig(debug="info,brmcp.test.quiet=error", logfile=str(logfile), maxlogfiles=2)
    stream = io.StringIO()
    root = logging.getLogger()
    handlers_before, level_before = list(root.handlers), root.level
    quiet = logging.getLogger("brmcp.test.quiet")
    quiet_before = quiet.level
    loud = logging.getLogger("brmcp.test.loud")
    with bot_logging(cfg, stream=stream) as plan:
        assert plan.logfile == logfile
        loud.debug("not shown")
        loud.info("hello %s", "file")
        quiet.warning("below this logger's threshold")
        quiet.error("shown")
    assert (list(root.handlers), root.level, quiet.level) == (handlers_before, level_before, quiet_before)
    shown = stream.getvalue().splitlines()
    assert len(shown) == 2
    assert shown[0].endswith(" INFO brmcp.test.loud: hello file")
    assert shown[1].endswith(" ERROR brmcp.test.quiet: shown")
    assert _lines(logfile) == shown
    for directory in (tmp_path / "a", tmp_path / "a" / "logs"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(logfile.stat().st_mode) == 0o600


def test_rotation_keeps_maxlogfiles_rotated_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(botlog, "LOG_ROTATE_BYTES", 200)
    logfile = tmp_path / "bot.log"
    log = logging.getLogger("brmcp.test.rotate")
    with bot_logging(BotConfig(logfile=str(logfile), maxlogfiles=2), stream=io.StringIO()):
        for n in range(40):
            log.warning("line %03d %s", n, "x" * 40)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["bot.log", "bot.log.1", "bot.log.2"]
    for path in tmp_path.iterdir():
        assert path.stat().st_size <= 200
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _lines(logfile)[-1].endswith("line 039 " + "x" * 40)


def test_off_logs_nothing(tmp_path: Path) -> None:
    stream = io.StringIO()
    logfile = tmp_path / "bot.log"
    with bot_logging(BotConfig(debug="info", logfile=str(logfile)), level="off", stream=stream):
        logging.getLogger("brmcp.test.off").critical("nothing")
    assert stream.getvalue() == ""
    assert logfile.read_text() == ""


def test_unknown_level_is_logged_once_handlers_exist() -> None:
    stream = io.StringIO()
    with bot_logging(BotConfig(debug="loud"), source="x.conf", stream=stream):
        pass
    assert (
        "WARNING brmcp.botlog: x.conf: debug='loud': unknown log level 'loud', using info"
        in stream.getvalue()
    )


def test_a_log_file_that_cannot_be_opened_is_named(tmp_path: Path) -> None:
    root = logging.getLogger()
    handlers_before = list(root.handlers)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with (
        pytest.raises(LogSetupError, match=f"^cannot create log directory {blocker / 'logs'}: "),
        bot_logging(BotConfig(logfile=str(blocker / "logs" / "x.log"))),
    ):
        pass
    with (
        pytest.raises(LogSetupError, match=f"^cannot open log file {tmp_path}: is a directory$"),
        bot_logging(BotConfig(logfile=str(tmp_path))),
    ):
        pass
    assert root.handlers == handlers_before


def test_the_sdk_s_info_lines_stay_out_of_an_info_log() -> None:
    """At info the MCP SDK's session lines (with session ids) are held back;
    a debug level shows them, and the levels are restored afterwards."""
    sdk = logging.getLogger("mcp.server.streamable_http_manager")
    before = logging.getLogger("mcp").level
    with botlog.bot_logging(None, stream=io.StringIO()):
        assert not sdk.isEnabledFor(logging.INFO)
        assert sdk.isEnabledFor(logging.WARNING)
    with botlog.bot_logging(None, level="debug", stream=io.StringIO()):
        assert sdk.isEnabledFor(logging.INFO)
    assert logging.getLogger("mcp").level == before
