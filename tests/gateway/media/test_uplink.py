"""The Opus receive path: jitter buffer -> libopus -> resampler -> exact frames."""

import numpy as np

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
