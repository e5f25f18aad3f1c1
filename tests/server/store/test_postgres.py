"""What only the PostgreSQL store does (brmcp/server/store/postgres/):
schema creation safe when several processes connect at once, foreign or
newer databases refused untouched, serialization conflicts retried without
applying anything twice, a lost connection reopened, passwords never shown,
a missing driver named with its install command, and a Harness selecting
the backend by its ``store`` URL."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import threading
from typing import Any

import pytest

from brmcp.server import Harness, HarnessConfig, HarnessError, store
from brmcp.server.store import SCHEMA_VERSION, StoreError
from brmcp.server.store.postgres import INSTALL_HINT, PostgresExecutor
from brmcp.server.store.url import parse_store_url
from tests.kit import ALICE
from tests.kit.harness import standard_harness
from tests.kit.postgres import PostgresServer

PEER = "a" * 64


def executor(url: str) -> PostgresExecutor:
    return PostgresExecutor(parse_store_url(url))


def raw_sql(url: str, sql: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql)
        return [tuple(r) for r in cur.fetchall()] if cur.description else []


def test_concurrent_first_connections_create_one_schema(postgres_url: str) -> None:
    opened: list[PostgresExecutor] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def connect() -> None:
        start.wait(10)
        try:
            opened.append(executor(postgres_url))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=connect) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert errors == []
        assert len(opened) == 6
        assert raw_sql(postgres_url, "SELECT version FROM brmcp_schema") == [(SCHEMA_VERSION,)]
        opened[0].run_now(functools.partial(store.credit, peer=PEER, atoms=3, ts=1.0, kind="credit", ref="r"))
        assert opened[5].run_now(functools.partial(store.balance, peer=PEER)) == 3
    finally:
        for ex in opened:
            ex.close()


def test_a_connection_waits_out_a_slow_schema_creation_elsewhere(postgres_url: str) -> None:
    """Another process holding the schema lock longer than the row-lock
    timeout (DDL on a loaded server) delays a new connection; it does not
    fail it."""
    import time

    import psycopg

    from brmcp.server.store.postgres.executor import LOCK_TIMEOUT_MS
    from brmcp.server.store.postgres.schema import ADVISORY_LOCK

    holder = psycopg.connect(postgres_url, autocommit=True)
    holder.execute("BEGIN")
    holder.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK,))
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(_open_or_error(postgres_url)))
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not raw_sql(postgres_url, "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"):
            assert time.monotonic() < deadline, "the new connection never waited for the schema lock"
            time.sleep(0.01)
        # PostgreSQL's own timer is what is under test, so real time passes here.
        time.sleep(3 * LOCK_TIMEOUT_MS / 1000)
    finally:
        holder.execute("COMMIT")
        holder.close()
    thread.join(30)
    assert len(result) == 1
    opened = result[0]
    assert isinstance(opened, PostgresExecutor), opened
    opened.close()


def _open_or_error(url: str) -> PostgresExecutor | BaseException:
    try:
        return executor(url)
    except BaseException as exc:
        return exc


def test_a_foreign_database_is_refused_untouched(postgres_url: str) -> None:
    raw_sql(postgres_url, "CREATE TABLE balances (who TEXT)")
    with pytest.raises(StoreError, match="not a brmcp database") as info:
        executor(postgres_url)
    assert "\n" not in str(info.value)
    tables = raw_sql(
        postgres_url, "SELECT table_name FROM information_schema.tables WHERE table_schema='public'"
    )
    assert tables == [("balances",)]


def test_a_newer_schema_is_refused(postgres_url: str) -> None:
    executor(postgres_url).close()
    raw_sql(postgres_url, f"UPDATE brmcp_schema SET version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer than this brmcp supports"):
        executor(postgres_url)


def test_a_serialization_conflict_is_retried_and_applied_once(postgres_url: str) -> None:
    first, second = executor(postgres_url), executor(postgres_url)
    try:
        first.run_now(functools.partial(store.credit, peer=PEER, atoms=100, ts=1.0, kind="credit", ref="r0"))
        both_read = threading.Barrier(2)
        attempts: list[str] = []

        def charge(name: str) -> Any:
            def op(c: Any) -> tuple[bool, int]:
                attempts.append(name)
                store.balance(c, PEER)
                if attempts.count(name) == 1:
                    both_read.wait(10)  # both transactions read the balance before either writes
                return store.charge(c, call_id=name, peer=PEER, call_key=None, tool="t", atoms=30, ts=2.0)

            return op

        results: dict[str, Any] = {}
        threads = [
            threading.Thread(target=lambda ex=ex, n=n: results.__setitem__(n, ex.run_now(charge(n))))
            for ex, n in ((first, "c1"), (second, "c2"))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(results.values()) == [(True, 40), (True, 70)]
        assert first.retries + second.retries == 1
        assert sorted(attempts) == ["c1", "c1", "c2"] or sorted(attempts) == ["c1", "c2", "c2"]
        lines = first.run_now(functools.partial(store.statement, peer=PEER))
        assert [(e.kind, e.atoms) for e in lines] == [("credit", 100), ("charge", -30), ("charge", -30)]
        assert [e.balance_after for e in lines] == [100, 70, 40]
    finally:
        first.close()
        second.close()


def test_a_lost_connection_is_reopened(postgres_url: str) -> None:
    ex = executor(postgres_url)
    try:
        ex.run_now(functools.partial(store.credit, peer=PEER, atoms=5, ts=1.0, kind="credit", ref="r1"))
        raw_sql(
            postgres_url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        ex.run_now(functools.partial(store.credit, peer=PEER, atoms=6, ts=2.0, kind="credit", ref="r2"))
        assert ex.run_now(functools.partial(store.balance, peer=PEER)) == 11
    finally:
        ex.close()


def test_passwords_never_appear_in_errors(postgres_server: PostgresServer) -> None:
    secret = "hunter2-Zq9"
    for url in (
        f"postgresql://nosuchrole:{secret}@/nodb?host={postgres_server.socket_dir}",
        f"postgresql:///nodb?host={postgres_server.socket_dir}&user=nosuchrole&password={secret}",
    ):
        with pytest.raises(StoreError) as info:
            executor(url)
        message = str(info.value)
        assert secret not in message
        assert "[redacted]" in message
        assert "\n" not in message
        assert secret not in repr(parse_store_url(url))
        with pytest.raises(HarnessError) as harness_info:
            Harness(HarnessConfig(store=url))
        assert secret not in str(harness_info.value)


@pytest.mark.parametrize("value", ["mysql://u:pw-Zq9@h/db", "postgresql://u:pw-Zq9@h:port/db", "sqlite:/x"])
def test_a_bad_store_url_is_one_line_naming_the_forms(value: str) -> None:
    with pytest.raises(HarnessError) as info:
        Harness(HarnessConfig(store=value))
    message = str(info.value)
    assert message.startswith("brmcp: store: ")
    assert "pw-Zq9" not in message
    assert '"sqlite:"' in message
    assert "postgresql://" in message
    assert "\n" not in message


def test_a_missing_driver_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(HarnessError, match=f"needs psycopg 3.*{re.escape(INSTALL_HINT)}"):
        Harness(HarnessConfig(store="postgresql:///db?host=/nonexistent"))


def test_sqlite_needs_no_driver(tmp_path: Any) -> None:
    script = (
        "import sys; sys.modules['psycopg'] = None\n"
        "import anyio\n"
        "from brmcp.server import Harness, HarnessConfig\n"
        f"h = Harness(HarnessConfig(data_dir={str(tmp_path)!r}))\n"
        "async def main():\n"
        "    async with h:\n"
        "        await h.credit('a' * 64, 7)\n"
        "        print(await h.balance('a' * 64))\n"
        "anyio.run(main)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "7"


async def test_a_harness_on_postgresql_keeps_its_book_there(postgres_url: str) -> None:
    harness, runs = standard_harness(None, store=postgres_url)
    spec = next(t for t in harness.tools() if t.name == "paid")
    failing = next(t for t in harness.tools() if t.name == "failing")
    async with harness:
        assert harness.database_path is None  # no SQLite file
        await harness.credit(ALICE, 1200)
        ok = await harness.call(ALICE, spec, {}, {}, "k" * 32)
        assert not ok.is_error
        again = await harness.call(ALICE, spec, {}, {}, "k" * 32)
        assert again == ok
        failed = await harness.call(ALICE, failing, {}, {}, None)
        assert failed.is_error
        assert runs.n == 2
        assert await harness.balance(ALICE) == 700
    # A second harness on the same database sees the same book, and the kept callKey.
    other, other_runs = standard_harness(None, store=postgres_url)
    async with other:
        assert await other.balance(ALICE) == 700
        replay = await other.call(ALICE, spec, {}, {}, "k" * 32)
        assert replay == ok
        assert other_runs.n == 0
        kinds = [e.kind for e in await other.statement(ALICE)]
        assert kinds == ["credit", "charge", "charge", "refund"]


def test_serve_config_store_key() -> None:
    from brmcp.serve.config import ServeConfig, ServeConfigError

    url = "postgresql://bot:pw-Zq9@db.example/brmcp"
    config = ServeConfig.parse(f'{{"allowed_uids": [], "store": "{url}"}}')
    assert config.store == url
    assert "pw-Zq9" not in repr(config)
    assert ServeConfig.parse(config.to_json()).store == url
    assert ServeConfig.parse('{"allowed_uids": []}').store == "sqlite:"
    for bad in ('"mysql://u:pw-Zq9@h/db"', "42", '["sqlite:"]'):
        with pytest.raises(ServeConfigError) as info:
            ServeConfig.parse(f'{{"allowed_uids": [], "store": {bad}}}', source="/d/brmcp.json")
        message = str(info.value)
        assert message.startswith("/d/brmcp.json: store: ")
        assert "pw-Zq9" not in message
        assert '"sqlite:"' in message
        assert "\n" not in message
