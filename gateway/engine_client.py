"""The gateway's end of the engine's admission socket (see engine/control.py for the wire)."""

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class EngineUnavailable(Exception):
    """The engine's control socket is not there or went away."""


class EngineRefused(Exception):
    """The engine declined to open a call; `reason` is full or draining."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class SlotLease:
    slot: int
    generation: int
    ring: str  # of the engine that granted it: a restarted engine reuses slots and generations


class EngineClient:
    def __init__(self, path: Path, timeout_s: float = 2.0) -> None:
        self._path = path
        self._timeout_s = timeout_s
        self._lock = asyncio.Lock()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self.hello: dict[str, Any] = {}

    @property
    def connected(self) -> bool:
        """False once the engine's end of the socket is gone: a dead engine's socket reads EOF
        while asyncio keeps our writing half open (is_closing stays False)."""
        if self._writer is None or self._reader is None:
            return False
        return not self._writer.is_closing() and not self._reader.at_eof()

    async def connect(self) -> dict[str, Any]:
        try:
            self._reader, self._writer = await asyncio.open_unix_connection(str(self._path))
        except OSError as exc:
            raise EngineUnavailable(f"engine control socket {self._path}: {exc}") from exc
        self.hello = await self._request({"op": "hello"})
        return self.hello

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            await asyncio.gather(self._writer.wait_closed(), return_exceptions=True)
        self._reader = self._writer = None

    async def open(self, call_id: str) -> SlotLease:
        reply = await self._request({"op": "open", "call_id": call_id})
        if not reply.get("ok"):
            raise EngineRefused(str(reply.get("reason", "unknown")))
        return SlotLease(int(reply["slot"]), int(reply["generation"]), self.ring_name)

    @property
    def ring_name(self) -> str:
        """The ring of the engine connected to now (it names that engine), or "" before a
        hello."""
        return str(self.hello.get("ring", ""))

    async def release(self, lease: SlotLease) -> bool:
        """Free the lease's slot; False for a stale lease, or one of an engine since gone
        (it freed every slot of ours when our connection closed)."""
        if lease.ring != self.ring_name:
            return False
        reply = await self._request(
            {"op": "close", "slot": lease.slot, "generation": lease.generation}
        )
        return bool(reply.get("closed"))

    async def _request(self, request: dict[str, Any]) -> dict[str, Any]:
        async with self._lock:
            if self._reader is None or self._writer is None or self._writer.is_closing():
                raise EngineUnavailable("not connected to the engine")
            try:
                self._writer.write(json.dumps(request).encode() + b"\n")
                await self._writer.drain()
                line = await asyncio.wait_for(self._reader.readline(), self._timeout_s)
            except (OSError, TimeoutError) as exc:
                await self._drop()
                raise EngineUnavailable(f"engine control socket failed: {exc}") from exc
            if not line:
                await self._drop()
                raise EngineUnavailable("engine closed the control socket")
            reply = json.loads(line)
            if not isinstance(reply, dict):
                raise EngineUnavailable("engine sent a malformed reply")
            return reply

    async def _drop(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
