"""Sends every phone call's RTP on the engine's grid, from one task.

Packet times of 10, 20, 30 and 60 ms all fall on a 10 ms grid anchored at the media clock's
pump instants, so one loop wakes at the 10 ms instants some stream is due at (plus a small
offset: after the pump that read the engine's output) and sends those streams one packet each.
Instants are absolute: a late wake-up sends the packet at once and never shifts later ones; a
stream that missed whole packet instants skips them, audio and RTP timestamps alike, as
`PacedAudioTrack` does for WebRTC. One task instead of one per call keeps fifty calls at
about a hundred wake-ups a second.
"""

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Protocol

from gateway.media.clock import PumpGrid

log = logging.getLogger(__name__)

INSTANT_S = 0.01  # the common divisor of every G.711 packet time
SEND_OFFSET_S = 0.002  # after the pump that reads the engine's output


class PacedStream(Protocol):
    """What the pacer needs of a stream (gateway/phone/rtp.py `RtpStream`)."""

    call_id: str
    packet_ms: int  # a multiple of 10
    next_instant: int | None  # the pacer's bookkeeping: 10 ms instant of the next packet

    def skip(self, packets: int) -> None: ...

    def send_packet(self) -> None: ...


def instant_index(grid: PumpGrid, now_s: float) -> int:
    """The last 10 ms send instant at or before now."""
    origin = grid.instant(0) + SEND_OFFSET_S
    return math.floor((now_s - origin) / INSTANT_S + 1e-9)


def instant_time(grid: PumpGrid, index: int) -> float:
    return grid.instant(0) + SEND_OFFSET_S + index * INSTANT_S


class RtpPacer:
    def __init__(self, grid: Callable[[], PumpGrid]) -> None:
        self._grid = grid  # read at each wake-up: the grid is replaced when the engine restarts
        self.streams: dict[str, PacedStream] = {}
        self._added = asyncio.Event()

    def add(self, stream: PacedStream) -> None:
        self.streams[stream.call_id] = stream
        self._added.set()  # an idle pacer wakes for the new stream's first packet

    def remove(self, call_id: str) -> None:
        self.streams.pop(call_id, None)

    def send_due(self, index: int) -> None:
        """Send one packet for every stream due at or before 10 ms instant `index`."""
        for stream in list(self.streams.values()):
            step = stream.packet_ms // 10
            if stream.next_instant is None:
                stream.next_instant = (index // step + 1) * step  # the stream's first instant
                continue
            if stream.next_instant > index:
                continue
            behind = (index - stream.next_instant) // step
            if behind:
                stream.skip(behind)
            stream.send_packet()
            stream.next_instant += (behind + 1) * step

    def next_due(self, index: int) -> int:
        pending = [s.next_instant for s in self.streams.values()]
        if any(p is None for p in pending):
            return index + 1
        return max(index + 1, min((p for p in pending if p is not None), default=index + 1))

    async def run(self) -> None:
        index = instant_index(self._grid(), time.monotonic())
        while True:
            if not self.streams:
                self._added.clear()
                await self._added.wait()
                index = instant_index(self._grid(), time.monotonic())
                continue
            grid = self._grid()
            index = self.next_due(index)
            delay = instant_time(grid, index) - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            index = max(index, instant_index(grid, time.monotonic()))
            try:
                self.send_due(index)
            except Exception:
                log.exception("RTP pacing failed")
