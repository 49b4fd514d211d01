"""The caller's media end in SIP tests: sends known G.711 audio, records what comes back.

SIPp does the signalling; its SDP names this peer's socket as the caller's media address. The
peer learns the gateway's RTP address from the first packet the gateway sends (it sends from
the moment it answers), then sends `signal` paced on absolute deadlines from a thread, so the
test measures the gateway's path and not this process's scheduling.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from gateway.phone.codec import G711Decoder, encoder
from gateway.rtp.packet import parse_rtp
from gateway.rtp.session import RtpSender
from tests.support import signals

RATE = 8000
PAYLOAD_TYPES = {"PCMU": 0, "PCMA": 8}


@dataclass
class Heard:
    arrival_s: float
    sequence: int
    timestamp: int
    payload_type: int
    payload: bytes


@dataclass
class RtpPeer:
    codec: str
    ptime_ms: int
    signal: NDArray[np.int16]  # [samples] at 8 kHz, sent once, then silence
    heard: list[Heard] = field(default_factory=list)
    sent_at: list[float] = field(default_factory=list)  # monotonic send time of each packet
    gateway: tuple[str, int] | None = None
    mute: bool = False  # a dead phone: hears but never sends
    lose_every: int = 0  # drop every Nth packet on the way out (0: none), a lossy network

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = int(self.sock.getsockname()[1])
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._receive, daemon=True),
            threading.Thread(target=self._send, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @property
    def packet_samples(self) -> int:
        return self.ptime_ms * RATE // 1000

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self.sock.close()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data, source = self.sock.recvfrom(2048)
            except TimeoutError:
                continue
            now = time.monotonic()
            packet = parse_rtp(data)
            if self.gateway is None:
                self.gateway = (source[0], source[1])
            self.heard.append(
                Heard(
                    now,
                    packet.sequence_number,
                    packet.timestamp,
                    packet.payload_type,
                    packet.payload,
                )
            )

    def _send(self) -> None:
        if self.mute:
            return
        while self.gateway is None:
            if self._stop.wait(0.005):
                return
        sender = RtpSender(PAYLOAD_TYPES[self.codec], random.Random(1))
        encode = encoder(self.codec)
        n = self.packet_samples
        start = time.monotonic()
        index = 0
        while not self._stop.is_set():
            due = start + index * n / RATE
            delay = due - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                return
            chunk = self.signal[index * n : (index + 1) * n]
            pcm = np.zeros(n, np.int16)
            pcm[: chunk.size] = chunk
            self.sent_at.append(time.monotonic())
            packet = sender.audio(encode(pcm), n)
            if not self.lose_every or (index + 1) % self.lose_every:
                self.sock.sendto(packet, self.gateway)
            index += 1

    def audio(self) -> tuple[NDArray[np.float32], NDArray[np.float64]]:
        """What came back, in RTP timestamp order, and each sample's packet arrival time."""
        packets = [h for h in self.heard if h.payload_type == PAYLOAD_TYPES[self.codec]]
        if not packets:
            return np.zeros(0, np.float32), np.zeros(0)
        base = packets[0].timestamp
        offsets = [(h.timestamp - base) % 2**32 for h in packets]
        span = max(offsets) + self.packet_samples
        audio = np.zeros(span, np.float32)
        arrival = np.full(span, np.nan)
        decoder = G711Decoder(self.codec)
        for h, at in zip(packets, offsets, strict=True):
            pcm = decoder.decode(h.payload).astype(np.float32) / 32768.0
            audio[at : at + pcm.size] = pcm
            arrival[at : at + pcm.size] = h.arrival_s
        return audio, arrival


def band_limited_noise(seconds: float, seed: int = 7) -> NDArray[np.int16]:
    return signals.band_limited_noise(seconds, RATE, seed)


def echo_delay(peer: RtpPeer, window_s: float = 0.5) -> tuple[float, float]:
    """(median correlation, median seconds from a sample's sending to its echo's arrival), per
    window of sent audio (`signals.echo_windows`), at the best sub-sample alignment."""
    heard, arrival = peer.audio()
    n = peer.packet_samples
    sent_packets = min(len(peer.sent_at), peer.signal.size // n)
    sent = peer.signal[: sent_packets * n].astype(np.float32) / 32768.0
    sent_at = np.repeat(np.asarray(peer.sent_at[:sent_packets]), n)
    w = int(window_s * RATE)
    return signals.echo_windows(sent, sent_at, heard, arrival, n, w, _aligned_correlation)


def _aligned_correlation(heard: NDArray[np.float32], ref: NDArray[np.float32]) -> float:
    """Normalised correlation at the best sub-sample alignment.

    The gateway resamples 8 -> 24 -> 8 kHz; the two filters' delays add up to a fraction of an
    8 kHz sample, which alone would cap an integer-lag correlation of telephone-band noise
    near 0.86. Shifting the reference by fractions of a sample (in the frequency domain)
    leaves only what the path really changed.
    """
    spectrum = np.fft.rfft(ref)
    phase = np.fft.rfftfreq(ref.size) * 2j * np.pi
    best = 0.0
    for shift in np.linspace(-0.5, 0.5, 13):
        shifted = np.fft.irfft(spectrum * np.exp(-phase * shift), ref.size)
        # a circular shift: leave out the edges it wraps around
        best = max(best, signals.correlation(heard[4:-4], shifted[4:-4]))
    return best
