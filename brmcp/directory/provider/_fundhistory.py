"""The provider's fund history ``regfund.json``: a JSON array of
``{"ts": unix seconds, "directoryUid": uid, "atoms": n}`` (the Go
reference's file, karamble/brmcp ``directory/registrant.go``), each payment
recorded before the money moves so a crash can only over-count against the
monthly cap."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from ._regconfig import RegistrantError, lookup_field

__all__ = ["FUND_FILE", "FundEntry", "FundHistory"]

#: The fund history file in the data directory (the Go reference's name).
FUND_FILE = "regfund.json"


@dataclass(frozen=True, slots=True)
class FundEntry:
    """One auto-funded listing payment: unix seconds, directory uid, atoms."""

    ts: int
    directory_uid: str
    atoms: int

    def to_json(self) -> dict[str, Any]:
        return {"ts": self.ts, "directoryUid": self.directory_uid, "atoms": self.atoms}


class FundHistory:
    """The payments the monthly cap counts, persisted at ``path`` (a JSON
    array of :class:`FundEntry` objects, two-space indent, as the Go
    reference writes it). File access runs in a worker thread."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._entries: list[FundEntry] = []
        self._loaded = False
        self._lock = anyio.Lock()

    @property
    def entries(self) -> tuple[FundEntry, ...]:
        return tuple(self._entries)

    async def load(self) -> None:
        """Read the file (a missing file is an empty history); once.
        Raises :class:`RegistrantError` naming the file when it cannot be
        read or is not a fund history."""
        async with self._lock:
            if not self._loaded:
                self._entries = await anyio.to_thread.run_sync(self._read)
                self._loaded = True

    def _read(self) -> list[FundEntry]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError) as exc:
            raise RegistrantError(f"{self.path}: cannot read the fund history: {exc}") from None
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise RegistrantError(f"{self.path}: fund history corrupt: {exc}") from None
        if data is None:
            return []
        if not isinstance(data, list):
            raise RegistrantError(f"{self.path}: fund history corrupt: expected a JSON array")
        out: list[FundEntry] = []
        for index, item in enumerate(data):
            if not isinstance(item, Mapping):
                raise RegistrantError(f"{self.path}: fund history corrupt: entry {index} is not an object")
            ts = lookup_field(item, "ts")
            uid = lookup_field(item, "directoryUid")
            atoms = lookup_field(item, "atoms")
            if (
                isinstance(ts, bool)
                or not isinstance(ts, int)
                or isinstance(atoms, bool)
                or not isinstance(atoms, int)
                or atoms < 0
                or not isinstance(uid, str)
            ):
                raise RegistrantError(
                    f"{self.path}: fund history corrupt: entry {index} needs whole ts and atoms >= 0 "
                    "and a string directoryUid"
                )
            out.append(FundEntry(ts=ts, directory_uid=uid, atoms=atoms))
        return out

    def total_since(self, ts: int) -> int:
        """Atoms of the entries at or after unix second ``ts``."""
        return sum(e.atoms for e in self._entries if e.ts >= ts)

    async def record(self, entry: FundEntry) -> None:
        """Append ``entry`` and rewrite the file (temporary file, fsync,
        rename; mode 0600). The entry counts in memory even when the write
        fails (OSError is raised): the cap over-counts, never under-counts."""
        async with self._lock:
            self._entries.append(entry)
            text = json.dumps([e.to_json() for e in self._entries], indent=2)
            await anyio.to_thread.run_sync(self._write, text)

    def _write(self, text: str) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
