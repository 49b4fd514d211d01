"""The Opus receive path: jitter buffer -> libopus -> resampler -> exact frames."""

import numpy as np
import pytest
from numpy.typing import NDArray

from gateway.calls import LONGEST_OPUS_PACKET_S
from gateway.media.jitter import JitterConfig
from gateway.media.opus import OpusDecoder, OpusEncoder
from gateway.media.uplink import Uplink

PUMP_S = 0.02
PACKET = 960  # 20 ms at 48 kHz
FRAME = 1920  # 80 ms at 24 kHz


def test_a_packet_libopus_refuses_is_concealed_and_the_stream_goes_on() -> None:
    uplink = Uplink(OpusDecoder(48000), JitterConfig(), 24000, FRAME, PUMP_S)
    encoder = OpusEncoder(48000)
    tone = (8000 * np.sin(np.arange(PACKET) * 2 * np.pi * 440 / 48000)).astype(np.int16)
    good = encoder.encode(tone)
    frames = []
    for k in range(50):  # one second, a packet every pump
        now = k * PUMP_S
        payload = b"\xff" if k == 10 else good  # code 3 without its frame count byte
        uplink.receive(k, k * PACKET, payload, now + 0.005)
        uplink.pump(now)
        if k % 4 == 3:
            frames.append(uplink.take_frame())
    assert uplink.undecodable == 1
    assert uplink.concealed == 1
    counters = uplink.jitter.counters
    assert counters.lost == 0
    assert counters.played + uplink.jitter.buffered == counters.received
    assert np.abs(frames[-1]).max() > 1000, "the audio after the bad packet still comes through"


def _lossy_tone(decoder_rate: int) -> tuple[Uplink, list[NDArray[np.int16]]]:
    """One second of a 440 Hz tone, a packet every pump; two lost, one late."""
    uplink = Uplink(OpusDecoder(decoder_rate), JitterConfig(), 24000, FRAME, PUMP_S)
    encoder = OpusEncoder(48000)
    t = np.arange(50 * PACKET)
    tone = (8000 * np.sin(t * 2 * np.pi * 440 / 48000)).astype(np.int16)
    frames = []
    for k in range(50):
        now = k * PUMP_S
        if k not in (12, 30):
            packet = encoder.encode(tone[k * PACKET : (k + 1) * PACKET])
            uplink.receive(k, k * PACKET, packet, now + (0.025 if k == 20 else 0.005))
        uplink.pump(now)
        if k % 4 == 3:
            frames.append(uplink.take_frame())
    return uplink, frames


def test_a_24khz_decoder_plays_out_as_the_48khz_one_does() -> None:
    """The jitter buffer counts in RTP clock ticks (48 kHz for Opus); a decoder at 24 kHz (the
    gateway's for Moshi: no resampler) conceals lost packets at its own rate, so the buffer
    plays, loses and holds exactly what it does with a 48 kHz decoder (had it concealed 960
    samples at 24 kHz, 40 ms per loss, the buffer would back up and drop a packet)."""
    at_48k, _ = _lossy_tone(48000)
    at_24k, frames = _lossy_tone(24000)
    assert at_24k.jitter.counters == at_48k.jitter.counters
    assert at_24k.jitter.counters.lost == 2
    assert at_24k.jitter.counters.dropped == 0
    assert at_24k.jitter.buffered == at_48k.jitter.buffered
    assert at_24k.concealed == 2
    assert all(frame.shape == (FRAME,) for frame in frames)
    spectrum = np.abs(np.fft.rfft(np.concatenate(frames[3:]).astype(np.float64)))
    peak_hz = np.argmax(spectrum) * 24000 / (len(frames[3:]) * FRAME)
    assert abs(peak_hz - 440) < 10, peak_hz


def test_an_odd_timestamp_step_is_concealed_in_whole_opus_units_and_the_call_goes_on() -> None:
    uplink = Uplink(OpusDecoder(48000), JitterConfig(), 24000, FRAME, PUMP_S)
    encoder = OpusEncoder(48000)
    tone = (8000 * np.sin(np.arange(PACKET) * 2 * np.pi * 440 / 48000)).astype(np.int16)
    packet = encoder.encode(tone)
    uplink.receive(0, 0, packet, 0.005)
    uplink.receive(1, 1000, packet, 0.006)  # 1000 samples: no whole number of 2.5 ms units
    for k in range(50):  # then nothing: every pull conceals at the learnt length
        uplink.pump(k * PUMP_S)
        if k % 4 == 3:
            assert uplink.take_frame().shape == (FRAME,)
    assert uplink.concealed > 0


def test_a_refused_packet_after_a_loss_is_counted_once() -> None:
    """Its FEC is tried for the loss before it, then it is decoded: one refusal, not two."""
    uplink = Uplink(OpusDecoder(48000), JitterConfig(), 24000, FRAME, PUMP_S)
    good = OpusEncoder(48000).encode(np.zeros(PACKET, np.int16))
    for k in range(50):
        now = k * PUMP_S
        if k != 10:  # lost, and the one after it is garbage
            uplink.receive(k, k * PACKET, b"\xff" if k == 11 else good, now + 0.005)
        uplink.pump(now)
        if k % 4 == 3:
            uplink.take_frame()
    assert uplink.jitter.counters.lost == 1
    assert uplink.undecodable == 1


@pytest.mark.parametrize("packet_ms", [10, 20, 40, 60, 120])
def test_every_opus_packet_time_a_webrtc_call_takes_frames_without_cutting(
    packet_ms: int,
) -> None:
    """A WebRTC call's framer held 20 ms beyond its frame: a 60 ms packet decoded at one pump
    overflowed it, cutting ~8% of the audio out and padding the gaps with silence."""
    uplink = Uplink(OpusDecoder(24000), JitterConfig(), 24000, FRAME, PUMP_S, LONGEST_OPUS_PACKET_S)
    encoder, n = OpusEncoder(48000), 48 * packet_ms
    t = np.arange(5 * 48000)
    tone = (8000 * np.sin(t * 2 * np.pi * 440 / 48000)).astype(np.int16)
    packets = [encoder.encode(tone[i : i + n]) for i in range(0, tone.size - n + 1, n)]
    sent = 0
    for pump in range(int(5 / PUMP_S)):
        now = pump * PUMP_S
        while sent < len(packets) and sent * packet_ms / 1000 + 0.005 <= now:
            uplink.receive(sent, sent * n, packets[sent], now)
            sent += 1
        uplink.pump(now)
        if pump % 4 == 3:
            uplink.take_frame()
    assert uplink.framer.counters.dropped_samples == 0
    assert uplink.jitter.counters.lost == uplink.concealed == 0
