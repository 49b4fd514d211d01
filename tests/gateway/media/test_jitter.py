"""The jitter buffer under loss, reordering, duplication, jitter and clock drift.

A simulated sender emits a 20 ms packet every 20 ms of its own clock; the network delays,
drops, duplicates or reorders them; the consumer pulls one packet every 20 ms of ours. Each
test measures the end-to-end buffer delay (pull time minus send time) of every played packet
and asserts it stays bounded and returns to its level after the impairment, which is where
a count-based buffer (aiortc's) fails: it keeps the delay a loss or a reordering added.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from gateway.media.jitter import Arrival, JitterBuffer, JitterConfig, Unit

PACKET_S = 0.02
SAMPLES = 960
BASE_DELAY_S = 0.005  # network transit on a quiet path


@dataclass
class Run:
    delays: dict[int, float]  # send index -> delay when played
    units: list[Unit]
    jb: JitterBuffer

    def mean_delay(self, start: int, stop: int) -> float:
        values = [d for i, d in self.delays.items() if start <= i < stop]
        assert values, f"nothing played between packets {start} and {stop}"
        return float(np.mean(values))


Network = Callable[[int, float], list[float]]  # (index, send time) -> arrival times


def simulate(
    packets: int,
    network: Network,
    sender_rate: float = 1.0,
    pull_phase_s: float = 0.0123,
    config: JitterConfig | None = None,
) -> Run:
    jb = JitterBuffer(config)
    arrivals: list[tuple[float, int]] = []
    for i in range(packets):
        sent = i * PACKET_S / sender_rate
        arrivals += [(t, i) for t in network(i, sent)]
    arrivals.sort()
    delays: dict[int, float] = {}
    units: list[Unit] = []
    a = 0
    end = packets * PACKET_S / sender_rate + 0.15  # stop pulling soon after the stream
    for k in range(int(end / PACKET_S)):
        now = pull_phase_s + k * PACKET_S
        while a < len(arrivals) and arrivals[a][0] <= now:
            t, i = arrivals[a]
            jb.push(i % 65536, (i * SAMPLES) % 2**32, i.to_bytes(4, "big"), t)
            a += 1
        out = jb.pull(now)
        units.append(out.unit)
        if out.unit is Unit.PACKET:
            assert out.payload is not None
            i = int.from_bytes(out.payload, "big")
            delays[i] = now - i * PACKET_S / sender_rate
    return Run(delays, units, jb)


def clean(i: int, sent: float) -> list[float]:
    return [sent + BASE_DELAY_S]


def test_clean_path_plays_everything_in_order_near_the_target() -> None:
    run = simulate(500, clean)
    played = list(run.delays)
    assert played == sorted(played)
    assert len(played) == 500
    assert run.jb.counters.lost == 0
    last_packet = max(k for k, unit in enumerate(run.units) if unit is Unit.PACKET)
    assert Unit.EMPTY not in run.units[:last_packet], "never ran dry mid-stream"
    steady = run.mean_delay(100, 500)
    assert 0.04 <= steady <= 0.08, f"steady delay {steady * 1e3:.0f} ms"


def test_a_loss_is_concealed_and_adds_no_lasting_delay() -> None:
    def lossy(i: int, sent: float) -> list[float]:
        return [] if i in (200, 300, 301) else clean(i, sent)

    run = simulate(600, lossy)
    before, after = run.mean_delay(100, 200), run.mean_delay(350, 600)
    assert abs(after - before) < 0.005, f"{before * 1e3:.1f} -> {after * 1e3:.1f} ms"
    assert run.jb.counters.lost == 3
    assert 200 not in run.delays
    assert 202 in run.delays


def test_a_burst_loss_longer_than_the_buffer_is_concealed_once() -> None:
    """10 packets (200 ms) lost: the buffer runs dry and conceals as EMPTY; once packets come
    again the same 200 ms used to be concealed a second time as LOST, with that much delay
    added and shed over seconds, real packets dropped on the way."""

    def burst(i: int, sent: float) -> list[float]:
        return [] if 200 <= i < 210 else clean(i, sent)

    run = simulate(600, burst)
    concealed = run.jb.counters.empty + run.jb.counters.lost
    tail = [k for k, unit in enumerate(run.units) if unit is Unit.PACKET][-1]
    assert concealed - run.units[tail:].count(Unit.EMPTY) <= 11, run.jb.counters
    assert run.jb.counters.dropped == 0, "no real packet dropped to shed a doubled delay"
    before, after = run.mean_delay(100, 200), run.mean_delay(211, 260)
    assert after - before < 0.02, f"{before * 1e3:.1f} -> {after * 1e3:.1f} ms"


def test_numbers_taken_by_events_beside_the_audio_are_not_concealed() -> None:
    """RFC 4733 events share the audio's sequence numbers and go elsewhere: a gap in the
    numbers with no gap in the timestamps held no audio."""
    jb = JitterBuffer()
    played: list[int] = []
    seq = 0
    for i in range(300):
        now = i * PACKET_S + BASE_DELAY_S
        jb.push(seq, i * SAMPLES, i.to_bytes(4, "big"), now)
        seq += 2 if 100 <= i < 105 else 1  # a key press: an event packet after each of these
        out = jb.pull(now + 0.0123)
        if out.unit is Unit.PACKET:
            assert out.payload is not None
            played.append(int.from_bytes(out.payload, "big"))
    assert jb.counters.lost == 0
    assert played == list(range(played[0], played[0] + len(played)))


def test_reordering_and_duplicates_play_once_in_order_without_lasting_delay() -> None:
    def shuffled(i: int, sent: float) -> list[float]:
        if i % 50 == 10:  # this packet overtakes the one before it
            return [sent + BASE_DELAY_S - 0.015]
        if i % 50 == 9:
            return [sent + BASE_DELAY_S + 0.012]
        if i % 40 == 0:  # sent twice
            return [sent + BASE_DELAY_S, sent + BASE_DELAY_S + 0.003]
        return clean(i, sent)

    run = simulate(600, shuffled)
    played = list(run.delays)
    assert played == sorted(played), "played in sequence order"
    duplicated = [i for i in range(600) if i % 40 == 0 and i % 50 not in (9, 10)]
    assert run.jb.counters.duplicate == len(duplicated)
    assert run.jb.counters.lost == 0
    assert run.mean_delay(500, 600) < 0.09


def test_a_jitter_burst_raises_the_delay_and_it_comes_back_down() -> None:
    rng = np.random.default_rng(3)

    def bursty(i: int, sent: float) -> list[float]:
        if 200 <= i < 400:
            return [sent + BASE_DELAY_S + float(rng.uniform(0, 0.08))]
        return clean(i, sent)

    run = simulate(1500, bursty)
    quiet = run.mean_delay(100, 200)
    during = run.mean_delay(300, 400)
    late = run.mean_delay(1300, 1500)
    assert during > quiet + 0.02, "the buffer grew to absorb the jitter"
    assert run.jb.counters.late < 20, "few packets arrived after their playout"
    assert late < quiet + 0.02, f"after the burst: {late * 1e3:.0f} ms vs {quiet * 1e3:.0f} ms"
    assert max(run.delays.values()) <= 0.2 + 0.08, "bounded by max_delay_s plus one burst"


def test_sender_clock_drift_is_absorbed_by_drops_or_stretches() -> None:
    for rate, counter in ((1.01, "dropped"), (0.99, "empty")):
        run = simulate(6000, clean, sender_rate=rate)  # two minutes
        delays = np.array(list(run.delays.values()))
        assert delays.max() < 0.12, f"rate {rate}: delay grew to {delays.max() * 1e3:.0f} ms"
        assert delays[-500:].mean() < 0.08
        assert getattr(run.jb.counters, counter) > 10, f"rate {rate} needs {counter}"


def test_a_first_packet_overtaken_by_the_second_adds_no_delay() -> None:
    """The first arrival fixes the timestamp origin; an earlier timestamp after it is a
    little before it, not 2**32 samples after."""

    def first_late(i: int, sent: float) -> list[float]:
        return [sent + BASE_DELAY_S + 0.025] if i == 0 else clean(i, sent)

    run = simulate(500, first_late)
    assert run.jb.counters.dropped <= 1, "at most the start's extra wait is trimmed"
    steady = run.mean_delay(100, 500)
    assert 0.04 <= steady <= 0.08, f"steady delay {steady * 1e3:.0f} ms"


def test_sequence_and_timestamp_wraparound_are_seamless() -> None:
    jb = JitterBuffer()
    start = 65530
    now = 0.0
    for k in range(20):
        seq = (start + k) % 65536
        jb.push(seq, (2**32 - 960 * 5 + k * SAMPLES) % 2**32, bytes([k]), now + 0.005)
        now += PACKET_S
        jb.pull(now)
    assert jb.counters.lost == 0
    assert jb.counters.restarts == 0
    assert jb.counters.played >= 15


def test_a_restarted_stream_is_followed() -> None:
    jb = JitterBuffer()
    for k in range(10):
        assert jb.push(k, k * SAMPLES, b"a", k * PACKET_S) is Arrival.ACCEPTED
        jb.pull(k * PACKET_S + 0.05)
    assert jb.push(40000, 123, b"b", 0.3) is Arrival.RESTARTED
    assert jb.counters.restarts == 1


@pytest.mark.parametrize("jump", [-1000, -200, 5000])
def test_a_stream_renumbered_under_the_same_ssrc_is_followed(jump: int) -> None:
    """An SBC passing a new source through keeps the SSRC: behind, every packet was dropped
    as late (20 s of silence for 1000 numbers); ahead, thousands of numbers were lost."""
    jb = JitterBuffer()
    now, units = 0.0, []
    for k in range(300):
        seq = (10_000 + k + (jump if k >= 100 else 0)) % 65536
        timestamp = (k * SAMPLES + (123_456_789 if k >= 100 else 0)) % 2**32  # a new source's
        jb.push(seq, timestamp, k.to_bytes(4, "big"), now + 0.005, ssrc=7)
        now += PACKET_S
        units.append(jb.pull(now).unit)
    assert jb.counters.restarts == 1, jb.counters
    assert units[110:].count(Unit.PACKET) >= 185, jb.counters
    assert jb.counters.lost <= 1
    # at most the jumping packet, before its successor confirms the jump
    assert jb.counters.late + jb.counters.held <= 1


def test_late_and_duplicate_arrivals_are_reported() -> None:
    jb = JitterBuffer(JitterConfig(min_delay_s=0.04))
    jb.push(0, 0, b"0", 0.0)
    jb.push(2, 2 * SAMPLES, b"2", 0.04)
    assert jb.pull(0.05).unit is Unit.PACKET
    lost = jb.pull(0.07)
    assert lost.unit is Unit.LOST
    assert lost.payload == b"2", "the next packet is handed over for FEC"
    assert jb.push(1, SAMPLES, b"1", 0.08) is Arrival.LATE
    assert jb.push(2, 2 * SAMPLES, b"2", 0.08) is Arrival.DUPLICATE
    assert jb.pull(0.09).unit is Unit.PACKET
    assert jb.pull(0.11).unit is Unit.EMPTY


def test_a_new_sender_behind_the_old_ones_numbers_is_played_not_dropped_as_late() -> None:
    jb = JitterBuffer()
    now = 0.0
    for k in range(500):  # ten seconds of one sender
        jb.push(10_000 + k, k * SAMPLES, b"a", now + 0.005, ssrc=1)
        now += PACKET_S
        jb.pull(now)
    # a PBX moves the media: another server, its own SSRC, its numbers 5000 behind
    arrivals = []
    for k in range(100):
        arrivals.append(jb.push(5_500 + k, 777 + k * SAMPLES, b"b", now + 0.005, ssrc=2))
        now += PACKET_S
        jb.pull(now)
    assert arrivals[0] is Arrival.RESTARTED
    assert set(arrivals[1:]) == {Arrival.ACCEPTED}
    assert jb.counters.late == 0
    assert jb.counters.played >= 590


def test_timestamps_stepping_by_one_cannot_grow_the_buffer_past_its_bound() -> None:
    jb = JitterBuffer()
    for k in range(20_000):  # a hostile sender: 20,000 packets, timestamps 1 apart
        jb.push(k % 65536, k, b"x", 1.0 + k * 1e-5)
    # bounded by 2 x max delay in the shortest real packets (2.5 ms): 160
    assert jb.buffered <= 2 * 0.2 / 0.0025
