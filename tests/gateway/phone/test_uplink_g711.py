"""Phone audio into engine frames by samples: G.711 at any packet time fills 80 ms frames
without cutting or padding audio once playout has started."""

import numpy as np
import pytest

from gateway.media.jitter import JitterConfig
from gateway.media.uplink import Uplink
from gateway.phone.codec import G711Decoder, encoder

PUMP_S = 0.02
FRAME = 1920  # 80 ms at 24 kHz


def _run(ptime_ms: int, longest_packet_s: float, seconds: float = 3.0) -> Uplink:
    n = ptime_ms * 8
    uplink = Uplink(
        G711Decoder("PCMU"),
        JitterConfig(clock_rate=8000, packet_samples=n),
        model_rate=24000,
        frame_samples=FRAME,
        pump_period_s=PUMP_S,
        longest_packet_s=longest_packet_s,
    )
    tone = (6000 * np.sin(np.arange(int(seconds * 8000)) * 2 * np.pi * 300 / 8000)).astype(np.int16)
    packets = [encoder("PCMU")(tone[i : i + n]) for i in range(0, tone.size - n + 1, n)]
    sent = 0
    for pump in range(int(seconds / PUMP_S)):
        now = pump * PUMP_S
        while sent < len(packets) and sent * ptime_ms / 1000 <= now:
            uplink.receive(sent, sent * n, packets[sent], now)
            sent += 1
        uplink.pump(now)
        if pump % 4 == 3:
            uplink.take_frame()
    return uplink


@pytest.mark.parametrize("ptime_ms", [10, 20, 30, 60])
def test_every_packet_time_frames_without_cutting_audio(ptime_ms: int) -> None:
    uplink = _run(ptime_ms, longest_packet_s=0.06)
    assert uplink.framer.counters.dropped_samples == 0
    assert uplink.jitter.counters.lost == 0
    assert uplink.concealed == 0


def test_a_framer_sized_for_20_ms_would_cut_60_ms_packets() -> None:
    assert _run(60, longest_packet_s=0.02).framer.counters.dropped_samples > 0
