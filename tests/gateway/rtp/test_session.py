"""Send-side RTP numbering, the packet wrapper's single error type, and the media timeout."""

from __future__ import annotations

import itertools
import random

import pytest

from gateway.rtp.packet import RtpParseError, is_rtcp_datagram, parse_rtcp, parse_rtp
from gateway.rtp.session import MediaTimeout, RtpSender
from gateway.rtp.telephone_event import parse_event


def test_sender_numbers_packets_and_wraps() -> None:
    sender = RtpSender(0, random.Random(3))
    sender.sequence_number = 0xFFFF
    sender.timestamp = 0xFFFFFFF0
    first = parse_rtp(sender.audio(b"\xff" * 160, 160))
    second = parse_rtp(sender.audio(b"\xff" * 160, 160))
    assert (first.sequence_number, second.sequence_number) == (0xFFFF, 0)
    assert (first.timestamp, second.timestamp) == (0xFFFFFFF0, 0x00000090)
    assert (first.marker, second.marker) == (1, 0)
    assert first.ssrc == second.ssrc == sender.ssrc
    assert second.payload == b"\xff" * 160


def test_sender_press_shares_one_timestamp_and_advances_audio_after() -> None:
    sender = RtpSender(8, random.Random(4))
    start = sender.timestamp
    packets = [parse_rtp(p) for p in sender.press(96, "#", 0.1)]
    assert {p.timestamp for p in packets} == {start}
    assert {p.payload_type for p in packets} == {96}
    assert [p.marker for p in packets][:2] == [1, 0]
    assert parse_event(packets[-1].payload).end
    audio = parse_rtp(sender.audio(b"\xd5" * 160, 160))
    assert audio.timestamp == (start + 800) & 0xFFFFFFFF
    numbers = [p.sequence_number for p in packets] + [audio.sequence_number]
    assert all((b - a) & 0xFFFF == 1 for a, b in itertools.pairwise(numbers))


def test_seeded_senders_are_reproducible() -> None:
    a, b = RtpSender(0, random.Random(9)), RtpSender(0, random.Random(9))
    assert (a.ssrc, a.sequence_number, a.timestamp) == (b.ssrc, b.sequence_number, b.timestamp)


@pytest.mark.parametrize("data", [b"", b"\x80", b"\x00" * 12, b"\x8f" + b"\x00" * 11])
def test_bad_rtp_raises_one_error(data: bytes) -> None:
    with pytest.raises(RtpParseError):
        parse_rtp(data)


def test_rtcp_demultiplexing_and_errors() -> None:
    receiver_report = bytes([0x80, 201, 0, 1, 0, 0, 0, 1])
    assert is_rtcp_datagram(receiver_report)
    assert not is_rtcp_datagram(RtpSender(0, random.Random(1)).audio(b"\xff", 1))
    assert len(parse_rtcp(receiver_report)) == 1
    with pytest.raises(RtpParseError):
        parse_rtcp(bytes([0x80, 201, 0, 9]))


def test_media_timeout_expires_pauses_and_resumes() -> None:
    timeout = MediaTimeout(10.0, now=0.0)
    timeout.packet(4.0)
    assert timeout.deadline() == 14.0
    assert not timeout.expired(13.9)
    assert timeout.expired(14.0)
    timeout.pause()
    assert timeout.deadline() is None
    assert not timeout.expired(100.0)
    timeout.resume(100.0)
    assert timeout.deadline() == 110.0
