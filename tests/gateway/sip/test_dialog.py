"""Dialog state: identity, route sets from Record-Route, CSeq spaces and request building."""

from __future__ import annotations

import pytest

from gateway.sip.dialog import Dialog, DialogError, DialogInput, DialogState
from gateway.sip.headers import SipUri, Via, parse_uri
from gateway.sip.message import Request, Response, parse_message, response_to

INVITE = (
    b"INVITE sip:cadence@10.0.0.2 SIP/2.0\r\n"
    b"Via: SIP/2.0/UDP 10.0.0.9;branch=z9hG4bKp2\r\n"
    b"Via: SIP/2.0/UDP 10.0.0.4:5080;branch=z9hG4bKp1\r\n"
    b"Record-Route: <sip:p2.example.net;lr>\r\n"
    b"Record-Route: <sip:p1.example.net;lr>\r\n"
    b'From: "Bob" <sip:bob@example.net>;tag=bob1\r\nTo: <sip:cadence@example.com>\r\n'
    b"Call-ID: d1@10.0.0.4\r\nCSeq: 7 INVITE\r\nContact: <sip:bob@10.0.0.4:5080>\r\n"
    b"Content-Length: 0\r\n\r\n"
)
VIA = Via("UDP", "10.0.0.2", 5060, (("branch", "z9hG4bKours"),))


def invite() -> Request:
    message = parse_message(INVITE)
    assert isinstance(message, Request)
    return message


def test_uas_dialog_keeps_record_route_order_and_targets_contact() -> None:
    dialog = Dialog.for_uas(invite(), "us1", "<sip:cadence@10.0.0.2:5060>")
    assert dialog.remote_target == parse_uri("sip:bob@10.0.0.4:5080")
    assert dialog.route_set == ("<sip:p2.example.net;lr>", "<sip:p1.example.net;lr>")
    assert dialog.next_hop() == parse_uri("sip:p2.example.net;lr")
    bye = dialog.request("BYE", VIA)
    assert bye.uri == parse_uri("sip:bob@10.0.0.4:5080")
    assert bye.header_values("Route") == list(dialog.route_set)
    assert (bye.from_addr.tag, bye.to_addr.tag) == ("us1", "bob1")
    assert bye.cseq.seq == 1  # our CSeq space starts fresh, independent of the caller's 7
    assert bye.header("Contact") == "<sip:cadence@10.0.0.2:5060>"


def test_uac_dialog_reverses_record_route_and_learns_tag() -> None:
    ours = invite()
    dialog = Dialog.for_uac(ours, "<sip:cadence@10.0.0.2>")
    assert dialog.remote_tag is None
    ok = response_to(ours, 200, "callee9", (("Contact", "<sip:callee@10.0.0.7>"),))
    ok = Response(
        (*ok.headers, *[(n, v) for n, v in ours.headers if n == "Record-Route"]), b"", 200, "OK"
    )
    dialog.learn_from_response(ok)
    dialog.advance(DialogInput.ANSWER)
    assert dialog.remote_tag == "callee9"
    assert dialog.route_set == ("<sip:p1.example.net;lr>", "<sip:p2.example.net;lr>")
    assert dialog.remote_target == SipUri("sip", "10.0.0.7", "callee")
    ack = dialog.request("ACK", VIA, cseq=7)
    assert (ack.cseq.seq, ack.cseq.method, ack.header("Contact")) == (7, "ACK", None)
    assert dialog.request("BYE", VIA).cseq.seq == 8


def test_remote_cseq_must_grow() -> None:
    dialog = Dialog.for_uas(invite(), "us1", "<sip:c@h>")
    bye = parse_message(INVITE.replace(b"7 INVITE", b"8 BYE").replace(b"INVITE sip", b"BYE sip"))
    old = parse_message(INVITE.replace(b"7 INVITE", b"6 BYE").replace(b"INVITE sip", b"BYE sip"))
    assert isinstance(bye, Request)
    assert isinstance(old, Request)
    assert not dialog.accept_remote_seq(old)
    assert dialog.accept_remote_seq(bye)
    assert not dialog.accept_remote_seq(bye)


def test_state_table() -> None:
    dialog = Dialog.for_uas(invite(), "us1", "<sip:c@h>")
    assert dialog.advance(DialogInput.PROVISIONAL) is DialogState.EARLY
    assert dialog.advance(DialogInput.ANSWER) is DialogState.CONFIRMED
    assert dialog.advance(DialogInput.END) is DialogState.TERMINATED
    with pytest.raises(DialogError):
        dialog.advance(DialogInput.ANSWER)
