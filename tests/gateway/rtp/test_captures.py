"""Real captured RTP: the PCMA and RFC 4733 captures that ship with SIPp (Debian sip-tester).

The captures are read where the package installs them, not copied into the tree; the tests
skip when SIPp is not installed.
"""

from __future__ import annotations

import itertools
import struct
from pathlib import Path

import pytest

from gateway.rtp.g711 import alaw_decode, alaw_encode
from gateway.rtp.packet import RtpPacket, parse_rtp
from gateway.rtp.telephone_event import Dtmf, EventReceiver, parse_event

CAPTURES = Path("/usr/share/sip-tester")
pytestmark = pytest.mark.skipif(not CAPTURES.is_dir(), reason="needs SIPp's captures")
ETHERNET, IPV4_MIN, UDP = 14, 20, 8


def udp_payloads(path: Path) -> list[bytes]:
    """UDP payloads of an Ethernet/IPv4 pcap (classic little-endian format)."""
    data = path.read_bytes()
    magic, link = struct.unpack_from("<I", data)[0], struct.unpack_from("<I", data, 20)[0]
    assert (magic, link) == (0xA1B2C3D4, 1)
    payloads, offset = [], 24
    while offset < len(data):
        captured = struct.unpack_from("<I", data, offset + 8)[0]
        frame = data[offset + 16 : offset + 16 + captured]
        offset += 16 + captured
        header = (frame[ETHERNET] & 0x0F) * 4
        assert header >= IPV4_MIN
        assert frame[ETHERNET + 9] == 17  # UDP
        payloads.append(frame[ETHERNET + header + UDP :])
    return payloads


def rtp(path: Path) -> list[RtpPacket]:
    return [parse_rtp(p) for p in udp_payloads(path)]


def test_pcma_capture_is_30ms_packets_and_decodes_losslessly() -> None:
    raw = udp_payloads(CAPTURES / "g711a.pcap")
    packets = [parse_rtp(p) for p in raw]
    assert {p.payload_type for p in packets} == {8}
    assert {len(p.payload) for p in packets} == {240}  # 30 ms at 8 kHz
    steps = {(b.timestamp - a.timestamp) & 0xFFFFFFFF for a, b in itertools.pairwise(packets)}
    assert steps == {240}
    assert all(
        (b.sequence_number - a.sequence_number) & 0xFFFF == 1
        for a, b in itertools.pairwise(packets)
    )
    for data, packet in zip(raw, packets, strict=True):
        assert packet.serialize() == data  # aiortc's serialiser reproduces the wire bytes
        assert alaw_encode(alaw_decode(packet.payload)) == packet.payload


@pytest.mark.parametrize(
    ("name", "digit"),
    [*((f"dtmf_2833_{d}.pcap", str(d)) for d in range(10)),
     ("dtmf_2833_star.pcap", "*"), ("dtmf_2833_pound.pcap", "#")],
)  # fmt: skip
def test_dtmf_captures_give_exactly_one_press(name: str, digit: str) -> None:
    packets = rtp(CAPTURES / name)
    assert {p.payload_type for p in packets} == {101}  # not 96, whatever the SDP of a scenario
    receiver = EventReceiver()
    presses: list[Dtmf] = []
    for packet in packets:
        presses += receiver.receive(packet.ssrc, packet.timestamp, packet.payload)
    assert [p.digit for p in presses] == [digit]
    ends = [parse_event(p.payload) for p in packets if parse_event(p.payload).end]
    assert len(ends) >= 2  # the capture repeats its end packet, and the press still counts once
    assert presses[0].duration_s == ends[-1].duration / 8000
