"""The admin tools and the admin log (docs/directory.md §Admin;
karamble/brmcp, ``directory/admin.go``).

Admin tools are ordinary free tools on the directory's harness, listed and
callable only for the policy's ``admin_uids``: the harness's
``tool_visible`` hides them from everyone else (absent from ``tools/list``,
unknown to ``tools/call``), and each handler checks the caller again.
Every mutating call that succeeded is appended to ``adminlog.json``, one
JSON object per line: ``{"ts", "actor", "action", "args"}`` (``args`` is
the call's input as Go writes its input struct, omitted when empty).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from brmcp._ops import gojson
from brmcp.server import CallContext, Harness

from ..db import Peer, Registration
from ..model import STATE_PENDING_REVIEW, ProviderIn, ShapeError
from ._parts import DirectoryParts
from ._public import EMPTY_SCHEMA, UID_SCHEMA, provider_out

log = logging.getLogger("brmcp.directory")

__all__ = ["ADMIN_TOOLS", "pending_out", "register_admin_tools"]

#: The admin tools, in registration order.
ADMIN_TOOLS = (
    "pending_registrations",
    "approve",
    "reject",
    "leads",
    "pursue_lead",
    "add_peer",
    "remove_peer",
    "verify_peer",
    "run_verification",
    "recrawl",
    "unlist",
    "flag",
    "stats",
)

Handler = Callable[[CallContext, dict[str, Any]], Awaitable[Any]]


def pending_out(reg: Registration) -> dict[str, Any]:
    """Go's ``PendingOut`` of one registration."""
    out: dict[str, Any] = {"uid": reg.uid, "state": reg.state, "description": reg.description}
    if reg.tags:
        out["tags"] = list(reg.tags)
    out["test"] = reg.test.to_json()
    out["renewal"] = reg.renewal
    if reg.test_outcome:
        out["testOutcome"] = reg.test_outcome
    if reg.test_err:
        out["testErr"] = reg.test_err
    out["feeAtoms"] = reg.fee_atoms
    out["budgetAtoms"] = reg.budget_atoms
    out["paidAtoms"] = reg.paid_atoms
    out["createdAt"] = reg.created_at
    return out


def _fields(args: dict[str, Any], shape: str, *names: str) -> dict[str, str]:
    """String fields of an admin input (Go's matching: exact key first,
    then case-insensitive); ValueError naming a non-string."""
    decoded = gojson.decode_struct(
        gojson.loads(gojson.dumps(args)), dict.fromkeys(names, "string"), struct=shape
    )
    return {name: str(decoded.get(name, "")) for name in names}


def _schema(*names: str, required: tuple[str, ...]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": "string"} for name in names},
        "required": list(required),
        "additionalProperties": False,
    }


