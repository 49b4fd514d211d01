"""The RTP pacer's schedule: packets on the 10 ms grid at each stream's packet time, missed
instants skipped (audio and timestamps) rather than sent in a burst."""

from dataclasses import dataclass, field

import pytest

from gateway.media.clock import PumpGrid
from gateway.phone.pacer import RtpPacer, instant_index, instant_time


@dataclass
class FakeStream:
    call_id: str
    packet_ms: int
    next_instant: int | None = None
    sent_at: list[int] = field(default_factory=list)
    skipped: int = 0
    _now: list[int] = field(default_factory=lambda: [0])

    def skip(self, packets: int) -> None:
        self.skipped += packets

    def send_packet(self) -> None:
        self.sent_at.append(self._now[0])


GRID = PumpGrid(t0_s=100.0, period_s=0.08, per_tick=4, lead_s=0.015)


def _run(pacer: RtpPacer, streams: list[FakeStream], instants: list[int]) -> None:
    for index in instants:
        for s in streams:
            s._now[0] = index
        pacer.send_due(index)


@pytest.mark.parametrize("ptime_ms", [10, 20, 30, 60])
def test_one_packet_per_packet_time(ptime_ms: int) -> None:
    pacer = RtpPacer(lambda: GRID)
    stream = FakeStream("a", ptime_ms)
    pacer.add(stream)
    _run(pacer, [stream], list(range(0, 121)))  # 1.2 s of 10 ms instants
    step = ptime_ms // 10
    assert stream.sent_at == list(range(step, 121, step))
    assert stream.skipped == 0


def test_a_late_wake_up_skips_missed_instants() -> None:
    pacer = RtpPacer(lambda: GRID)
    stream = FakeStream("a", 20)
    pacer.add(stream)
    _run(pacer, [stream], [0, 2, 4, 11, 12, 14])  # stalled from 4 to 11
    # the packets of 6 and 8 are skipped, 10's goes out late at 11, 12's on time again
    assert stream.sent_at == [2, 4, 11, 12, 14]
    assert stream.skipped == 2


def test_instants_sit_on_the_pump_grid() -> None:
    for index in (-3, 0, 7, 1000):
        t = instant_time(GRID, index)
        assert instant_index(GRID, t) == index
        assert instant_index(GRID, t - 1e-4) == index - 1
    # every other 10 ms instant is a pump instant, 2 ms after it
    assert instant_time(GRID, 4) == pytest.approx(GRID.instant(2) + 0.002)


def test_next_due_is_the_earliest_stream() -> None:
    pacer = RtpPacer(lambda: GRID)
    a, b = FakeStream("a", 60, next_instant=12), FakeStream("b", 30, next_instant=9)
    pacer.add(a)
    pacer.add(b)
    assert pacer.next_due(3) == 9
    pacer.remove("b")
    assert pacer.next_due(3) == 12
    assert pacer.next_due(20) == 21
