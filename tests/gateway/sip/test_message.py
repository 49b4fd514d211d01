"""SIP message parsing: captured-style samples, RFC 4475 torture messages, URIs, framing."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.sip.headers import (
    SipParseError,
    SipUri,
    TelUri,
    parse_name_addr,
    parse_uri,
    parse_via,
)
from gateway.sip.message import (
    Request,
    Response,
    StreamFramer,
    error_response,
    parse_message,
    response_to,
)

HERE = Path(__file__).parent
SAMPLES = sorted((HERE / "samples").glob("*.sip"))
VALID = sorted((HERE / "torture" / "valid").glob("*.sip"))
INVALID = sorted((HERE / "torture" / "invalid").glob("*.sip"))


def load(path: Path) -> Request | Response:
    return parse_message(path.read_bytes())


@pytest.mark.parametrize("path", SAMPLES + VALID, ids=lambda p: p.stem)
def test_round_trip(path: Path) -> None:
    message = load(path)
    again = parse_message(message.encode())
    if message.header("Content-Length") is None:  # encoding always states the length
        message = message.with_header("Content-Length", str(len(message.body)))
    assert again == message
    assert again.encode() == message.encode()


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_torture_messages_raise(path: Path) -> None:
    with pytest.raises(SipParseError):
        load(path)


def test_torture_corpus_is_complete() -> None:
    assert (len(VALID), len(INVALID)) == (28, 21)  # RFC 4475 section 3.1: 49 messages


def test_sipp_invite_fields() -> None:
    invite = load(HERE / "samples" / "sipp_invite.sip")
    assert isinstance(invite, Request)
    assert invite.method == "INVITE"
    assert invite.uri == SipUri("sip", "10.0.0.2", "service", port=5060)
    assert invite.vias[0].branch == "z9hG4bK-3195-1-0"
    assert invite.from_addr.tag == "3195SIPpTag001"
    assert invite.from_addr.display_name == "sipp"
    assert invite.to_addr.tag is None
    assert invite.cseq.seq == 1
    assert invite.body.startswith(b"v=0\r\n")
    assert invite.header("content-length") == str(len(invite.body))


def test_freeswitch_200_fields() -> None:
    ok = load(HERE / "samples" / "freeswitch_200.sip")
    assert isinstance(ok, Response)
    assert (ok.status, ok.reason) == (200, "OK")
    assert ok.vias[0].params[0] == ("rport", "5060")
    assert ok.header_values("Supported") == ["timer", "path", "replaces"]
    assert ok.contacts[0].uri == parse_uri("sip:1001@10.0.0.4:5080;transport=udp")
    assert ok.header("Session-Expires") == "1800;refresher=uac"


def test_wsinv_whitespace_folding_and_compact_forms() -> None:
    invite = load(HERE / "torture" / "valid" / "wsinv.sip")
    assert invite.to_addr.tag == "1918181833n"
    assert invite.from_addr.tag == "98asjd8"
    assert invite.from_addr.display_name == '"J Rosenberg \\\\\\""'
    assert invite.header("Max-Forwards") == "0068"
    assert (invite.cseq.seq, invite.cseq.method) == (9, "INVITE")
    assert [v.host for v in invite.vias] == ["192.0.2.2", "spindle.example.com", "192.168.255.111"]
    assert invite.vias[2].branch == "z9hG4bK30239"
    assert invite.header("NewFangledHeader") == "newfangled value continued newfangled value"
    assert invite.header("Subject") == ""
    assert invite.contacts[0].params[-1] == ("q", "0.33")
    assert len(invite.body) == int(invite.header("Content-Length") or "")


def test_intmeth_unusual_tokens() -> None:
    request = load(HERE / "torture" / "valid" / "intmeth.sip")
    assert isinstance(request, Request)
    assert request.method == "!interesting-Method0123456789_*+`.%indeed'~"
    assert isinstance(request.uri, SipUri)
    assert request.uri.user == "1_unusual.URI~(to-be!sure)&isn't+it$/crazy?,/;;*"
    assert request.uri.host == "example.com"


def test_dblreq_keeps_only_the_first_message() -> None:
    request = load(HERE / "torture" / "valid" / "dblreq.sip")
    assert isinstance(request, Request)
    assert request.method == "REGISTER"
    assert request.body == b""


def test_noreason_and_unreason_status_lines() -> None:
    assert load(HERE / "torture" / "valid" / "noreason.sip") == Response(
        load(HERE / "torture" / "valid" / "noreason.sip").headers, b"", 100, ""
    )
    unreason = load(HERE / "torture" / "valid" / "unreason.sip")
    assert isinstance(unreason, Response)
    assert unreason.reason.startswith("= 2**3 * 5**2")


def test_bad_version_answers_505_and_other_errors_400() -> None:
    data = (HERE / "torture" / "invalid" / "badvers.sip").read_bytes()
    with pytest.raises(SipParseError) as caught:
        parse_message(data)
    assert caught.value.status == 505
    assert (error_response(data, caught.value) or b"").startswith(b"SIP/2.0 505 ")
    data = (HERE / "torture" / "invalid" / "badinv01.sip").read_bytes()
    with pytest.raises(SipParseError) as caught:
        parse_message(data)
    reply = error_response(data, caught.value) or b""
    assert reply.startswith(b"SIP/2.0 400 Bad Request\r\nVia: SIP/2.0/UDP 192.0.2.15;;,;,,")


def test_no_error_response_without_the_headers_to_route_it() -> None:
    data = (HERE / "torture" / "invalid" / "insuf.sip").read_bytes()
    with pytest.raises(SipParseError) as caught:
        parse_message(data)
    assert error_response(data, caught.value) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sip:alice@example.com", SipUri("sip", "example.com", "alice")),
        ("sips:bob:pw@[2001:db8::1]:5061;transport=tcp", None),
        ("sip:10.0.0.1:5080;lr", SipUri("sip", "10.0.0.1", port=5080, params=(("lr", None),))),
        ("tel:+1-201-555-0123;phone-context=example.com", None),
    ],
)
def test_uri_round_trip(text: str, expected: SipUri | None) -> None:
    uri = parse_uri(text)
    assert str(uri) == text
    if expected is not None:
        assert uri == expected


def test_tel_and_ipv6_uris() -> None:
    tel = parse_uri("tel:+12015550123")
    assert tel == TelUri("+12015550123")
    sips = parse_uri("sips:bob@[2001:db8::1]:5061")
    assert isinstance(sips, SipUri)
    assert (sips.host, sips.port) == ("[2001:db8::1]", 5061)


@pytest.mark.parametrize(
    "text", ["sip:", "sip:alice@", "sip:a@b:99999", "sip:a b@c", "tel:", "sip:@host", "x"]
)
def test_bad_uris_raise(text: str) -> None:
    with pytest.raises(SipParseError):
        parse_uri(text)


def test_name_addr_with_quoted_angle_bracket() -> None:
    address = parse_name_addr('"a <b>" <sip:x@y>;tag=1')
    assert address.display_name == '"a <b>"'
    assert address.tag == "1"
    assert str(address) == '"a <b>" <sip:x@y>;tag=1'


def test_via_with_whitespace_and_received() -> None:
    via = parse_via("SIP / 2.0 / udp 192.0.2.1 : 5062 ;branch=z9hG4bKa;received=1.2.3.4")
    assert (via.transport, via.host, via.port, via.branch) == ("UDP", "192.0.2.1", 5062, "z9hG4bKa")


def test_response_to_copies_and_tags() -> None:
    invite = load(HERE / "samples" / "asterisk_invite.sip")
    assert isinstance(invite, Request)
    ringing = response_to(invite, 180, "abc")
    assert ringing.to_addr.tag == "abc"
    assert ringing.header("Call-ID") == invite.call_id
    assert ringing.vias == invite.vias
    assert parse_message(ringing.encode()) == ringing.with_header("Content-Length", "0")


def test_stream_framer_cuts_by_content_length() -> None:
    first = (HERE / "samples" / "sipp_invite.sip").read_bytes()
    second = (HERE / "samples" / "sipp_bye.sip").read_bytes()
    stream = b"\r\n\r\n" + first + second
    framer = StreamFramer()
    messages: list[bytes] = []
    for start in range(0, len(stream), 37):
        messages += framer.feed(stream[start : start + 37])
    assert messages == [first, second]


def test_stream_framer_requires_content_length() -> None:
    with pytest.raises(SipParseError):
        StreamFramer().feed(b"OPTIONS sip:a@b SIP/2.0\r\nVia: SIP/2.0/TCP h\r\n\r\n")


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("Content-Length", "²"),  # str.isdigit passes it, int refuses it
        ("Max-Forwards", "\u0661\u0662"),  # Arabic-Indic digits: int would read 12
        ("CSeq", "\u0661 OPTIONS"),
        ("Session-Expires", "⁹⁰"),
        ("Via", "SIP/2.0/UDP 10.0.0.1:\uff15\uff10\uff16\uff10;branch=z9hG4bK1"),  # fullwidth
    ],
)
def test_numbers_are_ascii_digits_or_the_message_is_malformed(header: str, value: str) -> None:
    data = (HERE / "samples" / "asterisk_options.sip").read_bytes()
    lines = [line for line in data.decode().split("\r\n") if line.split(":")[0] != header]
    lines.insert(1, f"{header}: {value}")
    with pytest.raises(SipParseError):
        parse_message("\r\n".join(lines).encode())
