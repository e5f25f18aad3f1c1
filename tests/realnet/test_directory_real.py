"""The directory scenario on a real Bison Relay network (brnet), each step
timed and its relay PMs counted (the report is printed; run with ``-s``).

Three users: ``dir`` runs ``brmcpdir`` (brmcp/directory/cli.py), ``prov``
runs ``brmcp-serve`` with a ``directory`` block (README §List your bot),
``cons`` runs ``brmcp-bridge`` and is the directory's admin. dir has KX'd
with both; prov and cons have never KX'd.

0. cons's agent reads the directory's ``policy`` (the directory serves);
1. prov starts, registers at dir and pays the invoice by tip (auto-fund);
2. dir crawls prov and pays the test call (a tip to prov): pending_review;
3. the admin (cons's agent) calls ``pending_registrations`` and ``approve``;
4. cons's agent calls ``search`` and ``get_provider``;
5. cons's agent calls ``introduce``; cons's brclient receives the KX
   suggestion and accepts it (a mediated KX through dir): KXCompleted at
   cons and prov;
6. cons's bridge admits prov (``settings set allowed_bots=...``) and the
   agent makes a paid ``fortune`` call to prov.

Then the books, to the atom: at dir, prov's tips = the listing fee + the
escrow left + the test paid out; at prov, dir's tip = the test's charge and
the fund tip = what dir credited; at cons, the spend log = prov's charge +
cons's balance there; and the simulated wallet paid exactly those tips."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from brmcp.testing.brnet import BrNet, mediated_kx

from .dirstack import (
    bridge_settings_set,
    bridge_url,
    open_scenario,
    payload,
    poll,
    read_books,
    read_directory_spend,
    read_fund_history,
    read_ledger,
    read_registration_state,
    start_directory_and_bridge,
    start_provider,
    suggestion_seen,
)
from .stack import FORTUNE_ATOMS, Daemon, agent

pytestmark = [pytest.mark.realnet, pytest.mark.slow]

LISTING_FEE = 1_000
#: The test call's budget the provider offers (above the fortune's price,
#: so escrow is left after the test).
TEST_BUDGET = 15_000


async def test_directory_scenario_on_a_real_relay(
    brnet_factory: Callable[..., BrNet], tmp_path: Path
) -> None:
    sc = await open_scenario(brnet_factory, tmp_path, listing_fee=LISTING_FEE, test_budget=TEST_BUDGET)
    net, d, prov, cons, report = sc.net, sc.d, sc.prov, sc.cons, sc.report
    dir_data, prov_data, bridge_data = sc.dir_data, sc.prov_data, sc.bridge_data
    daemons: list[Daemon] = []
    dir_url = ""
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(sc.log.run, [d, prov, cons])
            await start_directory_and_bridge(sc, daemons)
            dir_url = bridge_url(bridge_data, d.uid)

            async def serving() -> None:
                with anyio.fail_after(120):
                    async with agent(dir_url) as s:
                        terms = payload(await s.call_tool("policy", {}))
                assert terms["listingFeeAtoms"] == LISTING_FEE, terms
                assert terms["name"] == "realnet-dir", terms

            await report.step("0 the directory serves (policy)", serving)

            async def registered_and_funded() -> None:
                daemons.append(start_provider(net, prov, cons, prov_data, sc.block))

                def funded() -> bool:
                    paid = read_fund_history(prov_data)
                    return bool(paid) and read_ledger(dir_data, prov.uid).kind("tip") >= sum(
                        int(e["atoms"]) for e in paid
                    )

                await poll(funded, "prov's funding tip to be credited at dir", 180, daemons)

            # The crawl follows the credit at once: step 2's PMs start where step 1 ends.
            await report.step("1 prov registers, pays by tip", registered_and_funded, settle=False)

            async def verified() -> None:
                await poll(
                    lambda: read_registration_state(dir_data, prov.uid) == "pending_review",
                    "dir to crawl and test prov (pending_review)",
                    240,
                    daemons,
                )

            await report.step("2 dir crawls and test-calls prov", verified)
            spends = await anyio.to_thread.run_sync(read_directory_spend, dir_data, prov.uid)
            assert spends == [(FORTUNE_ATOMS, "paid", True)], spends

            async def reviewed() -> None:
                with anyio.fail_after(120):
                    async with agent(dir_url) as s:
                        pending = payload(await s.call_tool("pending_registrations", {}))
                        regs = pending["registrations"]
                        assert [(r["uid"], r["state"]) for r in regs] == [(prov.uid, "pending_review")], (
                            pending
                        )
                        assert (regs[0]["feeAtoms"], regs[0]["paidAtoms"]) == (LISTING_FEE, FORTUNE_ATOMS), (
                            regs
                        )
                        status = payload(await s.call_tool("approve", {"uid": prov.uid}))
                assert status["state"] == "listed", status

            await report.step("3 admin: pending_registrations, approve", reviewed)

            async def found() -> None:
                with anyio.fail_after(120):
                    async with agent(dir_url) as s:
                        hits = payload(await s.call_tool("search", {"query": "fortune"}))
                        listing = payload(await s.call_tool("get_provider", {"uid": prov.uid}))
                assert [(h["providerUid"], h["tool"]) for h in hits["hits"]] == [(prov.uid, "fortune")], hits
                assert hits["hits"][0].get("priceAtoms") == FORTUNE_ATOMS, hits
                # listing_invite: the registrant's free tool (README §List your bot).
                tools = {t["name"] for t in listing["catalog"]}
                assert tools == {"echo", "fortune", "listing_invite"}, listing
                assert listing["lastVerifiedExecution"] > 0, listing

            await report.step("4 search, get_provider", found)

            async def introduced() -> None:
                with anyio.fail_after(120):
                    async with agent(dir_url) as s:
                        answer = payload(await s.call_tool("introduce", {"uid": prov.uid}))
                assert answer["suggested"] is True, answer
                brclient_log = cons.root / "logs" / "brclient.log"
                await poll(
                    lambda: suggestion_seen(brclient_log, prov.uid),
                    "cons's brclient to receive the KX suggestion",
                    60,
                    daemons,
                )
                with anyio.fail_after(120):
                    await mediated_kx(net, "cons", "dir", "prov")

            await report.step("5 introduce, suggestion accepted, KX", introduced)

            async def paid_call() -> None:
                applied = await bridge_settings_set(bridge_data, f"allowed_bots={d.uid},{prov.uid}")
                assert {u.lower() for u in applied["allowed_bots"]} == {d.uid, prov.uid}, applied
                with anyio.fail_after(180):
                    async with agent(bridge_url(bridge_data, prov.uid)) as s:
                        assert "fortune" in payload(await s.call_tool("fortune", {}))

            await report.step("6 admit prov, paid fortune call", paid_call)

            await _check_books(net, dir_data, prov_data, bridge_data, d.uid, prov.uid, cons.uid, daemons)
            tg.cancel_scope.cancel()
    finally:
        for daemon in reversed(daemons):
            daemon.stop()
        print("\n" + report.report())


async def _check_books(
    net: BrNet,
    dir_data: Path,
    prov_data: Path,
    bridge_data: Path,
    dir_uid: str,
    prov_uid: str,
    cons_uid: str,
    daemons: list[Daemon],
) -> None:
    # The bridge writes its spend log after the call returns: read_books waits for a settled entry.
    books = await read_books(net, dir_data, prov_data, bridge_data, dir_uid, prov_uid, cons_uid)
    spend, at_dir, dir_paid, fund = books.spend, books.at_dir, books.dir_paid, books.fund
    dir_at_prov, cons_at_prov, wallet = books.dir_at_prov, books.cons_at_prov, books.wallet
    print(
        "\nbooks:"
        f"\n  dir, prov's account: {at_dir}; payments out: {dir_paid}"
        f"\n  prov, regfund.json: {fund}; dir's account: {dir_at_prov}; cons's account: {cons_at_prov}"
        f"\n  cons, bridge spend log: {spend}"
        f"\n  simulated wallet (matoms): {sorted(wallet)}"
    )

    # dir: tips in == listing fee + escrow left + test paid out.
    test_paid = sum(atoms for atoms, state, escrow in dir_paid if escrow and state == "paid")
    assert test_paid == FORTUNE_ATOMS
    assert at_dir.kind("directory_fee") == -LISTING_FEE
    assert at_dir.kind("directory_test") == -test_paid
    assert at_dir.kind("directory_refund") == 0
    assert at_dir.kind("tip") == LISTING_FEE + at_dir.balance + test_paid
    assert at_dir.balance == TEST_BUDGET - FORTUNE_ATOMS

    # prov: the fund tip out == what dir credited; dir's tip in == the test's charge.
    fund_out = sum(int(e["atoms"]) for e in fund if e["directoryUid"] == dir_uid)
    assert [e["directoryUid"] for e in fund] == [dir_uid]
    assert fund_out == at_dir.kind("tip") == LISTING_FEE + TEST_BUDGET
    assert dir_at_prov.kind("tip") == test_paid
    assert -dir_at_prov.kind("charge") - dir_at_prov.kind("refund") == FORTUNE_ATOMS
    assert dir_at_prov.balance == 0

    # cons: the bridge's spend log == prov's charge + cons's balance at prov.
    paid = [e for e in spend if e.get("status", "paid") == "paid"]
    assert {e["bot"].lower() for e in paid} == {prov_uid}, spend
    spent = sum(int(e["atoms"]) for e in paid)
    charged = -cons_at_prov.kind("charge") - cons_at_prov.kind("refund")
    assert cons_at_prov.kind("tip") == spent
    assert spent == charged + cons_at_prov.balance
    assert charged == FORTUNE_ATOMS

    # The wallet paid exactly those three payments, to the milliatom.
    assert sorted(wallet) == sorted(
        [fund_out * 1000, test_paid * 1000, *(int(e["atoms"]) * 1000 for e in paid)]
    )
    for daemon in daemons:
        assert daemon.proc is not None
        assert daemon.proc.poll() is None, daemon.tail(30)
