"""Whole call flows between two real agents wired in one process (UAC dials UAS)."""

from __future__ import annotations

import pytest

from gateway.sip import digest
from gateway.sip.agent import Agent
from gateway.sip.events import (
    CallAnswered,
    CallConfirmed,
    CallEnded,
    CallRinging,
    IncomingCall,
    MediaChanged,
    Output,
)
from gateway.sip.message import Request, parse_message, response_to
from gateway.sip.sdp import Origin, answer, offer
from gateway.sip.transaction import Address, Outgoing
from tests.gateway.sip.wire import Wire, make_agent

UAS_URI = "sip:cadence@127.0.0.1:5070"


def pair(**options: object) -> tuple[Agent, Agent, Wire]:
    uac, uas = make_agent(5060, 1, **options), make_agent(5070, 2, **options)
    return uac, uas, Wire(uac, uas)


def dial(uac: Agent, wire: Wire, **kwargs: object) -> str:
    sdp = offer(Origin("uac", 1, 1, "127.0.0.1"), "127.0.0.1", 40000)
    call_id, out = uac.dial(UAS_URI, sdp, wire.now, **kwargs)  # type: ignore[arg-type]
    wire.take(uac, out)
    wire.pump()
    return call_id


def answer_call(uas: Agent, wire: Wire, call_id: str) -> None:
    incoming = wire.of(uas, IncomingCall)[-1]
    assert incoming.remote_sdp is not None
    local, stream = answer(
        incoming.remote_sdp, Origin("uas", 7, 1, "127.0.0.1"), "127.0.0.1", 42000
    )
    assert stream is not None
    wire.take(uas, uas.ring(call_id, wire.now))
    wire.take(uas, uas.answer(call_id, local, wire.now))
    wire.pump()


def test_basic_call_invite_ringing_answer_ack_bye() -> None:
    uac, uas, wire = pair()
    call_id = dial(uac, wire)
    assert [type(e) for e in wire.events[uas.config.address]] == [IncomingCall]
    answer_call(uas, wire, call_id)
    assert wire.of(uac, CallRinging) == [CallRinging(call_id, 180)]
    assert len(wire.of(uac, CallAnswered)) == 1
    assert wire.of(uas, CallConfirmed) == [CallConfirmed(call_id)]
    assert wire.sent(uac) == [
        f"INVITE {UAS_URI} SIP/2.0",
        "ACK sip:cadence@127.0.0.1:5070 SIP/2.0",
    ]
    assert wire.sent(uas) == ["SIP/2.0 100 Trying", "SIP/2.0 180 Ringing", "SIP/2.0 200 OK"]
    wire.take(uac, uac.hangup(call_id, wire.now))
    wire.pump()
    assert wire.of(uas, CallEnded) == [CallEnded(call_id, "remote_hangup")]
    assert wire.of(uac, CallEnded) == [CallEnded(call_id, "local_hangup")]
    wire.advance(wire.now + 64)
    for agent in (uac, uas):
        assert agent.live_dialogs() == 0
        assert agent.live_transactions() == 0
    assert wire.sent(uas)[-1] == "SIP/2.0 200 OK"


def test_lost_ok_is_retransmitted_until_ack() -> None:
    uac, uas, wire = pair()
    call_id = dial(uac, wire)
    lost = {"first": True}

    def lose_first_ok(source: Address, item: Outgoing) -> bool:
        if item.data.startswith(b"SIP/2.0 200") and lost["first"]:
            lost["first"] = False
            return True
        return False

    wire.drop = lose_first_ok
    answer_call(uas, wire, call_id)
    assert wire.of(uac, CallAnswered) == []
    wire.advance(wire.now + 0.6)
    assert len(wire.of(uac, CallAnswered)) == 1
    assert wire.of(uas, CallConfirmed) == [CallConfirmed(call_id)]
    wire.advance(wire.now + 10)
    assert wire.sent(uas).count("SIP/2.0 200 OK") == 2


