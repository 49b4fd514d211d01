"""WebRTC calls: one aiortc peer per call, with Cadence's own receive and send paths.

Receive: aiortc's audio receiver would put packets through its count-based jitter buffer
(82 ms added, 282 ms for good after one loss) and decode them on a thread. Instead each
packet is taken as it arrives from the DTLS transport, before that buffer, and fed to the
call's own time-based jitter buffer (gateway/media/jitter.py).

Send: a track whose `recv` returns one 20 ms Opus packet of the engine's audio, encoded here,
at absolute instants on the engine's grid, so aiortc only packetizes and sends it; nothing
queues ahead of time.

Captions: the page opens a data channel labelled "captions" before its offer, so the offer
carries the SCTP section (an answerer can only use what the offer negotiated); the gateway
takes that channel when it opens and sends caption text on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import logging
import time
from collections.abc import Awaitable, Callable

from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.rtp import RtpPacket
from av.packet import Packet
from av.stream import Stream

from gateway.media.clock import PumpGrid
from gateway.media.downlink import Downlink
from gateway.media.opus import OPUS_RATES, OpusEncoder
from gateway.media.uplink import Uplink

log = logging.getLogger(__name__)

OPUS_CLOCK = 48000  # Opus's RTP clock, whatever the audio's rate (RFC 7587)
PACKET_TICKS = 960  # one 20 ms packet on the RTP clock
SEND_OFFSET_S = 0.002  # after the pump that reads the engine's output
CAPTIONS_LABEL = "captions"


def opus_decode_rate(model_rate: int) -> int:
    """The rate Cadence decodes a call's Opus at: the model's own where Opus has it (Moshi's
    24 kHz: libopus resamples as it decodes, and the uplink needs no resampler), else 48 kHz.
    The send side stays at 48 kHz: encoding Moshi's 24 kHz audio directly measured a lower
    echo correlation (0.881 against 0.912, `python bench/gateway_cpu.py --calls 1,10`) for
    no CPU gain worth it. Decoding at 24 kHz took the gateway from 4.8% to 3.6-3.9% of a core
    per call at 10 calls and from 10.6% to 9.0-9.2% for one call, and the server-side delay
    from 218-220 to 205-214 ms (the uplink resampler's), same machine and hour, before and
    after trees; the after run is bench/results/gateway_cpu.json."""
    return model_rate if model_rate in OPUS_RATES else OPUS_CLOCK


class OfferError(ValueError):
    """The SDP offer cannot become a Cadence call (not SDP, no audio, no Opus)."""


class PacedAudioTrack(MediaStreamTrack):
    kind = "audio"

    def __init__(self, downlink: Downlink, grid: PumpGrid) -> None:
        super().__init__()
        self._downlink = downlink
        self._grid = grid
        self._encoder = OpusEncoder(downlink.rate)
        self._index: int | None = None
        self._pts = 0

    async def recv(self) -> Packet[Stream]:
        grid = self._grid
        now = time.monotonic()
        current = grid.index_at(now - SEND_OFFSET_S)
        if self._index is None:
            self._index = current + 1
        else:
            self._index += 1
            if current > self._index:  # fell behind: jump, keep audio and time aligned
                skipped = current - self._index
                self._downlink.skip(skipped)  # counted there, for the call's record
                self._pts += skipped * PACKET_TICKS
                self._index = current
        due = grid.instant(self._index) + SEND_OFFSET_S
        if due > now:
            await asyncio.sleep(due - now)
        packet = opus_packet(self._encoder.encode(self._downlink.next_packet()), self._pts)
        self._pts += PACKET_TICKS
        return packet

    def stop(self) -> None:
        super().stop()
        self._encoder.close()


def opus_packet(payload: bytes, pts: int) -> Packet[Stream]:
    """A ready Opus packet: aiortc only packetizes it, no resampling or encoding thread."""
    packet: Packet[Stream] = Packet(payload)
    packet.pts = pts
    packet.time_base = fractions.Fraction(1, OPUS_CLOCK)
    return packet


PacketSink = Callable[[RtpPacket, float], None]


def tap_receiver(receiver: object, opus_types: set[int], sink: PacketSink) -> None:
    """Route the receiver's RTP to `sink` instead of aiortc's jitter buffer and decoder."""

    async def handle_rtp_packet(packet: RtpPacket, arrival_time_ms: int) -> None:
        if packet.payload_type in opus_types and packet.payload:
            sink(packet, time.monotonic())

    receiver._handle_rtp_packet = handle_rtp_packet  # type: ignore[attr-defined]


async def answer(
    offer_sdp: str,
    uplink: Uplink,
    downlink: Downlink,
    grid: PumpGrid,
    on_state: Callable[[str], Awaitable[None]],
    on_captions: Callable[[RTCDataChannel], None] | None = None,
) -> tuple[RTCPeerConnection, str]:
    """Accept a browser's offer; returns the peer and the SDP answer.

    `on_captions` receives the peer's "captions" data channel once it opens.
    """
    if "m=audio" not in offer_sdp:
        raise OfferError("the offer has no audio section")
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        try:
            await pc.setRemoteDescription(RTCSessionDescription(offer_sdp, "offer"))
        except Exception as exc:
            # aiortc's parser fails on bad input with whatever it hits (AssertionError too)
            raise OfferError(f"the offer is not valid SDP: {exc!r}") from exc
        transceiver = next((t for t in pc.getTransceivers() if t.kind == "audio"), None)
        if transceiver is None:
            raise OfferError("the offer has no audio section")
        opus = [c for c in RTCRtpSender.getCapabilities("audio").codecs if c.name == "opus"]
        transceiver.setCodecPreferences(opus)
        track = PacedAudioTrack(downlink, grid)
        transceiver.sender.replaceTrack(track)
        transceiver.direction = "sendrecv"

        def sink(packet: RtpPacket, now_s: float) -> None:
            uplink.receive(
                packet.sequence_number, packet.timestamp, packet.payload, now_s, packet.ssrc
            )

        @pc.on("connectionstatechange")
        async def changed() -> None:
            await on_state(pc.connectionState)

        @pc.on("datachannel")
        def opened(channel: RTCDataChannel) -> None:
            if channel.label == CAPTIONS_LABEL and on_captions is not None:
                on_captions(channel)

        try:
            local = await pc.createAnswer()
            await pc.setLocalDescription(local)
        except Exception as exc:
            # offers aiortc parses but cannot answer (two m-lines with one mid, a BUNDLE group
            # naming no m-line) fail in it with AttributeError and the like
            raise OfferError(f"the offer cannot be answered: {exc!r}") from exc
        codecs = [c for c in transceiver._codecs if c.name == "opus"]  # negotiated by now
        if not codecs:
            raise OfferError("the offer does not include Opus")
        tap_receiver(
            transceiver.receiver, {c.payloadType for c in codecs if c.payloadType is not None}, sink
        )
    except BaseException:
        with contextlib.suppress(Exception):  # a half-built peer may fail to close: the
            await pc.close()  # error to report is the one above
        raise
    return pc, pc.localDescription.sdp
