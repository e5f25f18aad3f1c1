"""The settings in force of one bridge and the endpoint they open (BRIDGE.md
§Settings): every change is one read-modify-write under one lock, written to
``mcpclient.json`` before memory follows it; de-listed bots' links close, and
the owned listener is started, stopped or restarted to match (a new token
cuts every stream opened under the old one). :class:`~._bridge.Bridge` is
built on this class."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.abc
import anyio.to_thread

from brmcp._ops.listener import OwnedListener, bind_failure_hint
from brmcp.bridge.agent import BotProxy, BridgeApp
from brmcp.bridge.base import (
    BridgeError,
    Settings,
    SettingsFileBroken,
    broken_file_refusal,
    cli_command,
    describe_changes,
    load_settings,
    mint_token,
    save_settings,
    settings_file_problem,
    with_allowed,
)
from brmcp.bridge.links import BotLink

from ._config import BridgeConfig

__all__ = ["SettingsKeeper", "http_url"]

log = logging.getLogger("brmcp.bridge")


def http_url(bound: tuple[str, int] | None, address: str) -> str:
    """``http://host:port`` of a bound listener (``address`` when unknown)."""
    if bound is None:
        return f"http://{address}"
    host, port = bound
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class SettingsKeeper:
    """The settings of the bridge built on ``config`` (kept in
    ``_settings_path``) and its owned listener."""

    config: BridgeConfig
    _data_dir: Path
    _settings: Settings
    _settings_path: Path
    _commit_lock: anyio.Lock
    _reconcile_lock: anyio.Lock
    _app: BridgeApp
    _links: dict[str, BotLink]
    _proxies: dict[str, BotProxy]
    _tg: anyio.abc.TaskGroup | None
    _closed: bool
    _listener: OwnedListener | None
    _listener_token: str

    @property
    def settings(self) -> Settings:
        """The settings in force."""
        return self._settings

    def _current(self) -> Settings:
        return self._settings

    def _allow_peer(self, peer: str) -> bool:
        return self._settings.allows(peer)

    async def apply_settings(self, settings: Settings) -> Settings:
        """Apply and persist ``settings`` hot (BRIDGE.md §Settings): defaults
        are applied, allowed bots validated, a 32-hex token minted when
        enabled without one; the file is written atomically (mode 0600);
        links of de-listed bots are closed; the owned listener is started,
        stopped, or restarted when the token changed (which cuts every
        stream opened under the old token). Returns the applied settings.

        Raises :class:`SettingsError` (invalid), :class:`SettingsFileBroken`
        (``mcpclient.json`` was edited and fails to load: it is not
        overwritten) or :class:`BridgeError` (write failed) with the prior
        settings still in force; a :class:`BridgeError` from binding the
        listener leaves the new settings applied and persisted."""
        applied = await self._commit_settings(lambda _current: settings, source="apply_settings")
        await self._reconcile()
        return applied

    async def update_settings(self, change: Callable[[Settings], Settings], *, source: str) -> Settings:
        """Apply ``change`` (the settings in force → the new settings) to the
        settings current when it holds the bridge's one settings lock, then
        commit the result as :meth:`apply_settings` does (without touching
        the listener: call :meth:`apply_settings` or a reload for that).
        Changes made at the same moment compose: the end state is that of
        some serial order of them (BRIDGE.md §Settings). ``change`` must not
        block; returning its argument itself writes nothing. ``source``
        names the writer in the log. Returns the settings in force. Raises
        what ``change`` raises, and what :meth:`apply_settings` raises, with
        the prior settings in force."""
        return await self._commit_settings(change, source=source)

    async def reload_settings(self) -> Settings:
        """Re-read ``mcpclient.json`` (edited by hand or by another process)
        and apply it without rewriting it: no token is minted. Raises
        :class:`BridgeError` for a malformed file (nothing changes)."""
        async with self._commit_lock:
            # Read under the lock: a file read before a concurrent commit and
            # installed after it would undo that commit.
            loaded = await anyio.to_thread.run_sync(load_settings, self._settings_path)
            self._install(loaded, source=f"reload of {self._settings_path}")
        await self._reconcile()
        return loaded

    async def _commit_settings(self, change: Callable[[Settings], Settings], *, source: str) -> Settings:
        # The one writer of the settings: every change is read-modify-write
        # against the settings in force once the lock is held, so two changes
        # at the same moment cannot each build on a copy taken before the
        # other's commit (which would silently drop one of them).
        async with self._commit_lock:
            current = self._settings
            candidate = change(current)
            if candidate is current:
                return current
            settings = candidate.normalized()
            settings.validate()
            if settings.enabled and not settings.token:
                settings = settings.replace(token=mint_token())
            # A hand edit that fails to load (its reload was refused) holds
            # other changes too: writing the settings in force over it would
            # lose them.
            problem = await anyio.to_thread.run_sync(settings_file_problem, self._settings_path)
            if problem is not None:
                raise SettingsFileBroken(broken_file_refusal(problem))
            # Shielded: once the file is written, memory must follow it.
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(save_settings, self._settings_path, settings)
                self._install(settings, source=source)
        return settings

    def _install(self, settings: Settings, *, source: str) -> None:
        previous = self._settings
        self._settings = settings
        changes = describe_changes(previous, settings)
        if changes:
            log.info("settings changed (%s): %s", source, changes)
        for uid in list(self._links):
            if not settings.allows(uid):
                self._app.drop(uid)
                self._links.pop(uid).close()
                self._proxies.pop(uid, None)
        if not settings.enabled or settings.token != previous.token:
            self._app.drop_all()

    def _schedule_reconcile(self) -> None:
        tg = self._tg
        if tg is not None:
            tg.start_soon(self._reconcile_logged)

    async def _reconcile_logged(self) -> None:
        try:
            await self._reconcile()
        except BridgeError as exc:
            log.error("%s", exc)

    async def _reconcile(self) -> None:
        """Bring the owned listener in line with the settings."""
        async with self._reconcile_lock:
            address = self.config.listen
            tg = self._tg
            if address is None or tg is None or self._closed:
                return
            settings = self._settings
            listener = self._listener
            restart = False
            if listener is not None and (not settings.enabled or settings.token != self._listener_token):
                self._listener = None
                bound = listener.address
                await listener.stop()
                restart = settings.enabled
                if not settings.enabled:
                    log.info("bridge disabled: endpoint %s closed", http_url(bound, address))
            if settings.enabled and self._listener is None:
                listener = OwnedListener(self._app, address, self.config.listener_limits)
                try:
                    bound = await listener.start(tg)
                except OSError as exc:
                    raise BridgeError(
                        f"listen {address}: {exc}{bind_failure_hint(exc, self.cli_command)}"
                    ) from None
                self._listener = listener
                self._listener_token = settings.token
                url = http_url(bound, address)
                if restart:
                    log.info("bridge token changed: endpoint %s restarted, agent streams cut", url)
                else:
                    log.info("bridge enabled: endpoint open at %s/mcp/<bot uid>", url)

    async def allow_bot(self, uid: str) -> None:
        """Put ``uid`` on ``allowed_bots`` through the settings commit (as the
        admin API's settings change, which ``brmcp-bridge add`` uses), and
        change nothing else; nothing when it is already there. Raises
        :class:`SettingsFileBroken` or :class:`BridgeError` (nothing changed)."""
        await self._commit_settings(
            lambda current: with_allowed(current, [uid]), source="bot request approved"
        )

    @property
    def cli_command(self) -> str:
        """How hints and the approvals page name the command line:
        ``brmcp-bridge``, plus ``--datadir <data dir>`` unless it is the default."""
        return cli_command(self._data_dir)