def test_cancel_before_answer_gets_487() -> None:
    uac, uas, wire = pair()
    call_id = dial(uac, wire)
    wire.take(uas, uas.ring(call_id, wire.now))
    wire.pump()
    wire.take(uac, uac.hangup(call_id, wire.now))
    wire.pump()
    assert "CANCEL sip:cadence@127.0.0.1:5070 SIP/2.0" in wire.sent(uac)
    assert wire.sent(uas)[-2:] == ["SIP/2.0 200 OK", "SIP/2.0 487 Request Terminated"]
    assert wire.of(uas, CallEnded) == [CallEnded(call_id, "cancelled")]
    assert wire.of(uac, CallEnded) == [CallEnded(call_id, "local_hangup")]
    wire.advance(wire.now + 64)
    assert (uac.live_dialogs(), uas.live_dialogs()) == (0, 0)
    assert (uac.live_transactions(), uas.live_transactions()) == (0, 0)
    # The 487 was acknowledged inside the INVITE transaction, never answered by a BYE.
    assert not any(line.startswith("BYE") for line in wire.sent(uac))


def test_hangup_before_any_provisional_cancels_on_first_1xx() -> None:
    uac, uas, wire = pair()
    sdp = offer(Origin("uac", 1, 1, "127.0.0.1"), "127.0.0.1", 40000)
    call_id, out = uac.dial(UAS_URI, sdp, wire.now)
    wire.take(uac, uac.hangup(call_id, wire.now))  # before the INVITE has even left
    wire.take(uac, out)
    wire.pump()
    assert wire.of(uas, CallEnded) == [CallEnded(call_id, "cancelled")]
    wire.advance(wire.now + 64)
    assert uac.live_dialogs() == uas.live_dialogs() == 0


def test_hold_and_resume_by_reinvite() -> None:
    uac, uas, wire = pair()
    call_id = dial(uac, wire)
    answer_call(uas, wire, call_id)
    wire.take(uac, uac.reinvite(call_id, "sendonly", wire.now))
    wire.pump()
    held = wire.of(uas, MediaChanged)
    assert [e.direction for e in held] == ["recvonly"]
    assert [e.direction for e in wire.of(uac, MediaChanged)] == ["sendonly"]
    wire.take(uac, uac.reinvite(call_id, "sendrecv", wire.now))
    wire.pump()
    assert [e.direction for e in wire.of(uas, MediaChanged)] == ["recvonly", "sendrecv"]
    wire.advance(wire.now + 40)
    assert uac.live_dialogs() == uas.live_dialogs() == 1
    assert wire.of(uas, CallEnded) == []


def test_busy_engine_rejects_with_503_and_retry_after() -> None:
    uac, uas, wire = pair()
    call_id = dial(uac, wire)
    wire.take(uas, uas.reject(call_id, 503, wire.now, retry_after=30))
    wire.pump()
    assert wire.of(uac, CallEnded) == [CallEnded(call_id, "rejected", 503, 30)]
    assert wire.of(uas, CallEnded) == [CallEnded(call_id, "rejected", 503, 30)]
    assert "ACK sip:cadence@127.0.0.1:5070 SIP/2.0" in wire.sent(uac)
    wire.advance(wire.now + 64)
    assert uac.live_transactions() == uas.live_transactions() == 0


class ChallengingAgent(Agent):
    """A UAS that demands digest credentials for INVITE, like a carrier trunk does."""

    password = "s3cret"
    challenge = digest.Challenge("cadence.test", "nonce-1", "SHA-256", ("auth",), "opaque-1")

    def receive(self, data: bytes, source: Address, transport: str, now: float) -> list[Output]:
        message = parse_message(data)
        if isinstance(message, Request) and message.method == "INVITE":
            credentials = message.header("Authorization")
            if credentials is None or not digest.verify(
                credentials, "INVITE", self.challenge, self.password
            ):
                value = (
                    'Digest realm="cadence.test", nonce="nonce-1", algorithm=SHA-256, '
                    'qop="auth", opaque="opaque-1"'
                )
                reply = response_to(message, 401, "t1", (("WWW-Authenticate", value),))
                return [Outgoing(reply.encode(), source, transport)]
        return super().receive(data, source, transport, now)


def test_digest_challenge_and_retry() -> None:
    uac = make_agent(5060, 1)
    uas = ChallengingAgent(make_agent(5070, 2).config, make_agent(5070, 2).rng)
    wire = Wire(uac, uas)
    credentials = digest.Credentials("alice", "s3cret")
    call_id = dial(uac, wire, credentials=credentials)
    invites = [line for line in wire.sent(uac) if line.startswith("INVITE")]
    assert len(invites) == 2
    assert len(wire.of(uas, IncomingCall)) == 1
    answer_call(uas, wire, call_id)
    assert len(wire.of(uac, CallAnswered)) == 1


