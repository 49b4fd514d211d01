"""The RTP port range: even ports only, round-robin, taken ports never offered twice."""

import pytest

from gateway.phone.ports import RtpPorts


def test_even_ports_in_the_range() -> None:
    ports = RtpPorts(20001, 20010)
    assert ports.candidates() == [20002, 20004, 20006, 20008]
    assert ports.free == 4


def test_round_robin_and_give_back() -> None:
    ports = RtpPorts(20000, 20006)
    ports.take(20000)
    assert ports.candidates() == [20002, 20004]
    ports.take(20002)
    ports.give_back(20000)
    assert ports.candidates() == [20004, 20000]  # the port just freed is reused last
    assert ports.free == 2


def test_a_port_that_would_not_bind_is_skipped_by_taking_the_next() -> None:
    ports = RtpPorts(20000, 20006)
    first, second, *_ = ports.candidates()
    ports.take(second)  # first would not bind: the caller took the next candidate
    assert first in ports.candidates()
    assert second not in ports.candidates()


@pytest.mark.parametrize(("low", "high"), [(80, 2000), (30000, 30000), (30001, 30002)])
def test_invalid_ranges(low: int, high: int) -> None:
    with pytest.raises(ValueError, match="RTP port range"):
        RtpPorts(low, high)
