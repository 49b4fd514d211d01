"""A real aiortc caller for end-to-end tests: sends a known signal, records what comes back.

What comes back is taken off the wire before aiortc's own jitter buffer (the same tap the
gateway uses), with each packet's arrival time, so the test can measure delay without the
client's buffering in the way.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.rtp import RtpPacket
from av.packet import Packet
from av.stream import Stream
from numpy.typing import NDArray

from gateway.media.opus import OpusDecoder, OpusEncoder
from gateway.webrtc import opus_packet, tap_receiver
from tests.support import signals
from tests.support.server import http_json

RATE = 48000
PACKET = 960


class SignalTrack(MediaStreamTrack):
    """Sends `signal` (int16 at 48 kHz) as 20 ms Opus packets on absolute deadlines.

    The packets are encoded once up front, so ten callers in one test process cost little.
    """

    kind = "audio"

    def __init__(self, signal: NDArray[np.int16]) -> None:
        super().__init__()
        encoder = OpusEncoder(RATE, bitrate=64000)
        padded = np.zeros(-(-signal.size // PACKET) * PACKET, np.int16)
        padded[: signal.size] = signal
        self.packets = [encoder.encode(p) for p in padded.reshape(-1, PACKET)]
        self._silence = encoder.encode(np.zeros(PACKET, np.int16))
        encoder.close()
        self.sent_at: list[float] = []  # monotonic time each packet was handed to aiortc
        self._start: float | None = None

    async def recv(self) -> Packet[Stream]:
        index = len(self.sent_at)
        if self._start is None:
            self._start = time.monotonic()
        delay = self._start + index * PACKET / RATE - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        payload = self.packets[index] if index < len(self.packets) else self._silence
        self.sent_at.append(time.monotonic())
        return opus_packet(payload, index * PACKET)


@dataclass
class Received:
    packets: list[tuple[float, int, int, bytes]] = field(default_factory=list)  # t, seq, ts, data

    def add(self, packet: RtpPacket, now_s: float) -> None:
        self.packets.append((now_s, packet.sequence_number, packet.timestamp, packet.payload))

    def decode(self) -> tuple[NDArray[np.float32], NDArray[np.float64]]:
        """Audio in RTP-timestamp order, and the arrival time of every sample's packet."""
        if not self.packets:
            return np.zeros(0, np.float32), np.zeros(0)
        ordered = sorted(self.packets, key=lambda p: (p[2] - self.packets[0][2]) % 2**32)
        base = ordered[0][2]
        span = (ordered[-1][2] - base) % 2**32 + PACKET
        audio = np.zeros(span, np.float32)
        arrival = np.full(span, np.nan)
        decoder = OpusDecoder(RATE)
        for t, _, ts, data in ordered:
            pcm = decoder.decode(data).astype(np.float32) / 32768.0
            at = (ts - base) % 2**32
            audio[at : at + pcm.size] = pcm
            arrival[at : at + pcm.size] = t
        decoder.close()
        return audio, arrival


@dataclass
class CallResult:
    call_id: str
    track: SignalTrack
    received: Received
    record: dict[str, object]


def band_limited_noise(seconds: float, seed: int = 7) -> NDArray[np.int16]:
    return signals.band_limited_noise(seconds, RATE, seed)


async def place_call(base_url: str, signal: NDArray[np.int16], talk_s: float) -> CallResult:
    """Call the gateway, send `signal` for talk_s seconds, hang up; returns what was heard."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    track = SignalTrack(signal)
    received = Received()
    transceiver = pc.addTransceiver(track, direction="sendrecv")
    await pc.setLocalDescription(await pc.createOffer())
    loop = asyncio.get_running_loop()
    status, body = await loop.run_in_executor(
        None,
        http_json,
        "POST",
        base_url + "/v1/calls",
        {"sdp": pc.localDescription.sdp, "type": "offer"},
    )
    if status != 201:
        await pc.close()
        raise RuntimeError(f"call refused: {status} {body}")
    await pc.setRemoteDescription(RTCSessionDescription(body["sdp"], "answer"))
    opus = {c.payloadType for c in transceiver._codecs if c.name == "opus" and c.payloadType}
    tap_receiver(transceiver.receiver, opus, received.add)
    call_id = body["id"]
    await asyncio.sleep(talk_s)
    _, record = await loop.run_in_executor(None, http_json, "GET", f"{base_url}/v1/calls/{call_id}")
    await loop.run_in_executor(None, http_json, "DELETE", f"{base_url}/v1/calls/{call_id}")
    await pc.close()
    return CallResult(call_id, track, received, record)


def measure_delay(
    result: CallResult, signal: NDArray[np.int16], window_s: float = 0.5
) -> tuple[float, float]:
    """(median peak correlation, median first-sample-in to same-sample-out seconds), per
    window of sent audio (`signals.echo_windows`)."""
    heard, arrival = result.received.decode()
    sent = signal[: len(result.track.sent_at) * PACKET].astype(np.float32) / 32768.0
    sent_at = np.repeat(np.asarray(result.track.sent_at), PACKET)[: sent.size]
    return signals.echo_windows(sent, sent_at, heard, arrival, PACKET, int(window_s * RATE))
