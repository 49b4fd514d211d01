"""RFC 4733 telephone-events (DTMF over RTP): the payload, a receiver and a sender.

Payload (4 bytes):  event (8) | E (1) | R (1) | volume (6) | duration (16, timestamp units)

One key press is a run of packets that share one RTP timestamp (the event's start): the first
carries the marker bit, each later one a longer duration, and the last three repeat the final
duration with the E bit set, because the end must survive loss. The receiver therefore keys a
press by (SSRC, RTP timestamp) and reports each press exactly once, when its end arrives, or
when a later press starts before the end of this one was seen.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass

DIGITS = "0123456789*#ABCD"
FLASH_EVENT = 16  # hook flash: an event, not a digit
_REMEMBERED_PRESSES = 32  # enough to swallow the redundant end packets of recent presses


class TelephoneEventError(ValueError):
    """A payload that is not a 4-byte RFC 4733 event."""


@dataclass(frozen=True)
class TelephoneEvent:
    event: int
    end: bool
    volume: int  # dBm0 below zero, 0..63
    duration: int  # timestamp units since the event's RTP timestamp

    @property
    def digit(self) -> str | None:
        return DIGITS[self.event] if self.event < len(DIGITS) else None

    def encode(self) -> bytes:
        if not (0 <= self.event < 256 and 0 <= self.volume < 64 and 0 <= self.duration < 65536):
            raise TelephoneEventError(f"field out of range in {self}")
        return struct.pack("!BBH", self.event, (self.end << 7) | self.volume, self.duration)


def parse_event(payload: bytes) -> TelephoneEvent:
    # RFC 4733 allows several events in one packet only for redundancy (RFC 2198), which is
    # negotiated separately; a plain telephone-event payload is exactly four bytes.
    if len(payload) != 4:
        raise TelephoneEventError(f"telephone-event payload has {len(payload)} bytes, not 4")
    event, flags, duration = struct.unpack("!BBH", payload)
    return TelephoneEvent(event, bool(flags & 0x80), flags & 0x3F, duration)


@dataclass(frozen=True)
class Dtmf:
    """One key press, reported once: the digit and how long it was held."""

    digit: str
    duration_s: float


class EventReceiver:
    """Turns telephone-event packets into `Dtmf` presses, each exactly once."""

    def __init__(self, clock_rate: int = 8000) -> None:
        self._clock_rate = clock_rate
        self._reported: deque[tuple[int, int]] = deque(maxlen=_REMEMBERED_PRESSES)
        self._open: tuple[tuple[int, int], TelephoneEvent] | None = None

    def receive(self, ssrc: int, timestamp: int, payload: bytes) -> list[Dtmf]:
        """Feed one packet's SSRC, RTP timestamp and payload; raises TelephoneEventError."""
        event = parse_event(payload)
        key = (ssrc, timestamp)
        if key in self._reported:
            return []
        presses: list[Dtmf] = []
        if self._open is not None and self._open[0] != key:
            # A new press began though the previous one's end packets were all lost.
            presses.extend(self._report(*self._open))
        if event.end:
            presses.extend(self._report(key, event))
        else:
            self._open = (key, event)
        return presses

    def _report(self, key: tuple[int, int], event: TelephoneEvent) -> list[Dtmf]:
        self._open = None
        self._reported.append(key)
        if event.digit is None:
            return []
        return [Dtmf(event.digit, event.duration / self._clock_rate)]


@dataclass(frozen=True)
class EventPacket:
    """One packet of a press, for an RTP sender: same timestamp for all, marker on the first."""

    marker: bool
    payload: bytes


def press_packets(
    digit: str, duration_s: float, packet_s: float = 0.02, clock_rate: int = 8000, volume: int = 10
) -> list[EventPacket]:
    """The RFC 4733 packet sequence for one key press: updates, then three end packets."""
    if digit not in DIGITS or len(digit) != 1:
        raise TelephoneEventError(f"not a DTMF digit: {digit!r}")
    event = DIGITS.index(digit)
    step = round(packet_s * clock_rate)
    total = min(round(duration_s * clock_rate), 0xFFFF)
    if step <= 0 or total < step:
        raise TelephoneEventError("a press lasts at least one packet")
    packets = [
        EventPacket(elapsed == step, TelephoneEvent(event, False, volume, elapsed).encode())
        for elapsed in range(step, total, step)
    ]
    end = TelephoneEvent(event, True, volume, total).encode()
    packets.extend(EventPacket(not packets and i == 0, end) for i in range(3))
    return packets