def test_wrong_password_is_not_retried_forever() -> None:
    uac = make_agent(5060, 1)
    uas = ChallengingAgent(make_agent(5070, 2).config, make_agent(5070, 2).rng)
    wire = Wire(uac, uas)
    call_id = dial(uac, wire, credentials=digest.Credentials("alice", "wrong"))
    assert wire.of(uac, CallEnded) == [CallEnded(call_id, "rejected", 401)]
    assert len([line for line in wire.sent(uac) if line.startswith("INVITE")]) == 2


class ChallengingProxy(ChallengingAgent):
    """The challenging trunk behind a proxy that demands its own credentials first (407, realm
    proxy.test, qop=auth) and refuses an INVITE whose nonce count did not rise (a replay)."""

    proxy = digest.Challenge("proxy.test", "p-1", "MD5", ("auth",))

    def __init__(self, agent: Agent) -> None:
        super().__init__(agent.config, agent.rng)
        self.last_nc = 0
        self.requests: list[Request] = []

    def receive(self, data: bytes, source: Address, transport: str, now: float) -> list[Output]:
        message = parse_message(data)
        if isinstance(message, Request):
            self.requests.append(message)
        if isinstance(message, Request) and message.method == "INVITE":
            answer = message.header("Proxy-Authorization")
            nc = int(digest.parse_auth_params(answer)[1]["nc"], 16) if answer else 0
            if (
                answer is None
                or nc <= self.last_nc
                or not digest.verify(answer, "INVITE", self.proxy, self.password)
            ):
                value = 'Digest realm="proxy.test", nonce="p-1", qop="auth"'
                reply = response_to(message, 407, "p1", (("Proxy-Authenticate", value),))
                return [Outgoing(reply.encode(), source, transport)]
            self.last_nc = nc
        return super().receive(data, source, transport, now)


def test_dial_through_a_challenging_proxy_answers_both_challenges() -> None:
    uac = make_agent(5060, 1)
    uas = ChallengingProxy(make_agent(5070, 2))
    wire = Wire(uac, uas)
    call_id = dial(uac, wire, credentials=digest.Credentials("alice", "s3cret"))
    invites = [r for r in uas.requests if r.method == "INVITE"]
    assert [r.cseq.seq for r in invites] == [1, 2, 3]  # 407, then 401, then through
    third = invites[-1]
    assert digest.parse_auth_params(third.header("Proxy-Authorization") or "")[1]["nc"] == (
        "00000002"
    )
    assert third.header("Authorization") is not None
    answer_call(uas, wire, call_id)
    assert len(wire.of(uac, CallAnswered)) == 1
    [ack] = [r for r in uas.requests if r.method == "ACK" and r.cseq.seq == 3]
    # the ACK of the 2xx carries the INVITE's credentials (RFC 3261 13.2.2.4)
    assert ack.header("Proxy-Authorization") == third.header("Proxy-Authorization")
    assert ack.header("Authorization") == third.header("Authorization")


def test_session_timer_refresh_keeps_call_and_expiry_ends_it() -> None:
    uac, uas, wire = pair(session_expires=90, min_se=90)
    call_id = dial(uac, wire)
    answer_call(uas, wire, call_id)
    wire.advance(200)
    assert wire.sent(uac).count("UPDATE sip:cadence@127.0.0.1:5070 SIP/2.0") == 4
    assert uac.live_dialogs() == uas.live_dialogs() == 1

    def drop_refresh(source: Address, item: Outgoing) -> bool:
        return item.data.startswith(b"UPDATE")

    wire.drop = drop_refresh
    wire.advance(400)
    assert wire.of(uas, CallEnded) == [CallEnded(call_id, "session_expired")]
    assert wire.of(uac, CallEnded) == [CallEnded(call_id, "remote_hangup")]
    wire.advance(500)
    assert uac.live_dialogs() == uas.live_dialogs() == 0
    assert uac.live_transactions() == uas.live_transactions() == 0


def test_unanswered_inbound_call_times_out_with_480() -> None:
    uac, uas = make_agent(5060, 1), make_agent(5070, 2, ring_timeout_s=30.0)
    wire = Wire(uac, uas)
    call_id = dial(uac, wire)
    wire.advance(31)
    assert wire.of(uas, CallEnded) == [CallEnded(call_id, "ring_timeout")]
    assert wire.of(uac, CallEnded) == [CallEnded(call_id, "rejected", 480)]


