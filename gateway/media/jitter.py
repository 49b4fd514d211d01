"""A time-based adaptive jitter buffer for one incoming audio stream (sans-IO).

Packets go in with their arrival time; the consumer pulls one packet's worth of audio at a
time on its own steady clock and is told what to play:

    PACKET   the next packet, in sequence order
    LOST     the next packet never came but later ones did: conceal it (FEC from `payload`,
             the packet after it, when buffered) and move on
    EMPTY    nothing buffered at all: conceal without moving on, so a late packet still plays
    WAITING  playout has not started (the first packet has not waited its target delay)

Why not count packets (aiortc's buffer waits for a fill level and so keeps every bit of delay a
loss or a reordering ever added): here delay is measured in time. Every packet's delay
relative to the earliest it could have been played (its wait in the buffer plus how late it
arrived against the stream's best transit time over the last window) is tracked; while that
delay stays above the target by a whole packet, one packet is dropped, and while it stays
below by a whole packet, one concealment unit is inserted. The target follows the arrival
jitter (95th percentile of transit over the window, plus a margin), bounded to
[min_delay_s, max_delay_s]. A loss, a reordering, duplicates or a sender whose clock runs fast
or slow therefore cost concealment or a dropped packet, never lasting delay.
"""

from collections import deque
from dataclasses import dataclass
from enum import Enum

import numpy as np

SEQ_MOD = 1 << 16
TS_MOD = 1 << 32
# RFC 3550 appendix A.1: a jump further than these, then the next number, is a renumbered
# stream (an SBC passing a new source through under the same SSRC), not loss or reordering
MAX_DROPOUT = 3000
MAX_MISORDER = 100


class Unit(Enum):
    PACKET = "packet"
    LOST = "lost"
    EMPTY = "empty"
    WAITING = "waiting"


