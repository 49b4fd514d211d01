"""The agent against captured-style PBX messages, torture messages and hostile sources."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.sip.agent import Agent, CallStateError
from gateway.sip.digest import Challenge, Credentials, parse_auth_params, verify
from gateway.sip.events import (
    AgentConfig,
    CallConfirmed,
    CallEnded,
    IncomingCall,
    MediaChanged,
    MessageDropped,
    Output,
    Registered,
    RegistrationFailed,
)
from gateway.sip.message import Request, Response, parse_message, response_to
from gateway.sip.sdp import Origin, SessionDescription, answer, offer
from gateway.sip.transaction import Outgoing
from tests.gateway.sip.wire import make_agent

HERE = Path(__file__).parent
PBX = ("10.0.0.4", 5080)


def sample(name: str) -> bytes:
    return (HERE / "samples" / name).read_bytes()


def torture(name: str) -> bytes:
    return (HERE / "torture" / "valid" / f"{name}.sip").read_bytes()


def responses(outputs: list[Output]) -> list[Response]:
    found = [parse_message(o.data) for o in outputs if isinstance(o, Outgoing)]
    return [r for r in found if isinstance(r, Response)]


def statuses(outputs: list[Output]) -> list[int]:
    return [r.status for r in responses(outputs)]


def cadence() -> Agent:
    return Agent(AgentConfig(address=("10.0.0.2", 5060)), random.Random(5))


def test_options_is_answered_with_capabilities() -> None:
    out = cadence().receive(sample("asterisk_options.sip"), ("10.0.0.3", 5060), "udp", 0.0)
    [ok] = responses(out)
    assert ok.status == 200
    assert "UPDATE" in ok.header_values("Allow")
    assert ok.header("Accept") == "application/sdp"
    assert out[0].destination == ("10.0.0.3", 5060)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("name", "status"),
    [
        ("bext01", 420),
        ("unkscm", 416),
        ("novelsc", 416),
        ("invut", 415),
        ("lwsdisp", 200),
        ("semiuri", 200),
        ("transports", 200),
        ("esc02", 501),
        ("escnull", 405),
        ("dblreq", 405),
        ("zeromf", 200),  # Max-Forwards 0 only stops a proxy; we are the destination
        ("badbranch", 200),
        ("cparam02", 405),
        ("regaut01", 405),
        ("mpart01", 405),
    ],
)
def test_torture_requests_get_the_right_response(name: str, status: int) -> None:
    out = cadence().receive(torture(name), ("192.0.2.1", 5060), "udp", 0.0)
    assert statuses(out)[-1] == status


def test_wsinv_has_a_to_tag_so_it_names_an_unknown_dialog() -> None:
    agent = cadence()
    out = agent.receive(torture("wsinv"), ("192.0.2.2", 5060), "udp", 0.0)
    assert statuses(out) == [481]
    assert agent.live_dialogs() == 0


@pytest.mark.parametrize("name", ["sdp01", "baddate"])
def test_acceptable_torture_invites_become_calls(name: str) -> None:
    out = cadence().receive(torture(name), ("192.0.2.1", 5060), "udp", 0.0)
    assert statuses(out) == [100]
    assert len([o for o in out if isinstance(o, IncomingCall)]) == 1


def test_broadcast_via_response_is_a_stray() -> None:
    out = cadence().receive(torture("bcast"), ("192.0.2.198", 5060), "udp", 0.0)
    assert out == [MessageDropped(("192.0.2.198", 5060), "stray response")]


def test_malformed_request_gets_400_and_is_counted() -> None:
    data = (HERE / "torture" / "invalid" / "badinv01.sip").read_bytes()
    agent = cadence()
    out = agent.receive(data, ("192.0.2.1", 5060), "udp", 0.0)
    # The 400 echoes the request's Via as RFC 3261 8.2.6 says, malformed as it is.
    [reply] = [o for o in out if isinstance(o, Outgoing)]
    assert reply.data.startswith(b"SIP/2.0 400 Bad Request\r\nVia: SIP/2.0/UDP 192.0.2.15;;")
    assert MessageDropped(("192.0.2.1", 5060), "malformed") in out
    assert (agent.live_dialogs(), agent.live_transactions()) == (0, 0)


def test_disallowed_source_gets_403_or_silence() -> None:
    config = AgentConfig(address=("10.0.0.2", 5060), allowed_networks=("10.0.0.0/24",))
    agent = Agent(config, random.Random(1))
    assert statuses(agent.receive(sample("sipp_invite.sip"), ("10.0.0.1", 5061), "udp", 0)) == [100]
    out = agent.receive(sample("asterisk_invite.sip"), ("203.0.113.9", 5060), "udp", 0.0)
    assert statuses(out) == [403]
    assert agent.live_dialogs() == 1
    silent = Agent(
        AgentConfig(("10.0.0.2", 5060), allowed_networks=("10.0.0.0/24",), answer_forbidden=False),
        random.Random(1),
    )
    assert silent.receive(sample("asterisk_invite.sip"), ("203.0.113.9", 5060), "udp", 0.0) == [
        MessageDropped(("203.0.113.9", 5060), "forbidden")
    ]


def test_stray_response_and_unknown_dialog() -> None:
    agent = cadence()
    out = agent.receive(sample("freeswitch_200.sip"), PBX, "udp", 0.0)
    assert out == [MessageDropped(PBX, "stray response")]
    assert statuses(agent.receive(sample("sipp_bye.sip"), PBX, "udp", 0.0)) == [481]


def test_retransmitted_invite_is_absorbed_and_merged_request_refused() -> None:
    agent = cadence()
    invite = sample("asterisk_invite.sip")
    first = agent.receive(invite, ("10.0.0.3", 5060), "udp", 0.0)
    again = agent.receive(invite, ("10.0.0.3", 5060), "udp", 0.1)
    assert statuses(again) == [100]
    assert not [o for o in again if isinstance(o, IncomingCall)]
    merged = invite.replace(b"branch=z9hG4bKPj6f1d", b"branch=z9hG4bKPj6f1e")
    assert statuses(agent.receive(merged, ("10.0.0.3", 5060), "udp", 0.2)) == [482]
    assert len([o for o in first if isinstance(o, IncomingCall)]) == 1


def test_engine_full_rejects_with_503_retry_after() -> None:
    agent = cadence()
    out = agent.receive(sample("asterisk_invite.sip"), ("10.0.0.3", 5060), "udp", 0.0)
    [call] = [o for o in out if isinstance(o, IncomingCall)]
    out = agent.reject(call.call_id, 503, 0.1, retry_after=5)
    [busy] = responses(out)
    assert (busy.status, busy.header("Retry-After")) == (503, "5")
    assert busy.to_addr.tag
    assert agent.live_dialogs() == 0
    ack = (
        f"ACK sip:7000@10.0.0.2:5060 SIP/2.0\r\n{_line(busy, 'Via')}\r\n"
        f"{_line(busy, 'From')}\r\n{_line(busy, 'To')}\r\n{_line(busy, 'Call-ID')}\r\n"
        "CSeq: 27812 ACK\r\nContent-Length: 0\r\n\r\n"
    ).encode()
    assert agent.receive(ack, ("10.0.0.3", 5060), "udp", 0.2) == []
    agent.handle_timer(6.0)  # timer I ends the transaction T4 after the ACK
    assert agent.live_transactions() == 0
    assert agent.answer(call.call_id, _our_answer(call), 0.3) == []  # the call is gone


def test_answering_twice_is_a_state_error() -> None:
    agent = cadence()
    out = agent.receive(sample("sipp_invite.sip"), ("10.0.0.1", 5061), "udp", 0.0)
    [call] = [o for o in out if isinstance(o, IncomingCall)]
    agent.answer(call.call_id, _our_answer(call), 0.1)
    with pytest.raises(CallStateError):
        agent.answer(call.call_id, _our_answer(call), 0.2)


def _line(message: Response | Request, name: str) -> str:
    return f"{name}: {message.header(name)}"


def _our_answer(call: IncomingCall) -> SessionDescription:
    assert call.remote_sdp is not None
    return answer(call.remote_sdp, Origin("cadence", 1, 1, "10.0.0.2"), "10.0.0.2", 30000)[0]


def confirmed_freeswitch_call(agent: Agent) -> tuple[IncomingCall, Response, bytes]:
    """FreeSWITCH calls in, we answer, it ACKs: (the call, our 200, its ACK)."""
    out = agent.receive(sample("freeswitch_invite.sip"), PBX, "udp", 0.0)
    [call] = [o for o in out if isinstance(o, IncomingCall)]
    [ok] = responses(agent.answer(call.call_id, _our_answer(call), 0.1))
    ack = (
        "ACK sip:cadence@10.0.0.2:5060 SIP/2.0\r\n"
        "Via: SIP/2.0/UDP 10.0.0.4:5080;branch=z9hG4bKa1\r\n"
        f"{_line(ok, 'From')}\r\n{_line(ok, 'To')}\r\n{_line(ok, 'Call-ID')}\r\n"
        "CSeq: 112736211 ACK\r\nContent-Length: 0\r\n\r\n"
    ).encode()
    assert agent.receive(ack, PBX, "udp", 0.2) == [CallConfirmed(call.call_id)]
    return call, ok, ack


def test_a_cancel_with_its_invites_branch_but_another_call_id_gets_481() -> None:
    agent = cadence()
    invite = sample("freeswitch_invite.sip")
    [call] = [o for o in agent.receive(invite, PBX, "udp", 0.0) if isinstance(o, IncomingCall)]
    agent.ring(call.call_id, 0.1)
    head = invite.split(b"\r\n\r\n", 1)[0].replace(b"INVITE sip:", b"CANCEL sip:", 1)
    head = head.replace(b"CSeq: 112736211 INVITE", b"CSeq: 112736211 CANCEL")
    cancel = head.replace(b"Content-Length: 260", b"Content-Length: 0") + b"\r\n\r\n"
    stranger = cancel.replace(b"Call-ID: 7c5c4d0b", b"Call-ID: 00000000")
    assert statuses(agent.receive(stranger, PBX, "udp", 0.2)) == [481]
    assert call.call_id in agent.calls, "still ringing"
    out = agent.hangup(call.call_id, 0.3)  # it raised: the stray had answered the INVITE 487
    assert statuses(out) == [480]
    assert [o for o in out if isinstance(o, CallEnded)] == [CallEnded(call.call_id, "local_hangup")]


def test_freeswitch_call_with_hold_reinvite_and_out_of_order_cseq() -> None:
    agent = cadence()
    call, ok, ack = confirmed_freeswitch_call(agent)
    assert ok.header("Session-Expires") == "1800;refresher=uac"  # FreeSWITCH refreshes
    tag = ok.to_addr.tag or ""
    hold = sample("freeswitch_reinvite_hold.sip").replace(b"tag=TAG", f"tag={tag}".encode())
    out = agent.receive(hold, PBX, "udp", 1.0)
    [held] = [o for o in out if isinstance(o, MediaChanged)]
    assert held.direction == "recvonly"
    [reoffer_ok] = responses(out)
    assert b"a=recvonly" in reoffer_ok.body
    reack = ack.replace(b"112736211 ACK", b"112736212 ACK").replace(b"z9hG4bKa1", b"z9hG4bKa2")
    assert agent.receive(reack, PBX, "udp", 1.1) == []
    old = hold.replace(b"CSeq: 112736212", b"CSeq: 112736200").replace(b"z9hG4bKQ2", b"z9hG4bKQ3")
    assert statuses(agent.receive(old, PBX, "udp", 2.0)) == [500]
    bye = ack.replace(b"ACK sip", b"BYE sip").replace(b"112736211 ACK", b"112736213 BYE")
    bye = bye.replace(b"branch=z9hG4bKa1", b"branch=z9hG4bKb1")
    out = agent.receive(bye, PBX, "udp", 3.0)
    assert statuses(out)[0] == 200  # then timer G resends the unacknowledged 500
    assert CallEnded(call.call_id, "remote_hangup") in out


def test_a_reinvite_that_moves_the_media_and_changes_codec_is_reported() -> None:
    agent = cadence()
    _, ok, _ = confirmed_freeswitch_call(agent)
    hold = sample("freeswitch_reinvite_hold.sip").replace(
        b"tag=TAG", f"tag={ok.to_addr.tag}".encode()
    )
    moved = (  # a PBX handing the call to another media server: same direction, same lengths
        hold.replace(b"a=sendonly", b"a=sendrecv")
        .replace(b"c=IN IP4 10.0.0.4", b"c=IN IP4 10.0.0.9")
        .replace(b"m=audio 24568 RTP/AVP 8 101", b"m=audio 30010 RTP/AVP 0 101")
        .replace(b"a=rtpmap:8 PCMA/8000", b"a=rtpmap:0 PCMU/8000")
    )
    out = agent.receive(moved, PBX, "udp", 1.0)
    [change] = [o for o in out if isinstance(o, MediaChanged)]
    stream = change.stream
    assert (stream.direction, stream.codec, stream.payload_type) == ("sendrecv", "PCMU", 0)
    assert (stream.remote_address, stream.remote_port) == ("10.0.0.9", 30010)
    [reply] = responses(out)
    assert b"RTP/AVP 0 101" in reply.body
    again = moved.replace(b"CSeq: 112736212", b"CSeq: 112736213")
    again = again.replace(b"z9hG4bKQ2", b"z9hG4bKQ4")
    out = agent.receive(again, PBX, "udp", 2.0)
    assert statuses(out) == [200]
    assert [o for o in out if isinstance(o, MediaChanged)] == [], "the same offer moves nothing"


def test_a_reinvite_whose_only_codec_has_a_malformed_rtpmap_gets_488() -> None:
    """Its a=rtpmap has no clock rate: the parser takes it, offer/answer used to raise out of
    `receive`, leaving the INVITE's transaction unanswered (the PBX's Timer B then tore the
    call down). The codec is unusable, so the re-INVITE is refused and the call goes on."""
    agent = cadence()
    call, ok, _ = confirmed_freeswitch_call(agent)
    hold = sample("freeswitch_reinvite_hold.sip").replace(
        b"tag=TAG", f"tag={ok.to_addr.tag}".encode()
    )
    malformed = hold.replace(b"a=rtpmap:8 PCMA/8000", b"a=rtpmap:8 PCMA/rate")
    assert statuses(agent.receive(malformed, PBX, "udp", 1.0)) == [488]
    assert call.call_id in agent.calls


def test_the_ack_of_an_offerless_reinvite_brings_the_answer_and_moves_the_media() -> None:
    """A PBX re-INVITEs without SDP (a delayed offer, as in transfers): our 2xx offers, its
    ACK answers. That answer was ignored, so RTP kept going to the old address."""
    agent = cadence()
    _, ok, ack = confirmed_freeswitch_call(agent)
    hold = sample("freeswitch_reinvite_hold.sip").replace(
        b"tag=TAG", f"tag={ok.to_addr.tag}".encode()
    )
    head, body = hold.split(b"\r\n\r\n", 1)
    offerless = head.replace(b"Content-Length: 224", b"Content-Length: 0") + b"\r\n\r\n"
    [reply] = responses(agent.receive(offerless, PBX, "udp", 1.0))
    assert reply.status == 200
    assert b"m=audio" in reply.body, "our offer"
    moved = (
        body.replace(b"a=sendonly", b"a=sendrecv")
        .replace(b"c=IN IP4 10.0.0.4", b"c=IN IP4 10.0.0.9")
        .replace(b"m=audio 24568", b"m=audio 30010")
    )
    answer_ack = (
        ack.replace(b"112736211 ACK", b"112736212 ACK")
        .replace(b"z9hG4bKa1", b"z9hG4bKa2")
        .replace(b"Content-Length: 0\r\n\r\n", b"Content-Type: application/sdp\r\n")
        + f"Content-Length: {len(moved)}\r\n\r\n".encode()
        + moved
    )
    [change] = agent.receive(answer_ack, PBX, "udp", 1.1)
    assert isinstance(change, MediaChanged)
    assert (change.stream.remote_address, change.stream.remote_port) == ("10.0.0.9", 30010)
    assert change.direction == "sendrecv"
    again = answer_ack.replace(b"112736212 ACK", b"112736213 ACK")
    assert agent.receive(again, PBX, "udp", 1.2) == [], "only the ACK of that 2xx answers"


def test_update_with_an_offer_is_answered_in_its_200() -> None:
    agent = cadence()
    _, ok, _ = confirmed_freeswitch_call(agent)
    hold = sample("freeswitch_reinvite_hold.sip").replace(
        b"tag=TAG", f"tag={ok.to_addr.tag}".encode()
    )
    update = hold.replace(b"INVITE sip:", b"UPDATE sip:").replace(b"212 INVITE", b"212 UPDATE")
    out = agent.receive(update, PBX, "udp", 1.0)
    [reply] = responses(out)
    assert reply.status == 200
    assert b"a=recvonly" in reply.body
    assert [o.direction for o in out if isinstance(o, MediaChanged)] == ["recvonly"]
    assert agent.handle_timer(5.0) == []  # a 2xx to UPDATE is not retransmitted


class Registrar:
    """A registrar that challenges once, then grants a shorter binding than asked for, on the
    Contact it was sent or on `contact` (the form a registrar or a NAT rewrote it to)."""

    challenge = Challenge("trunk.example", "n-1", "MD5", ("auth",))

    def __init__(self, contact: str | None = None) -> None:
        self.registers = 0
        self.contact = contact

    def reply(self, data: bytes) -> bytes:
        request = parse_message(data)
        assert isinstance(request, Request)
        self.registers += 1
        credentials = request.header("Authorization")
        if credentials is None or not verify(credentials, "REGISTER", self.challenge, "pw"):
            value = 'Digest realm="trunk.example", nonce="n-1", qop="auth"'
            return response_to(request, 401, "r", (("WWW-Authenticate", value),)).encode()
        contact = f"{self.contact or request.header('Contact')};expires=120"
        return response_to(request, 200, "r", (("Contact", contact),)).encode()


@pytest.mark.parametrize(
    "contact",
    [
        None,
        "<sip:cadence@127.0.0.1>",  # the port left out: 5060
        "<sip:cadence@203.0.113.7:40000>",  # rewritten by a NAT on the way
    ],
)
def test_register_with_challenge_and_refresh(contact: str | None) -> None:
    agent = make_agent(5060, 3)
    registrar = Registrar(contact)
    trunk = ("127.0.0.9", 5060)
    events: list[Output] = []

    def deliver(outputs: list[Output], now: float) -> None:
        for item in outputs:
            if isinstance(item, Outgoing):
                deliver(agent.receive(registrar.reply(item.data), trunk, "udp", now), now)
            else:
                events.append(item)

    deliver(
        agent.register(
            "sip:127.0.0.9",
            "sip:cadence@trunk.example",
            0.0,
            credentials=Credentials("cadence", "pw"),
            expires=3600,
        ),
        0.0,
    )
    assert events == [Registered("sip:cadence@trunk.example", 120)]
    # Refreshed half-way through the 120 s the registrar granted, not the 3600 s asked for.
    assert agent.registrations["sip:cadence@trunk.example"].refresh_at == 60.0
    deliver(agent.handle_timer(60.0), 60.0)
    assert events[-1] == Registered("sip:cadence@trunk.example", 120)
    assert registrar.registers == 4  # each attempt challenged once, then accepted


def test_register_failure_and_timeout_are_reported() -> None:
    agent = make_agent(5060, 4)
    out = agent.register("sip:127.0.0.9", "sip:a@b", 0.0)
    assert agent.live_transactions() == 1
    assert RegistrationFailed("sip:a@b", None) in agent.handle_timer(32.0)
    assert agent.registrations == {}
    assert len(out) == 1


def test_register_through_an_outbound_proxy_is_sent_there_for_the_registrar() -> None:
    agent = make_agent(5060, 4)
    (sent,) = agent.register("sip:trunk.example", "sip:a@trunk.example", 0.0, proxy=PBX)
    assert isinstance(sent, Outgoing)
    assert sent.destination == PBX
    request = parse_message(sent.data)
    assert isinstance(request, Request)
    assert (request.method, str(request.uri)) == ("REGISTER", "sip:trunk.example")


class ProxiedRegistrar:
    """A proxy (407, realm proxy.test) in front of a registrar (401, realm trunk.example), both
    with qop=auth: the proxy refuses a nonce count that does not rise (a replay); only a
    REGISTER answering both is bound. `nonce` gives each of the registrar's challenges its
    nonce (refusals included): it may keep one or hand out new ones; `stale` marks a refusal
    of an answer stale=true (as if its nonce had expired, whatever the password)."""

    def __init__(
        self,
        password: str = "pw",
        nonce: Callable[[int], str] = lambda n: "n-1",
        stale: bool = False,
    ) -> None:
        self.password, self.nonce, self.stale = password, nonce, stale
        self.registers: list[Request] = []
        self.proxy_nc: dict[str, int] = {}  # the proxy's nonces: the last nonce count seen

    def _proxy_allows(self, request: Request) -> bool:
        answer = request.header("Proxy-Authorization")
        if answer is None:
            return False
        params = parse_auth_params(answer)[1]
        nonce, nc = params.get("nonce", ""), int(params.get("nc", "0"), 16)
        challenge = Challenge("proxy.test", nonce, "MD5", ("auth",))
        if nc <= self.proxy_nc.get(nonce, nc) or not verify(answer, "REGISTER", challenge, "pw"):
            return False
        self.proxy_nc[nonce] = nc
        return True

    def reply(self, data: bytes) -> bytes:
        request = parse_message(data)
        assert isinstance(request, Request)
        self.registers.append(request)
        assert len(self.registers) < 20, "challenged for ever"
        if not self._proxy_allows(request):
            nonce = f"p-{len(self.registers)}"
            self.proxy_nc[nonce] = 0
            value = f'Digest realm="proxy.test", nonce="{nonce}", qop="auth"'
            return response_to(request, 407, "r", (("Proxy-Authenticate", value),)).encode()
        nonce = self.nonce(len(self.registers))
        challenge = Challenge("trunk.example", nonce, "MD5", ("auth",))
        answer = request.header("Authorization")
        if answer is None or not verify(answer, "REGISTER", challenge, self.password):
            value = f'Digest realm="trunk.example", nonce="{nonce}", qop="auth"'
            if answer is not None and self.stale:
                value += ", stale=true"
            return response_to(request, 401, "r", (("WWW-Authenticate", value),)).encode()
        contact = f"{request.header('Contact')};expires=120"
        return response_to(request, 200, "r", (("Contact", contact),)).encode()


def register_at(agent: Agent, server: ProxiedRegistrar, now: float = 0.0) -> list[Output]:
    """Register through `server`, delivering every REGISTER and response; the events."""
    events: list[Output] = []

    def deliver(outputs: list[Output]) -> None:
        for item in outputs:
            if isinstance(item, Outgoing):
                deliver(agent.receive(server.reply(item.data), ("127.0.0.9", 5060), "udp", now))
            else:
                events.append(item)

    credentials = Credentials("cadence", "pw")
    deliver(
        agent.register("sip:127.0.0.9", "sip:cadence@trunk.example", now, credentials=credentials)
    )
    return events


def test_register_answers_the_proxy_and_the_registrar_together() -> None:
    agent = make_agent(5060, 6)
    server = ProxiedRegistrar()
    assert register_at(agent, server) == [Registered("sip:cadence@trunk.example", 120)]
    first, second, third = server.registers
    assert [r.cseq.seq for r in server.registers] == [1, 2, 3]
    assert first.header("Proxy-Authorization") is first.header("Authorization") is None
    assert second.header("Authorization") is None
    # the third answers both, the proxy's nonce counted on (nc=2), the registrar's new (nc=1)
    assert parse_auth_params(third.header("Proxy-Authorization") or "")[1]["nc"] == "00000002"
    assert parse_auth_params(third.header("Authorization") or "")[1]["nc"] == "00000001"
    # a refresh starts afresh: challenged again by both, and bound again
    assert register_at(agent, server, 60.0) == [Registered("sip:cadence@trunk.example", 120)]
    assert len(server.registers) == 6


REFUSED = 'realm "trunk.example" refused the credentials'


@pytest.mark.parametrize(
    ("nonce", "stale", "registers", "reason"),
    [
        (lambda n: "n-1", False, 3, REFUSED),
        # a new nonce on every refusal, stale absent: still refused, one wrong answer sent
        # (RFC 7616 3.3), not one per challenge until the bound (fail2ban bans for fewer)
        (lambda n: f"n-{n}", False, 3, REFUSED),
        # stale=true each time: answered again, until the bound
        (lambda n: f"n-{n}", True, 5, "still challenged after 4 answers"),
    ],
)
def test_wrong_credentials_end_the_registration_attempt(
    nonce: Callable[[int], str], stale: bool, registers: int, reason: str
) -> None:
    agent = make_agent(5060, 7)
    server = ProxiedRegistrar(password="other", nonce=nonce, stale=stale)
    events = register_at(agent, server)
    assert events == [RegistrationFailed("sip:cadence@trunk.example", 401, reason)]
    assert len(server.registers) == registers
    assert agent.registrations == {}  # the gateway retries later, with its backoff


@pytest.mark.parametrize(
    "options",
    [{"allowed_networks": ("10.0.0.0/33",)}, {"min_se": 60}, {"session_expires": 60}],
)
def test_bad_config_fails_when_built(options: dict[str, object]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - ipaddress and our checks raise plain ValueError
        AgentConfig(("10.0.0.2", 5060), **options)  # type: ignore[arg-type]


def test_a_rejection_with_a_retry_after_in_other_digits_still_ends_the_call() -> None:
    """'²' passes str.isdigit and then makes int raise: the call must end all the same."""
    agent = cadence()
    sdp = offer(Origin("c", 1, 1, "10.0.0.2"), "10.0.0.2", 30000)
    call_id, sent = agent.dial("sip:peer@10.0.0.9", sdp, 0.0)
    [invite] = [parse_message(o.data) for o in sent if isinstance(o, Outgoing)]
    assert isinstance(invite, Request)
    busy = response_to(invite, 503, "t1", (("Retry-After", "²"),)).encode()
    out = agent.receive(busy, ("10.0.0.9", 5060), "udp", 0.1)
    assert CallEnded(call_id, "rejected", 503, None) in out
    assert agent.live_dialogs() == 0
