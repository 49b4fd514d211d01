"""Per-call RTP state without I/O: the send side's numbering and the receive side's liveness.

`RtpSender` owns one outgoing stream: a random SSRC, a sequence number that wraps at 2**16 and
a timestamp that advances by samples (never by wall time) and wraps at 2**32, both starting at
random values as RFC 3550 asks. `MediaTimeout` notices a peer that stopped sending (a dead
phone, a NAT that closed) so the call can be hung up; it pauses while the call is on hold,
because a held peer legitimately sends nothing.
"""

from __future__ import annotations

import random

from gateway.rtp.packet import RtpPacket
from gateway.rtp.telephone_event import press_packets


class RtpSender:
    def __init__(self, payload_type: int, rng: random.Random, clock_rate: int = 8000) -> None:
        self.payload_type = payload_type
        self.clock_rate = clock_rate
        self.ssrc = rng.getrandbits(32)
        self.sequence_number = rng.getrandbits(16)
        self.timestamp = rng.getrandbits(32)
        self._first = True

    def _packet(self, payload_type: int, payload: bytes, marker: bool, timestamp: int) -> bytes:
        packet = RtpPacket(
            payload_type=payload_type,
            marker=int(marker),
            sequence_number=self.sequence_number,
            timestamp=timestamp,
            ssrc=self.ssrc,
            payload=payload,
        )
        self.sequence_number = (self.sequence_number + 1) & 0xFFFF
        return bytes(packet.serialize())

    def audio(self, payload: bytes, samples: int) -> bytes:
        """One audio packet of `samples` samples; the first of the stream carries the marker."""
        data = self._packet(self.payload_type, payload, self._first, self.timestamp)
        self._first = False
        self.advance(samples)
        return data

    def advance(self, samples: int) -> None:
        """Move the timestamp past `samples` not sent (held or skipped packet instants)."""
        self.timestamp = (self.timestamp + samples) & 0xFFFFFFFF

    def press(
        self, event_payload_type: int, digit: str, duration_s: float, packet_s: float = 0.02
    ) -> list[bytes]:
        """A key press as RFC 4733 packets, to be sent one every `packet_s` in place of audio.

        All share the press's start timestamp; the audio timestamp then jumps past the press.
        """
        start = self.timestamp
        packets = press_packets(digit, duration_s, packet_s, self.clock_rate)
        data = [self._packet(event_payload_type, p.payload, p.marker, start) for p in packets]
        self.timestamp = (start + round(duration_s * self.clock_rate)) & 0xFFFFFFFF
        return data


class MediaTimeout:
    """Deadline after the last received packet; `expired(now)` once it passes."""

    def __init__(self, timeout_s: float, now: float) -> None:
        self.timeout_s = timeout_s
        self._last = now
        self._paused = False

    def packet(self, now: float) -> None:
        self._last = max(self._last, now)

    def pause(self) -> None:
        self._paused = True

    def resume(self, now: float) -> None:
        self._paused = False
        self._last = now

    def deadline(self) -> float | None:
        return None if self._paused else self._last + self.timeout_s

    def expired(self, now: float) -> bool:
        deadline = self.deadline()
        return deadline is not None and now >= deadline