def test_outbound_call_nobody_answers_is_cancelled() -> None:
    uac, uas = make_agent(5060, 1, ring_timeout_s=20.0), make_agent(5070, 2)
    wire = Wire(uac, uas)
    call_id = dial(uac, wire)
    wire.take(uas, uas.ring(call_id, wire.now))
    wire.advance(21)
    assert wire.of(uac, CallEnded) == [CallEnded(call_id, "ring_timeout")]
    assert wire.of(uas, CallEnded) == [CallEnded(call_id, "cancelled")]
    wire.advance(100)
    assert uac.live_transactions() == uas.live_transactions() == 0


def retrying_callee(kind: str) -> tuple[Agent, Agent, dict[str, object]]:
    """A UAC and a callee that makes it resend its INVITE once: a digest challenge (401), or
    422 for a session interval below the callee's Min-SE; and the `dial` arguments."""
    if kind == "401":
        uac = make_agent(5060, 1, ring_timeout_s=30.0)
        uas = ChallengingAgent(make_agent(5070, 2).config, make_agent(5070, 2).rng)
        return uac, uas, {"credentials": digest.Credentials("alice", "s3cret")}
    uac = make_agent(5060, 1, ring_timeout_s=30.0, session_expires=90, min_se=90)
    return uac, make_agent(5070, 2, session_expires=1800, min_se=1800), {}


@pytest.mark.parametrize("kind", ["401", "422"])
def test_outbound_call_resent_after_a_401_or_422_still_times_out(kind: str) -> None:
    """The ring timeout survives the resend: the challenged (or 422) call that rings and is
    never answered is CANCELled 30 s after it was dialled, like any other."""
    uac, uas, arguments = retrying_callee(kind)
    wire = Wire(uac, uas)
    call_id = dial(uac, wire, **arguments)
    assert len([line for line in wire.sent(uac) if line.startswith("INVITE")]) == 2
    wire.take(uas, uas.ring(call_id, wire.now))
    wire.advance(29.0)
    assert wire.of(uac, CallEnded) == []
    wire.advance(31.0)
    assert wire.of(uac, CallEnded) == [CallEnded(call_id, "ring_timeout")]
    assert "CANCEL sip:cadence@127.0.0.1:5070 SIP/2.0" in wire.sent(uac)
    assert wire.of(uas, CallEnded) == [CallEnded(call_id, "cancelled")]
    wire.advance(200.0)
    assert uac.live_dialogs() == uas.live_dialogs() == 0
    assert uac.live_transactions() == uas.live_transactions() == 0


def test_a_422_retry_carries_the_callees_min_se() -> None:
    """RFC 4028 section 7.4: the resent INVITE's Min-SE is the 422's, not ours, so no element
    downstream lowers the interval below what the callee refused."""
    uac, uas, arguments = retrying_callee("422")
    wire = Wire(uac, uas)
    call_id = dial(uac, wire, **arguments)
    resent = uac.calls[call_id].invite
    assert (resent.header("Session-Expires"), resent.header("Min-SE")) == ("1800", "1800")
    assert len(wire.of(uas, IncomingCall)) == 1


@pytest.mark.parametrize("kind", ["401", "422"])
def test_hangup_before_any_provisional_then_a_401_or_422_ends_there(kind: str) -> None:
    """Hung up before any 1xx (no CANCEL possible yet), then challenged or 422'd: the call ends
    on that response; the INVITE is not resent to ring a phone the application gave up on."""
    uac, uas, arguments = retrying_callee(kind)
    wire = Wire(uac, uas)
    sdp = offer(Origin("uac", 1, 1, "127.0.0.1"), "127.0.0.1", 40000)
    call_id, out = uac.dial(UAS_URI, sdp, wire.now, **arguments)  # type: ignore[arg-type]
    wire.take(uac, out)
    wire.take(uac, uac.hangup(call_id, wire.now))
    wire.pump()
    assert len([line for line in wire.sent(uac) if line.startswith("INVITE")]) == 1
    assert wire.of(uac, CallEnded) == [CallEnded(call_id, "local_hangup")]
    assert wire.of(uas, IncomingCall) == []
    wire.advance(wire.now + 64)
    assert uac.live_dialogs() == uas.live_dialogs() == 0
    assert uac.live_transactions() == uas.live_transactions() == 0


