"""SDP parsing and offer/answer against the offers real PBXs and SIPp send."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.sip.headers import SipParseError
from gateway.sip.message import parse_message
from gateway.sip.sdp import (
    AudioStream,
    Origin,
    SessionDescription,
    accepted_stream,
    answer,
    offer,
    parse_sdp,
)

SAMPLES = Path(__file__).parent / "samples"
ORIGIN = Origin("cadence", 42, 1, "10.0.0.2")


def offered(name: str) -> SessionDescription:
    return parse_sdp(parse_message((SAMPLES / name).read_bytes()).body)


def answered(sdp: SessionDescription) -> tuple[SessionDescription, AudioStream | None]:
    return answer(sdp, ORIGIN, "10.0.0.2", 30000)


def test_sipp_scenario_pcma_with_event_96_and_30ms() -> None:
    """A custom SIPp scenario that declares telephone-event as 96 gets 96 back."""
    sdp, stream = answered(offered("sipp_invite.sip"))
    assert stream == AudioStream(8, "PCMA", 96, 30, "10.0.0.1", 6000, "sendrecv")
    media = sdp.media[0]
    assert (media.port, media.formats) == (30000, ("8", "96"))
    assert ("rtpmap", "96 telephone-event/8000") in media.attributes
    assert media.attribute("ptime") == "30"


def test_asterisk_prefers_pcmu_and_event_101() -> None:
    _, stream = answered(offered("asterisk_invite.sip"))
    assert stream is not None
    assert (stream.codec, stream.payload_type, stream.telephone_event) == ("PCMU", 0, 101)
    assert (stream.remote_address, stream.remote_port, stream.ptime_ms) == ("10.0.0.3", 10234, 20)


def test_freeswitch_order_of_preference_is_kept() -> None:
    _, stream = answered(offered("freeswitch_invite.sip"))
    assert stream is not None
    assert stream.codec == "PCMA"


def test_hold_reoffer_is_answered_recvonly() -> None:
    sdp, stream = answered(offered("freeswitch_reinvite_hold.sip"))
    assert stream is not None
    assert stream.direction == "recvonly"
    assert sdp.media[0].direction == "recvonly"


def test_old_style_hold_by_zero_address() -> None:
    text = offered("asterisk_invite.sip").encode().replace(b"10.0.0.3\r\nt=", b"0.0.0.0\r\nt=")
    _, stream = answered(parse_sdp(text))
    assert stream is not None
    assert stream.direction == "recvonly"


def test_a_format_with_a_malformed_rtpmap_is_unusable_not_an_error() -> None:
    text = (
        b"v=0\r\no=- 1 1 IN IP4 192.0.2.9\r\ns=-\r\nc=IN IP4 192.0.2.9\r\nt=0 0\r\n"
        b"m=audio 5002 RTP/AVP 0 8\r\na=rtpmap:0 PCMU\r\na=rtpmap:8 PCMA/8000\r\n"
    )
    _, stream = answered(parse_sdp(text))
    assert stream is not None
    assert (stream.codec, stream.payload_type) == ("PCMA", 8)
    _, stream = answered(parse_sdp(text.replace(b"PCMA/8000", b"PCMA/8k00")))
    assert stream is None, "no usable codec left: the caller gets a 488"


def test_unsupported_media_are_rejected_with_port_zero() -> None:
    text = (
        b"v=0\r\no=- 1 1 IN IP4 192.0.2.9\r\ns=-\r\nc=IN IP4 192.0.2.9\r\nt=0 0\r\n"
        b"m=video 5000 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\n"
        b"m=audio 5002 RTP/AVP 9 0\r\na=rtpmap:9 G722/8000\r\n"
        b"m=audio 5004 RTP/AVP 0\r\n"
    )
    sdp, stream = answered(parse_sdp(text))
    assert stream is not None
    assert stream.remote_port == 5002
    assert [(m.media, m.port) for m in sdp.media] == [("video", 0), ("audio", 30000), ("audio", 0)]


def test_no_common_codec_gives_no_stream() -> None:
    text = b"v=0\r\no=- 1 1 IN IP4 h\r\ns=-\r\nc=IN IP4 h\r\nt=0 0\r\nm=audio 5 RTP/AVP 18\r\n"
    sdp, stream = answered(parse_sdp(text))
    assert stream is None
    assert sdp.media[0].port == 0


def test_encode_parse_round_trip_and_offer_answer_loop() -> None:
    ours = offer(ORIGIN, "10.0.0.2", 30000, telephone_event=101, ptime_ms=20)
    assert parse_sdp(ours.encode()) == ours
    their_answer, stream = answer(ours, Origin("peer", 9, 1, "10.0.0.9"), "10.0.0.9", 50000)
    assert stream is not None
    assert accepted_stream(their_answer) == AudioStream(
        0, "PCMU", 101, 20, "10.0.0.9", 50000, "sendrecv"
    )


@pytest.mark.parametrize(
    "text",
    [
        b"v=0\r\n",
        b"o=- x 1 IN IP4 h\r\n",
        b"v=0\r\no=- 1 1 IN IP4 h\r\nm=audio x RTP/AVP 0\r\n",
        b"\xff",
        b"o=- " + b"1" * 5000 + b" 1 IN IP4 h\r\n",  # past int()'s 4300 digits
        "o=- 1 1 IN IP4 h\r\nm=audio \uff16\uff10\uff10\uff10 RTP/AVP 0\r\n".encode(),  # fullwidth
    ],
)
def test_bad_sdp_raises(text: bytes) -> None:
    with pytest.raises(SipParseError):
        parse_sdp(text)


@pytest.mark.parametrize(
    ("offered", "wanted", "answered"),
    [
        ("sendrecv", "sendrecv", "sendrecv"),
        ("sendrecv", "sendonly", "sendonly"),
        ("sendonly", "sendrecv", "recvonly"),
        ("sendonly", "sendonly", "inactive"),
        ("recvonly", "inactive", "inactive"),
        ("inactive", "sendrecv", "inactive"),
    ],
)
def test_answer_allows_only_what_both_sides_want(offered: str, wanted: str, answered: str) -> None:
    ours = offer(Origin("p", 1, 1, "10.0.0.9"), "10.0.0.9", 5000, direction=offered)
    sdp, stream = answer(ours, ORIGIN, "10.0.0.2", 30000, wanted)
    assert stream is not None
    assert stream.direction == sdp.media[0].direction == answered
