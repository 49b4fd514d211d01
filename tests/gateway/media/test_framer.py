"""Exact frames by samples, whatever sizes the audio arrives in."""

import numpy as np

from gateway.media.framer import Framer


def test_uneven_pieces_become_exact_frames_in_order() -> None:
    framer = Framer(1920, max_backlog=480)
    x = np.arange(1920 * 3, dtype=np.float32)
    pieces = [479, 481, 480, 480, 1, 959, 960, 1920]
    out = []
    start = 0
    for size in pieces:
        framer.push(x[start : start + size])
        start += size
        if framer.buffered >= 1920:
            out.append(framer.take())
    assert len(out) == 3
    np.testing.assert_array_equal(np.concatenate(out), x[: 1920 * 3])
    assert framer.counters.padded_samples == framer.counters.dropped_samples == 0


def test_short_audio_is_padded_before_it_and_backlog_is_bounded() -> None:
    framer = Framer(1920, max_backlog=480)
    framer.push(np.ones(1000, np.float32))
    frame = framer.take()
    assert not frame[:920].any()
    assert frame[920:].all()
    framer.push(np.ones(1920 + 1000, np.float32))
    framer.take()
    assert framer.buffered == 480
    assert framer.counters.dropped_samples == 520
    assert framer.counters.padded_samples == 920