def test_missing_ack_ends_the_call_with_bye_after_64_t1() -> None:
    uac, uas, wire = pair()

    def drop_ack(source: Address, item: Outgoing) -> bool:
        return item.data.startswith(b"ACK")

    wire.drop = drop_ack
    call_id = dial(uac, wire)
    answer_call(uas, wire, call_id)
    wire.advance(31.9)
    assert wire.of(uas, CallEnded) == []
    # T1 doubling to T2: 0.5, 1, 2, 4, 4, ... within 32 s
    assert wire.sent(uas).count("SIP/2.0 200 OK") == 1 + 10
    wire.advance(32.1)
    assert wire.of(uas, CallEnded) == [CallEnded(call_id, "no_ack")]
    assert wire.of(uac, CallEnded) == [CallEnded(call_id, "remote_hangup")]


def test_call_over_tcp_has_no_retransmissions_and_no_lingering_transactions() -> None:
    uac, uas, wire = pair()
    sdp = offer(Origin("uac", 1, 1, "127.0.0.1"), "127.0.0.1", 40000)
    call_id, out = uac.dial(UAS_URI, sdp, wire.now, transport="tcp")
    [invite] = out
    assert isinstance(invite, Outgoing)
    assert invite.transport == "tcp"
    assert b"Via: SIP/2.0/TCP 127.0.0.1:5060;" in invite.data
    assert b"Contact: <sip:cadence@127.0.0.1:5060;transport=tcp>" in invite.data
    wire.take(uac, out)
    wire.pump()
    answer_call(uas, wire, call_id)
    wire.advance(20)
    assert wire.sent(uac).count(f"INVITE {UAS_URI} SIP/2.0") == 1
    assert wire.sent(uas).count("SIP/2.0 200 OK") == 1
    wire.take(uac, uac.hangup(call_id, wire.now))
    wire.pump()
    wire.advance(wire.now + 0.001)  # timers J and K are zero over a reliable transport,
    assert (uac.live_transactions(), uas.live_transactions()) == (1, 1)  # so only the INVITEs
    wire.advance(32.001)  # stay, Accepted until timers M and L (64*T1 on any transport)
    assert (uac.live_transactions(), uas.live_transactions()) == (0, 0)


def test_session_refresh_by_reinvite_when_the_peer_lacks_update() -> None:
    uac, uas, wire = pair(session_expires=90, min_se=90)
    call_id = dial(uac, wire)
    answer_call(uas, wire, call_id)
    uac.calls[call_id].peer_update = False  # as if the 200's Allow had no UPDATE
    ours = uac.calls[call_id].local_sdp
    theirs = uas.calls[call_id].local_sdp
    wire.advance(100)
    assert wire.sent(uac).count(f"INVITE {UAS_URI} SIP/2.0") == 3  # the call and 2 refreshes
    assert not [line for line in wire.sent(uac) if line.startswith("UPDATE")]
    assert wire.of(uas, MediaChanged) == []  # same SDP, same o= version: nothing changed
    assert uac.calls[call_id].local_sdp == ours
    assert uas.calls[call_id].local_sdp == theirs  # an unchanged answer keeps its version
    assert uac.live_dialogs() == uas.live_dialogs() == 1


def test_callee_hangs_up_with_bye() -> None:
    uac, uas, wire = pair()
    call_id = dial(uac, wire)
    answer_call(uas, wire, call_id)
    wire.take(uas, uas.hangup(call_id, wire.now))
    wire.pump()
    assert wire.sent(uas)[-1] == "BYE sip:cadence@127.0.0.1:5060 SIP/2.0"
    assert wire.sent(uac)[-1] == "SIP/2.0 200 OK"
    assert wire.of(uac, CallEnded) == [CallEnded(call_id, "remote_hangup")]
    assert wire.of(uas, CallEnded) == [CallEnded(call_id, "local_hangup")]


