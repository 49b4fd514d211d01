"""RFC 4733 events: payload codec, the exactly-once receiver, the sender's packet sequence."""

from __future__ import annotations

import pytest

from gateway.rtp.telephone_event import (
    FLASH_EVENT,
    Dtmf,
    EventReceiver,
    TelephoneEvent,
    TelephoneEventError,
    parse_event,
    press_packets,
)


def test_payload_round_trip_with_rfc_bit_layout() -> None:
    event = TelephoneEvent(event=11, end=True, volume=10, duration=1600)
    assert event.encode() == bytes([11, 0x80 | 10, 0x06, 0x40])
    assert parse_event(event.encode()) == event
    assert event.digit == "#"


@pytest.mark.parametrize("payload", [b"", b"\x01\x02\x03", b"\x01\x02\x03\x04\x05"])
def test_bad_payload_length_raises(payload: bytes) -> None:
    with pytest.raises(TelephoneEventError):
        parse_event(payload)


def test_sender_sequence_matches_rfc_shape() -> None:
    packets = press_packets("5", 0.1, packet_s=0.02)
    events = [parse_event(p.payload) for p in packets]
    assert [p.marker for p in packets] == [True, False, False, False, False, False, False]
    assert [e.duration for e in events] == [160, 320, 480, 640, 800, 800, 800]
    assert [e.end for e in events] == [False] * 4 + [True] * 3
    assert {e.event for e in events} == {5}


def test_receiver_reports_each_press_once_despite_redundant_ends() -> None:
    receiver = EventReceiver()
    presses: list[Dtmf] = []
    for timestamp, digit in ((1000, "1"), (3000, "*")):
        for packet in press_packets(digit, 0.08):
            presses += receiver.receive(0x1234, timestamp, packet.payload)
            presses += receiver.receive(0x1234, timestamp, packet.payload)  # duplicated
    assert presses == [Dtmf("1", 0.08), Dtmf("*", 0.08)]


def test_receiver_reports_a_press_whose_end_packets_were_all_lost() -> None:
    receiver = EventReceiver()
    first = press_packets("7", 0.1)
    assert receiver.receive(1, 500, first[0].payload) == []
    assert receiver.receive(1, 500, first[1].payload) == []
    second = press_packets("8", 0.06)
    presses = [d for p in second for d in receiver.receive(1, 2000, p.payload)]
    assert presses == [Dtmf("7", 0.04), Dtmf("8", 0.06)]


def test_same_digit_twice_is_two_presses() -> None:
    receiver = EventReceiver()
    presses = [
        d
        for timestamp in (0, 1600)
        for p in press_packets("9", 0.05)
        for d in receiver.receive(7, timestamp, p.payload)
    ]
    assert presses == [Dtmf("9", 0.05), Dtmf("9", 0.05)]


def test_flash_and_unknown_events_are_not_digits() -> None:
    receiver = EventReceiver()
    end = TelephoneEvent(FLASH_EVENT, True, 10, 800).encode()
    assert receiver.receive(1, 0, end) == []


@pytest.mark.parametrize(("digit", "duration"), [("X", 0.1), ("12", 0.1), ("1", 0.001)])
def test_sender_rejects_bad_presses(digit: str, duration: float) -> None:
    with pytest.raises(TelephoneEventError):
        press_packets(digit, duration)
