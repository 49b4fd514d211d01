"""The send queue: a late engine frame costs a glitch, not lasting delay."""

import numpy as np

from engine.ring import DownlinkFrame
from gateway.media.downlink import Downlink

CODEC_RATE = 48000
PACKET = 960  # 20 ms


def _standing_backlog_ms(late_ms: dict[int, int], seconds: int = 24) -> dict[int, float]:
    """Frames every 80 ms (some late by late_ms[frame]) read at 20 ms pumps, a packet sent 2 ms
    after each pump; returns the queue (ms) just after each frame's first packet."""
    downlink = Downlink(24000, CODEC_RATE, PACKET, 0.12)
    pending: list[tuple[int, int]] = []
    frame, levels = 0, {}
    for ms in range(seconds * 1000):
        if ms % 80 == 0:
            frame += 1
            pending.append((ms + late_ms.get(frame, 0), frame))
        if ms % 20 == 0:
            ready = [n for at, n in pending if at <= ms]
            pending = [(at, n) for at, n in pending if at > ms]
            pcm = np.full(1920, 1000, np.int16)
            downlink.accept(DownlinkFrame(n, pcm, np.zeros(0, np.int32)) for n in ready)
        if ms % 20 == 2:
            downlink.next_packet()
            if ms % 80 == 2:
                levels[ms // 80] = downlink.queued_s * 1000
    return levels


def test_late_frames_do_not_ratchet_the_send_queue_up() -> None:
    on_time = _standing_backlog_ms({})
    late = _standing_backlog_ms({50: 20, 120: 20, 200: 40})
    steady = on_time[290]
    assert late[60] > steady, "a late frame raises the backlog at first"
    # ... and 2 s later it is back within one packet (20 ms) of the on-time level
    for frame in (150, 240, 290):
        assert late[frame] <= steady + 20, (frame, late[frame], steady)


def test_packet_instants_a_late_sender_passed_are_counted_with_their_audio() -> None:
    """For the call's record: the WebRTC send track's skips were counted nowhere a person
    could see them (the phone side's were, as rtp.skipped)."""
    downlink = Downlink(24000, CODEC_RATE, PACKET, 0.12)
    downlink.next_packet()  # the sender started: frames queue from now on
    downlink.accept([DownlinkFrame(1, np.full(1920, 1000, np.int16), np.zeros(0, np.int32))])
    downlink.skip(3)
    assert (downlink.skipped_packets, downlink.dropped_samples) == (3, 3 * PACKET)
