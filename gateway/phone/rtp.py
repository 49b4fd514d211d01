"""One phone call's RTP socket: packets in to the uplink, paced packets out of the downlink.

Receive: audio payloads of the negotiated codec go to the call's jitter buffer with their
arrival time; telephone-events (RFC 4733) become key presses; RTCP and anything else is
ignored. Symmetric RTP: audio is sent where the peer's packets come from once they come,
since a peer behind NAT advertises an address it cannot be reached at. The first sender is
kept until the next offer or answer: packets from anyone else are dropped, so a third party
that finds the port can neither speak into the call nor steer its audio elsewhere.

Send: the pacer calls `send_packet` at each of this stream's packet instants; while the peer
holds the call (our direction recvonly or inactive) the packet's audio is taken and dropped,
so the send queue stays on time and resuming plays current audio, not the hold's backlog.
"""

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from gateway.media.session import MediaSession
from gateway.phone.codec import RATE, encoder
from gateway.rtp.packet import RtpParseError, is_rtcp_datagram, parse_rtp
from gateway.rtp.session import MediaTimeout, RtpSender
from gateway.rtp.telephone_event import Dtmf, EventReceiver, TelephoneEventError
from gateway.sip.sdp import AudioStream
from gateway.sip.transaction import Address

log = logging.getLogger(__name__)

SENDING = ("sendrecv", "sendonly")


@dataclass
class RtpCounters:
    received: int = 0  # audio packets handed to the jitter buffer
    events: int = 0  # telephone-event packets
    ignored: int = 0  # RTCP, other payload types, malformed packets
    sent: int = 0
    held: int = 0  # packet instants passed while the peer held the call
    skipped: int = 0  # packet instants passed while the sender was late
    latched: int = 0  # times the send address moved to where packets came from


class RtpStream(asyncio.DatagramProtocol):
    def __init__(
        self,
        call_id: str,
        stream: AudioStream,
        session: MediaSession,
        rng: random.Random,
        timeout_s: float,
        on_dtmf: Callable[[Dtmf], None],
    ) -> None:
        self.call_id = call_id
        self.session = session
        self.counters = RtpCounters()
        self.timeout = MediaTimeout(timeout_s, time.monotonic())
        self.next_instant: int | None = None  # pacer's 10 ms instant of the next packet
        self._sender = RtpSender(stream.payload_type, rng)
        self._events = EventReceiver(RATE)
        self._on_dtmf = on_dtmf
        self._transport: asyncio.DatagramTransport | None = None
        self.remote: Address = (stream.remote_address, stream.remote_port)
        self._source: Address | None = None  # the peer's sender, learnt from its first packet
        self.accept(stream)

    def accept(self, stream: AudioStream) -> None:
        """Take what offer/answer settled (an outbound call learns it only from the answer),
        the send queue's packet size included."""
        self.stream = stream
        self.packet_ms = stream.ptime_ms
        self.session.downlink.packet_samples = stream.ptime_ms * RATE // 1000
        self._encode = encoder(stream.codec)
        self._sender.payload_type = stream.payload_type
        self.set_direction(stream.direction, (stream.remote_address, stream.remote_port))

    # -- socket ------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.DatagramTransport, transport)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        now = time.monotonic()
        if is_rtcp_datagram(data):
            self.counters.ignored += 1
            return
        try:
            packet = parse_rtp(data)
        except RtpParseError:
            self.counters.ignored += 1
            return
        kind = packet.payload_type
        source = (str(addr[0]), int(addr[1]))
        if kind not in (self.stream.payload_type, self.stream.telephone_event) or (
            self._source is not None and source != self._source
        ):
            self.counters.ignored += 1  # not ours, or injected by a third party
            return
        if self._source is None:
            self._latch(source)
        if kind == self.stream.payload_type:
            self.counters.received += 1
            self.session.uplink.receive(
                packet.sequence_number, packet.timestamp, packet.payload, now, packet.ssrc
            )
        elif kind == self.stream.telephone_event:
            self.counters.events += 1
            try:
                presses = self._events.receive(packet.ssrc, packet.timestamp, packet.payload)
            except TelephoneEventError:
                presses = []
            for press in presses:
                self._on_dtmf(press)
        self.timeout.packet(now)

    def _latch(self, source: Address) -> None:
        """Take the first sender of this stream as the peer, and send there from now on."""
        self._source = source
        if source != self.remote:
            log.info("call %s: RTP comes from %s:%d, sending there", self.call_id, *source)
            self.remote = source
            self.counters.latched += 1

    # -- sending -----------------------------------------------------------------------------

    def set_direction(self, direction: str, remote: Address | None) -> None:
        """After an offer or answer: our direction, and the peer's media address (None: same).

        The RTP timeout runs only while the peer should be sending: not while it holds the
        call, nor while an outbound call still rings.
        """
        self.direction = direction
        if remote is not None:
            self.remote = remote
            self._source = None  # a new media address: learn the sender again
        if direction == "sendrecv":
            self.timeout.resume(time.monotonic())
        else:
            self.timeout.pause()  # a held phone may legitimately send nothing

    def skip(self, packets: int) -> None:
        """Packet instants that passed unsent: drop their audio, keep the RTP clock on time."""
        self.counters.skipped += packets
        self.session.downlink.skip(packets)
        self._sender.advance(packets * self.session.downlink.packet_samples)

    def send_packet(self) -> None:
        pcm = self.session.downlink.next_packet()
        if self.direction not in SENDING or self._transport is None:
            self.counters.held += 1
            self._sender.advance(pcm.size)
            return
        self._transport.sendto(self._sender.audio(self._encode(pcm), pcm.size), self.remote)
        self.counters.sent += 1

    @property
    def local(self) -> Address | None:
        if self._transport is None:
            return None
        host, port = self._transport.get_extra_info("sockname")[:2]
        return str(host), int(port)

    def describe(self) -> dict[str, object]:
        local = self.local
        return {
            "codec": self.stream.codec,
            "ptime_ms": self.stream.ptime_ms,
            "telephone_event": self.stream.telephone_event,
            "direction": self.direction,
            "local_rtp": None if local is None else f"{local[0]}:{local[1]}",
            "remote_rtp": f"{self.remote[0]}:{self.remote[1]}",
            "rtp": vars(self.counters).copy(),
        }