def test_callee_hangup_before_the_ack_waits_for_it() -> None:
    uac, uas, wire = pair()
    call_id = dial(uac, wire)
    held: list[tuple[Address, Outgoing]] = []

    def hold_ack(source: Address, item: Outgoing) -> bool:
        if item.data.startswith(b"ACK"):
            held.append((source, item))
            return True
        return False

    wire.drop = hold_ack
    answer_call(uas, wire, call_id)
    wire.take(uas, uas.hangup(call_id, wire.now))
    assert wire.of(uas, CallEnded) == [CallEnded(call_id, "local_hangup")]
    wire.pump()
    assert not [line for line in wire.sent(uas) if line.startswith("BYE")]
    wire.drop = lambda source, item: False
    wire.queue.extend(held)
    wire.pump()
    assert [line for line in wire.sent(uas) if line.startswith("BYE")] == [
        "BYE sip:cadence@127.0.0.1:5060 SIP/2.0"
    ]
    assert wire.of(uac, CallEnded) == [CallEnded(call_id, "remote_hangup")]
    assert uas.live_dialogs() == 0


def test_glare_both_hold_at_once_then_retry_apart() -> None:
    uac, uas, wire = pair()
    call_id = dial(uac, wire)
    answer_call(uas, wire, call_id)
    wire.take(uac, uac.reinvite(call_id, "sendonly", wire.now))
    wire.take(uas, uas.reinvite(call_id, "sendonly", wire.now))
    wire.pump()
    assert wire.sent(uac).count("SIP/2.0 491 Request Pending") == 1
    assert wire.sent(uas).count("SIP/2.0 491 Request Pending") == 1
    wire.advance(wire.now + 10)
    # The callee retries first (0-2 s), the caller later (2.1-4 s). Each answer allows only
    # what both sides want, so two holds meet at inactive, and the second changes nothing.
    assert [e.direction for e in wire.of(uac, MediaChanged)] == ["inactive"]
    assert [e.direction for e in wire.of(uas, MediaChanged)] == ["inactive"]
    assert wire.sent(uac).count("INVITE sip:cadence@127.0.0.1:5070 SIP/2.0") == 3
    assert wire.sent(uas).count("INVITE sip:cadence@127.0.0.1:5060 SIP/2.0") == 2


class InDialogChallenger(Agent):
    """A trunk that demands credentials for the in-dialog requests of `methods` (and, with
    `invite`, for the dialling INVITE too), always with the same nonce, never stale."""

    password = "s3cret"
    value = 'Digest realm="cadence.test", nonce="nonce-1", algorithm=SHA-256, qop="auth"'
    challenge = digest.Challenge("cadence.test", "nonce-1", "SHA-256", ("auth",))

    def __init__(self, agent: Agent, methods: set[str], invite: bool = False) -> None:
        super().__init__(agent.config, agent.rng)
        self.methods, self.invite = methods, invite
        self.requests: list[Request] = []

    def receive(self, data: bytes, source: Address, transport: str, now: float) -> list[Output]:
        message = parse_message(data)
        if isinstance(message, Request):
            self.requests.append(message)
            in_dialog = message.to_addr.tag is not None
            guarded = message.method in self.methods if in_dialog else self.invite
            if guarded and message.method not in ("ACK", "CANCEL"):
                answer = message.header("Authorization")
                if answer is None or not digest.verify(
                    answer, message.method, self.challenge, self.password
                ):
                    headers = (("WWW-Authenticate", self.value),)
                    reply = response_to(message, 401, "t1", headers)
                    return [Outgoing(reply.encode(), source, transport)]
        return super().receive(data, source, transport, now)

    def of(self, method: str) -> list[Request]:
        return [r for r in self.requests if r.method == method]


def challenged_call(
    methods: set[str], password: str | None = "s3cret", *, invite: bool = True, **options: object
) -> tuple[Agent, InDialogChallenger, Wire, str]:
    """An answered call from a UAC with `password` (None: no credentials) to a trunk that
    challenges `methods` in the dialog, and the dialling INVITE too if `invite`."""
    uac = make_agent(5060, 1, **options)
    uas = InDialogChallenger(make_agent(5070, 2, **options), methods, invite)
    wire = Wire(uac, uas)
    credentials = None if password is None else digest.Credentials("alice", password)
    call_id = dial(uac, wire, credentials=credentials)
    answer_call(uas, wire, call_id)
    assert len(wire.of(uac, CallAnswered)) == 1
    return uac, uas, wire, call_id


