"""Typed entry points to aiortc's RTP/RTCP packet code, with one error type.

aiortc's `RtpPacket` and RTCP classes are maintained and tested against real peers, so Cadence
reuses them instead of writing another parser. What this module adds is a contract a driver can
rely on: bad bytes raise `RtpParseError` and nothing else (aiortc raises ValueError, and its
RTCP sub-parsers can raise struct.error or IndexError on truncated payloads).
"""

from __future__ import annotations

import struct
from typing import cast

from aiortc.rtp import RtcpPacket, RtpPacket, is_rtcp

__all__ = [
    "RtcpPacket",
    "RtpPacket",
    "RtpParseError",
    "is_rtcp_datagram",
    "parse_rtcp",
    "parse_rtp",
]


class RtpParseError(ValueError):
    """The one error raised for a datagram that is not a well-formed RTP or RTCP packet."""


def is_rtcp_datagram(data: bytes) -> bool:
    """RTCP and RTP may share one port (RFC 5761); the payload type range tells them apart."""
    return len(data) >= 2 and bool(is_rtcp(data))


def parse_rtp(data: bytes) -> RtpPacket:
    try:
        return RtpPacket.parse(data)
    except (ValueError, struct.error, IndexError) as error:
        raise RtpParseError(str(error)) from error


def parse_rtcp(data: bytes) -> list[RtcpPacket]:
    try:
        return cast(list[RtcpPacket], RtcpPacket.parse(data))
    except (ValueError, struct.error, IndexError) as error:
        raise RtpParseError(str(error)) from error