def register_admin_tools(harness: Harness, directory: DirectoryParts) -> None:
    """Add the admin tools of ``directory`` to ``harness``; the caller's
    ``tool_visible`` must hide :data:`ADMIN_TOOLS` from non-admins."""
    pipeline = directory.pipeline
    store = directory.store
    federation = directory.federation
    alog = directory.admin_log
    policy = directory.policy
    clock = directory.clock

    def uid_of(args: dict[str, Any]) -> str:
        try:
            return ProviderIn.from_json(args).uid
        except ShapeError as exc:
            raise ValueError(str(exc)) from None

    async def pending_registrations(ctx: CallContext, args: dict[str, Any]) -> Any:
        return {"registrations": [pending_out(reg) for reg in await store.registrations()]}

    async def approve(ctx: CallContext, args: dict[str, Any]) -> Any:
        uid = uid_of(args)
        await pipeline.approve(uid)
        await alog.append(ctx.peer, "approve", {"uid": uid})
        return (await pipeline.status(uid)).to_json()

    async def reject(ctx: CallContext, args: dict[str, Any]) -> Any:
        got = _fields(args, "RejectIn", "uid", "reason")
        await store.reject(got["uid"], got["reason"])
        pipeline.changed(got["uid"])
        logged: dict[str, Any] = {"uid": got["uid"]}
        if got["reason"]:
            logged["reason"] = got["reason"]
        await alog.append(ctx.peer, "reject", logged)
        return (await pipeline.status(got["uid"])).to_json()

    async def leads(ctx: CallContext, args: dict[str, Any]) -> Any:
        return {"leads": [lead.to_json() for lead in await store.leads()]}

    async def pursue_lead(ctx: CallContext, args: dict[str, Any]) -> Any:
        uid = uid_of(args)
        lead = await federation.pursue_lead(uid)
        await alog.append(ctx.peer, "pursue_lead", {"uid": uid})
        return lead.to_json()

    async def add_peer(ctx: CallContext, args: dict[str, Any]) -> Any:
        got = _fields(args, "PeerIn", "uid", "pubKey")
        if len(got["uid"]) != 64 or not got["pubKey"]:
            raise ValueError("uid (64-hex) and pubKey are required")
        await store.put_peer(Peer(got["uid"], got["pubKey"], int(clock.now())))
        await alog.append(ctx.peer, "add_peer", got)
        return {"added": True}

    async def remove_peer(ctx: CallContext, args: dict[str, Any]) -> Any:
        uid = uid_of(args)
        await store.delete_peer(uid)
        await alog.append(ctx.peer, "remove_peer", {"uid": uid})
        return {"removed": True}

    async def verify_peer(ctx: CallContext, args: dict[str, Any]) -> Any:
        uid = uid_of(args)
        added = await federation.verify_peer(uid)
        await alog.append(ctx.peer, "verify_peer", {"uid": uid})
        return {"newLeads": added}

    async def run_verification(ctx: CallContext, args: dict[str, Any]) -> Any:
        uid = uid_of(args)
        await pipeline.spot_check(uid)
        await alog.append(ctx.peer, "run_verification", {"uid": uid})
        return (await pipeline.status(uid)).to_json()

    async def recrawl(ctx: CallContext, args: dict[str, Any]) -> Any:
        uid = uid_of(args)
        if await store.listing(uid) is None:
            raise ValueError("no listing for that uid")
        listing = await pipeline.recrawl(uid)
        await alog.append(ctx.peer, "recrawl", {"uid": uid})
        if listing is None:
            raise ValueError("listing vanished during recrawl")
        return provider_out(listing).to_json()

    async def unlist(ctx: CallContext, args: dict[str, Any]) -> Any:
        uid = uid_of(args)
        await store.unlist(uid)
        pipeline.changed(uid)
        await alog.append(ctx.peer, "unlist", {"uid": uid})
        return {"unlisted": True}

    async def flag(ctx: CallContext, args: dict[str, Any]) -> Any:
        got = _fields(args, "FlagIn", "uid", "note")
        await store.set_flag(got["uid"], got["note"])
        pipeline.changed(got["uid"])
        await alog.append(ctx.peer, "flag", got)
        return {"flagged": True}

    async def stats(ctx: CallContext, args: dict[str, Any]) -> Any:
        regs = await store.registrations()
        spends = await store.spends()
        return {
            "live": len(await store.listings()),
            "inPipeline": sum(1 for r in regs if r.state != STATE_PENDING_REVIEW),
            "pendingReview": sum(1 for r in regs if r.state == STATE_PENDING_REVIEW),
            "leads": len(await store.leads()),
            "peers": len(await store.peers()),
            "spendEntries": len(spends),
            "spendAtoms": sum(s.atoms for s in spends),
        }

    tools: list[tuple[str, str, Handler, dict[str, Any]]] = [
        (
            "pending_registrations",
            "List every registration in the pipeline or awaiting review.",
            pending_registrations,
            EMPTY_SCHEMA,
        ),
        ("approve", "Publish a reviewed registration as a live listing.", approve, UID_SCHEMA),
        (
            "reject",
            "Discard a registration; the reason reaches the provider via my_status.",
            reject,
            _schema("uid", "reason", required=("uid",)),
        ),
        ("leads", "List federation leads and their pursuit state.", leads, EMPTY_SCHEMA),
        (
            "pursue_lead",
            "Invite a lead to register: direct listing_invite call, transitive KX via the peer when "
            "not yet reachable.",
            pursue_lead,
            UID_SCHEMA,
        ),
        (
            "add_peer",
            "Trust a peer directory's snapshot signing key; its snapshots then seed leads.",
            add_peer,
            _schema("uid", "pubKey", required=("uid", "pubKey")),
        ),
        ("remove_peer", "Forget a peer directory.", remove_peer, UID_SCHEMA),
        (
            "verify_peer",
            "Buy and verify a peer's signed snapshot; unknown providers become leads.",
            verify_peer,
            UID_SCHEMA,
        ),
        (
            "run_verification",
            "Spot-check a live listing with a fresh paid test, funded by the provider's residual balance.",
            run_verification,
            UID_SCHEMA,
        ),
        ("recrawl", "Refresh a live listing's catalog now (free tools/list).", recrawl, UID_SCHEMA),
        ("unlist", "Take a listing down immediately.", unlist, UID_SCHEMA),
        (
            "flag",
            "Attach a moderation note to a provider entry.",
            flag,
            _schema("uid", "note", required=("uid", "note")),
        ),
        ("stats", "Index, lead, peer, and outbound spend summary.", stats, EMPTY_SCHEMA),
    ]

    for name, description, handler, schema in tools:

        def guarded(inner: Handler) -> Handler:
            async def run(ctx: CallContext, args: dict[str, Any]) -> Any:
                if not policy.is_admin(ctx.peer):
                    raise ValueError("admin only")
                return await inner(ctx, args)

            return run

        harness.add_tool(name, guarded(handler), description=description, input_schema=schema)