def test_challenged_bye_is_resent_with_credentials() -> None:
    """RFC 3261 22.2: a 401 to our BYE is answered: the same Call-ID and tags, the next CSeq,
    an Authorization for BYE whose nonce count goes on from the INVITE's (the same nonce)."""
    uac, uas, wire, call_id = challenged_call({"BYE"})
    wire.take(uac, uac.hangup(call_id, wire.now))
    wire.pump()
    first, second = uas.of("BYE")
    assert first.header("Authorization") is None
    assert second.cseq.seq == first.cseq.seq + 1
    for name in ("Call-ID", "From", "To"):
        assert second.header(name) == first.header(name)
    answer = second.header("Authorization") or ""
    assert digest.verify(answer, "BYE", uas.challenge, "s3cret")
    invite_nc = digest.parse_auth_params(uas.of("INVITE")[-1].header("Authorization") or "")
    assert (invite_nc[1]["nc"], digest.parse_auth_params(answer)[1]["nc"]) == (
        "00000001",
        "00000002",
    )
    assert wire.log[-1][2] == "SIP/2.0 200 OK"
    assert wire.of(uas, CallEnded) == [CallEnded(call_id, "remote_hangup")]
    assert wire.of(uac, CallEnded) == [CallEnded(call_id, "local_hangup")]
    wire.advance(wire.now + 64)
    assert uac.live_dialogs() == uas.live_dialogs() == 0
    assert uac.live_transactions() == uas.live_transactions() == 0
    assert uac.ending == {}


def test_bye_refused_again_still_ends_the_call_once() -> None:
    """Wrong credentials: the BYE is answered once, refused again, and not sent a third
    time; the call ended locally at the hang-up and is reported once, nothing lingers."""
    uac, uas, wire, call_id = challenged_call({"BYE"}, "wrong", invite=False)
    wire.take(uac, uac.hangup(call_id, wire.now))
    wire.pump()
    assert [r.cseq.seq for r in uas.of("BYE")] == [2, 3]
    assert uas.of("BYE")[1].header("Authorization") is not None
    wire.advance(wire.now + 64)
    assert len(uas.of("BYE")) == 2
    assert wire.of(uac, CallEnded) == [CallEnded(call_id, "local_hangup")]
    assert uac.live_dialogs() == 0
    assert uac.live_transactions() == 0
    assert uac.ending == {}


def test_bye_challenge_without_credentials_is_not_answered() -> None:
    """A call dialled without credentials never offers any, in the dialog either."""
    uac, uas, wire, call_id = challenged_call({"BYE"}, None, invite=False)
    wire.take(uac, uac.hangup(call_id, wire.now))
    wire.pump()
    assert len(uas.of("BYE")) == 1
    assert wire.of(uac, CallEnded) == [CallEnded(call_id, "local_hangup")]
    wire.advance(wire.now + 64)
    assert uac.live_transactions() == 0
    assert uac.ending == {}


def test_challenged_reinvite_is_resent_and_the_hold_takes_effect() -> None:
    uac, uas, wire, call_id = challenged_call({"INVITE"})
    wire.take(uac, uac.reinvite(call_id, "sendonly", wire.now))
    wire.pump()
    reinvites = [r for r in uas.of("INVITE") if r.to_addr.tag is not None]
    assert [r.cseq.seq for r in reinvites] == [3, 4]  # INVITE 1, 2 (challenged), then these
    assert reinvites[0].header("Authorization") is None
    assert reinvites[1].body == reinvites[0].body
    assert digest.verify(
        reinvites[1].header("Authorization") or "", "INVITE", uas.challenge, "s3cret"
    )
    assert [e.direction for e in wire.of(uas, MediaChanged)] == ["recvonly"]
    assert [e.direction for e in wire.of(uac, MediaChanged)] == ["sendonly"]
    [ack] = [r for r in uas.of("ACK") if r.cseq.seq == 4]
    assert ack.header("Authorization") == reinvites[1].header("Authorization")
    wire.advance(wire.now + 40)
    assert uac.live_dialogs() == uas.live_dialogs() == 1
    assert wire.of(uas, CallEnded) == wire.of(uac, CallEnded) == []


def test_challenged_update_refresh_is_resent_and_keeps_the_call() -> None:
    uac, uas, wire, _call_id = challenged_call({"UPDATE"}, session_expires=90, min_se=90)
    wire.advance(200)
    updates = uas.of("UPDATE")
    assert updates
    assert all(r.header("Authorization") is None for r in updates[::2])
    assert all(r.header("Authorization") for r in updates[1::2])
    assert [r.cseq.seq for r in updates[:2]] == [3, 4]
    assert wire.of(uas, CallEnded) == wire.of(uac, CallEnded) == []
    assert uac.live_dialogs() == uas.live_dialogs() == 1