class Arrival(Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    LATE = "late"
    RESTARTED = "restarted"  # a jump in sequence numbers: the stream was reset
    HELD = "held"  # a jump far ahead, dropped until the next number confirms it (RFC 3550 A.1)


@dataclass(frozen=True)
class JitterConfig:
    clock_rate: int = 48000  # RTP clock, Hz
    packet_samples: int = 960  # assumed packet duration until the stream shows its own
    min_delay_s: float = 0.04
    max_delay_s: float = 0.2
    margin_s: float = 0.01  # added to the 95th percentile of arrival jitter
    window_s: float = 2.0  # statistics window
    settle_packets: int = 25  # evidence needed between two delay adjustments

    def __post_init__(self) -> None:
        if not 0 < self.min_delay_s <= self.max_delay_s:
            raise ValueError(
                "the jitter buffer's target delay needs 0 < min <= max, got min "
                f"{self.min_delay_s * 1000:g} ms and max {self.max_delay_s * 1000:g} ms"
            )
        if self.clock_rate <= 0 or self.packet_samples <= 0:
            raise ValueError("clock rate and packet samples must be positive")


@dataclass(frozen=True)
class Playout:
    unit: Unit
    payload: bytes | None  # PACKET: its payload; LOST: the following packet (for FEC) if any
    samples: int  # duration in RTP clock samples
    delay_s: float | None = None  # PACKET: its delay beyond the earliest possible playout


@dataclass
class JitterCounters:
    received: int = 0
    played: int = 0
    lost: int = 0
    empty: int = 0
    late: int = 0
    duplicate: int = 0
    dropped: int = 0  # played-out delay reduced by one packet
    stretched: int = 0  # played-out delay raised by one packet
    restarts: int = 0
    held: int = 0  # packets that jumped far ahead, unconfirmed: dropped


@dataclass(frozen=True)
class _Packet:
    timestamp: int
    payload: bytes
    arrival_s: float
    lateness_s: float  # transit minus the window's best transit, at arrival


class JitterBuffer:
    def __init__(self, config: JitterConfig | None = None) -> None:
        self.config = config or JitterConfig()
        self.counters = JitterCounters()
        self._window_packets = max(4, round(self.config.window_s * 50))
        self._restart()

    def _restart(self) -> None:
        self._packets: dict[int, _Packet] = {}
        self._highest: int | None = None  # extended sequence number
        self._next: int | None = None  # extended sequence number to play next
        self._first_arrival_s: float | None = None
        self._transits: deque[float] = deque(maxlen=self._window_packets)
        self._lateness = np.zeros(self._window_packets)  # ring of arrivals' lateness, s
        self._lateness_count = 0
        self._target_s: float | None = None  # cached until the next arrival
        self._delays: deque[float] = deque(maxlen=self.config.settle_packets)
        self._packet_samples = self.config.packet_samples
        self._ts_base: int | None = None  # the first arrival's timestamp, unwrapped
        self._ts_latest = 0  # the latest timestamp seen, unwrapped (past 2**32)
        self._stretch = False
        self._played_ts: int | None = None  # the last played packet's timestamp
        self._concealed = 0  # samples concealed (EMPTY, LOST) since that packet
        self._ssrc: int | None = None
        self._bad_seq: int | None = None  # the number that confirms a jump (RFC 3550 A.1)
        self.recent_delays_s: deque[float] = deque(maxlen=self._window_packets)

    # -- arrivals ----------------------------------------------------------------------------

    def push(
        self, seq: int, timestamp: int, payload: bytes, now_s: float, ssrc: int | None = None
    ) -> Arrival:
        """`ssrc`: the sender's, when known; a new one starts the stream over whatever its
        sequence numbers (a PBX that moves the media to another server starts a new stream,
        whose numbers may lie anywhere, behind the old ones too)."""
        ext = self._extend(seq)
        outcome = Arrival.ACCEPTED
        new_sender = ssrc is not None and self._ssrc is not None and ssrc != self._ssrc
        jump = 0 if self._highest is None else ext - self._highest
        if new_sender or abs(jump) > SEQ_MOD // 4 or self._renumbered(seq, jump):
            self._restart()
            self.counters.restarts += 1
            ext = seq
            outcome = Arrival.RESTARTED
        elif jump > MAX_DROPOUT:  # kept out, and _highest with it, so the next can confirm
            self.counters.held += 1
            return Arrival.HELD
        if ssrc is not None:
            self._ssrc = ssrc
        if ext in self._packets:
            self.counters.duplicate += 1
            return Arrival.DUPLICATE
        if self._next is not None and ext < self._next:
            self.counters.late += 1
            return Arrival.LATE
        self.counters.received += 1
        transit = now_s - self._seconds(timestamp)
        self._transits.append(transit)
        lateness = transit - min(self._transits)
        self._lateness[self._lateness_count % self._lateness.size] = lateness
        self._lateness_count += 1
        self._target_s = None
        self._packets[ext] = _Packet(timestamp, payload, now_s, lateness)
        self._learn_duration(ext)
        if self._highest is None or ext > self._highest:
            self._highest = ext
        if self._first_arrival_s is None:
            self._first_arrival_s = now_s
        self._trim()
        return outcome

    def _renumbered(self, seq: int, jump: int) -> bool:
        """A jump past MAX_DROPOUT ahead or MAX_MISORDER behind, confirmed by the next number
        (the jumping packet itself is dropped, as RFC 3550 A.1 does). Without this, a stream
        renumbered 1000 behind was dropped as late for 20 s."""
        if -MAX_MISORDER <= jump <= MAX_DROPOUT:
            self._bad_seq = None
            return False
        if seq == self._bad_seq:
            return True
        self._bad_seq = (seq + 1) % SEQ_MOD
        return False

    def _extend(self, seq: int) -> int:
        if self._highest is None:
            return seq
        delta = (seq - self._highest) % SEQ_MOD
        if delta >= SEQ_MOD // 2:
            delta -= SEQ_MOD
        return self._highest + delta

    def _seconds(self, timestamp: int) -> float:
        """Sender time of `timestamp`, from the first arrival's, unwrapped like sequence
        numbers: a packet sent before the first one to arrive (reordered) is a little earlier,
        not 2**32 samples later, which would poison the window's best transit."""
        if self._ts_base is None:
            self._ts_base = self._ts_latest = timestamp
        delta = (timestamp - self._ts_latest) % TS_MOD
        if delta >= TS_MOD // 2:
            delta -= TS_MOD
        unwrapped = self._ts_latest + delta
        self._ts_latest = max(self._ts_latest, unwrapped)
        return (unwrapped - self._ts_base) / self.config.clock_rate

    def _learn_duration(self, ext: int) -> None:
        for a, b in ((ext - 1, ext), (ext, ext + 1)):
            if a in self._packets and b in self._packets:
                step = (self._packets[b].timestamp - self._packets[a].timestamp) % TS_MOD
                # 2.5 ms (Opus's shortest frame) to 120 ms: a sender stepping its timestamps by
                # 1 would otherwise let the buffer (bounded in packets of this length) grow huge
                if self.config.clock_rate * 0.0025 <= step <= self.config.clock_rate * 0.12:
                    self._packet_samples = step

    def _trim(self) -> None:
        """Bound the buffer to twice the largest delay it may ever hold."""
        limit = 2 * self.config.max_delay_s * self.config.clock_rate / self._packet_samples
        while len(self._packets) > max(4, int(limit)):
            oldest = min(self._packets)
            del self._packets[oldest]
            self.counters.dropped += 1
            if self._next is not None and oldest >= self._next:
                self._next = oldest + 1

    # -- playout -----------------------------------------------------------------------------

    @property
    def target_delay_s(self) -> float:
        if self._target_s is None:
            cfg = self.config
            window = self._lateness[: min(self._lateness_count, self._lateness.size)]
            p95 = 0.0
            if window.size >= 2:
                k = int(0.95 * (window.size - 1))
                p95 = float(np.partition(window, k)[k])
            self._target_s = min(cfg.max_delay_s, max(cfg.min_delay_s, p95 + cfg.margin_s))
        return self._target_s

    @property
    def packet_s(self) -> float:
        return self._packet_samples / self.config.clock_rate

    def pull(self, now_s: float) -> Playout:
        samples = self._packet_samples
        if self._next is None:
            first = self._first_arrival_s
            if first is None or now_s - first < self.target_delay_s:
                return Playout(Unit.WAITING, None, samples)
            self._next = min(self._packets)
        if self._stretch:
            self._stretch = False
            self.counters.stretched += 1
            return Playout(Unit.EMPTY, None, samples)
        if self._next not in self._packets and self._packets:
            self._skip_concealed_gap()
        packet = self._packets.pop(self._next, None)
        if packet is not None:
            self._next += 1
            self._played_ts, self._concealed = packet.timestamp, 0
            self.counters.played += 1
            delay = now_s - packet.arrival_s + packet.lateness_s
            self.recent_delays_s.append(delay)
            self._delays.append(delay)
            self._adapt()
            return Playout(Unit.PACKET, packet.payload, samples, delay)
        self._concealed += samples
        if self._packets:
            self._next += 1
            self.counters.lost += 1
            following = self._packets.get(self._next)
            return Playout(Unit.LOST, following.payload if following else None, samples)
        self.counters.empty += 1
        self._delays.clear()
        return Playout(Unit.EMPTY, None, samples)

    def _skip_concealed_gap(self) -> None:
        """Play the next buffered packet now if the audio between it and the last one played
        is all concealed already: by EMPTY while nothing had arrived (a burst loss longer than
        the buffer), or none at all (numbers taken by RFC 4733 events sent beside the audio).
        Without this, a burst was concealed twice: as EMPTY, then again as LOST."""
        if self._played_ts is None:
            return
        following = min(self._packets)
        unheard = (self._packets[following].timestamp - self._played_ts) % TS_MOD
        unheard -= self._packet_samples
        if unheard < TS_MOD // 2 and unheard - self._concealed < self._packet_samples // 2:
            self._next = following

    def _adapt(self) -> None:
        """Move the played-out delay one packet towards the target once evidence settles."""
        if len(self._delays) < self.config.settle_packets:
            return
        assert self._next is not None
        target, step = self.target_delay_s, self.packet_s
        least = min(self._delays)
        if least > target + step and self._next in self._packets:
            del self._packets[self._next]
            self._next += 1
            self.counters.dropped += 1
            self._delays.clear()
        elif max(self._delays) < target - step:
            self._stretch = True
            self._delays.clear()

    @property
    def buffered(self) -> int:
        return len(self._packets)
