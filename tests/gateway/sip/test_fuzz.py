"""Property fuzzing: parsers raise only their one error, and the agent never leaks state.

Example counts are bounded and the runs derandomized so the suite stays fast and repeatable;
raise `max_examples` locally for a longer hunt.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.rtp.packet import RtpParseError, parse_rtcp, parse_rtp
from gateway.rtp.telephone_event import EventReceiver, TelephoneEventError
from gateway.sip.agent import Agent, CallStateError
from gateway.sip.digest import Credentials
from gateway.sip.events import AgentConfig, CallEnded, IncomingCall, Output
from gateway.sip.headers import SipParseError
from gateway.sip.message import Request, StreamFramer, parse_message, response_to
from gateway.sip.sdp import (
    Origin,
    SessionDescription,
    accepted_stream,
    answer,
    offer,
    parse_sdp,
)
from gateway.sip.transaction import Outgoing

HERE = Path(__file__).parent
CORPUS = [
    p.read_bytes()
    for p in sorted(HERE.glob("samples/*.sip")) + sorted(HERE.glob("torture/*/*.sip"))
]
FAST = settings(max_examples=250, deadline=None, derandomize=True, database=None)
SLOW = settings(FAST, suppress_health_check=[HealthCheck.too_slow])  # whole agent runs
HEADERS = [
    "Via", "From", "To", "Call-ID", "CSeq", "Contact", "Route", "Record-Route", "Require",
    "Supported", "Allow", "Session-Expires", "Min-SE", "Content-Type", "Max-Forwards", "Expires",
    "Content-Length", "Retry-After", "WWW-Authenticate", "l", "m", "v", "x",
]  # fmt: skip
VALUE_PARTS = st.sampled_from([*'<>";,=@:;/ \t01789abz-.', "sip:", "tag=", "z9hG4bK"])
PEERS = [("10.0.0.3", 5060), ("10.0.0.4", 5080)]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A corpus message with a few byte-level edits: flips, cuts, splices, duplications."""
    data = bytearray(draw(st.sampled_from(CORPUS)))
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "dup", "drop_line", "header"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] = draw(st.integers(0, 255))
        elif kind == "cut":
            del data[at:]
        elif kind == "insert":
            data[at:at] = draw(st.binary(max_size=8))
        elif kind == "header":
            # A known header with a hostile value, spliced in at the start of a line.
            name = draw(st.sampled_from(HEADERS))
            value = "".join(draw(st.lists(VALUE_PARTS, max_size=20)))
            line_start = data.find(b"\r\n", at)
            at = line_start + 2 if line_start >= 0 else len(data)
            data[at:at] = f"{name}: {value}\r\n".encode()
        elif kind == "dup":
            data[at:at] = data[at : at + draw(st.integers(1, 40))]
        else:
            end = data.find(b"\r\n", at)
            del data[at : end if end >= 0 else len(data)]
    return bytes(data)


def parses_or_raises_sip_error(data: bytes) -> None:
    try:
        message = parse_message(data)
    except SipParseError:
        return
    assert parse_message(message.encode()).encode() == message.encode()


@FAST
@given(st.binary(max_size=400))
def test_sip_parser_on_random_bytes(data: bytes) -> None:
    parses_or_raises_sip_error(data)


@FAST
@given(mutated())
def test_sip_parser_on_mutated_messages(data: bytes) -> None:
    parses_or_raises_sip_error(data)


@FAST
@given(mutated(), st.lists(st.integers(1, 300), max_size=6))
def test_stream_framer_on_mutated_streams(data: bytes, cuts: list[int]) -> None:
    framer = StreamFramer()
    try:
        for start in range(0, len(data), cuts[0] if cuts else len(data) or 1):
            for message in framer.feed(data[start : start + (cuts[0] if cuts else len(data))]):
                parses_or_raises_sip_error(message)
    except SipParseError:
        return


@FAST
@given(st.one_of(st.binary(max_size=300), mutated().map(lambda d: d.split(b"\r\n\r\n")[-1])))
def test_sdp_parser_and_answer(data: bytes) -> None:
    """The parser raises only its error; what it parsed, offer/answer takes without raising
    (a raise there left an in-dialog INVITE's transaction unanswered, or a call ringing)."""
    try:
        sdp = parse_sdp(data)
    except SipParseError:
        return
    answer(sdp, Origin("c", 1, 1, "10.0.0.2"), "10.0.0.2", 30000)
    accepted_stream(sdp)


@FAST
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2**32 - 1), st.binary(max_size=6))))
def test_event_receiver_raises_only_its_error(packets: list[tuple[int, int, bytes]]) -> None:
    receiver = EventReceiver()
    for ssrc, timestamp, payload in packets:
        try:
            for press in receiver.receive(ssrc, timestamp, payload):
                assert press.digit in "0123456789*#ABCD"
        except TelephoneEventError:
            continue


@FAST
@given(st.binary(max_size=80))
def test_rtp_and_rtcp_parsers_raise_only_their_error(data: bytes) -> None:
    for parse in (parse_rtp, parse_rtcp):
        try:
            parse(data)
        except RtpParseError:
            continue


def drain(agent: Agent, now: float) -> list[Output]:
    """Run the agent's timers until none is left, as a driver would over a long idle time."""
    outputs: list[Output] = []
    for _ in range(500):
        deadline = agent.next_timer()
        if deadline is None:
            break
        now = max(now, deadline)
        outputs += agent.handle_timer(now)
    return outputs


@settings(SLOW, max_examples=150)
@given(
    st.lists(
        st.tuples(mutated(), st.sampled_from(PEERS), st.floats(0, 5), st.integers(0, 4)),
        min_size=1,
        max_size=12,
    ),
    st.integers(0, 2**16),
)
def test_agent_never_leaks_dialogs_or_transactions(
    steps: list[tuple[bytes, tuple[str, int], float, int]], seed: int
) -> None:
    agent = Agent(AgentConfig(address=("10.0.0.2", 5060)), random.Random(seed))
    now = 0.0
    calls: list[str] = []
    for data, source, pause, action in steps:
        now += pause
        out: list[Output] = agent.receive(data, source, "udp", now)
        calls += [e.call_id for e in out if isinstance(e, IncomingCall)]
        if calls and action:
            call_id = calls[-1]
            if action == 1:
                agent.hangup(call_id, now)
            elif action == 2 and call_id in agent.calls and not agent.calls[call_id].answered:
                agent.reject(call_id, 503, now, retry_after=10)
            elif action == 3 and call_id in agent.calls and not agent.calls[call_id].answered:
                remote = agent.calls[call_id].remote_sdp
                if remote is not None:
                    local, _ = answer(remote, Origin("c", 1, 1, "10.0.0.2"), "10.0.0.2", 30000)
                    agent.answer(call_id, local, now)
    drain(agent, now)
    assert agent.live_dialogs() == 0
    assert agent.live_transactions() == 0
    assert agent.next_timer() is None


INVITE = (HERE / "samples" / "freeswitch_invite.sip").read_bytes()
PBX = ("10.0.0.4", 5080)
ACTIONS = [
    "ack", "bye", "cancel", "hold", "update", "options", "again", "ring", "answer", "reject",
    "hangup", "reinvite", "wait",
]  # fmt: skip


COMMANDS: dict[str, Callable[[Agent, str, SessionDescription, float], list[Output]]] = {
    "ring": lambda agent, call_id, sdp, now: agent.ring(call_id, now),
    "answer": lambda agent, call_id, sdp, now: agent.answer(call_id, sdp, now),
    "reject": lambda agent, call_id, sdp, now: agent.reject(call_id, 486, now),
    "hangup": lambda agent, call_id, sdp, now: agent.hangup(call_id, now),
    "reinvite": lambda agent, call_id, sdp, now: agent.reinvite(call_id, "sendonly", now),
}


def in_dialog(method: str, seq: int, branch: str, to_tag: str | None, body: bytes = b"") -> bytes:
    """A request of the FreeSWITCH call with the tag, CSeq and branch the fuzzer chose."""
    head = INVITE.split(b"\r\n\r\n", 1)[0].decode()
    lines = [f"{method} sip:cadence@10.0.0.2:5060 SIP/2.0"]
    for line in head.split("\r\n")[1:]:
        name = line.split(":", 1)[0]
        if name == "Via":
            line = f"Via: SIP/2.0/UDP 10.0.0.4:5080;rport;branch=z9hG4bK{branch}"
        elif name == "To" and to_tag is not None:
            line += f";tag={to_tag}"
        elif name == "CSeq":
            line = f"CSeq: {seq} {method}"
        elif name == "Content-Length":
            line = f"Content-Length: {len(body)}"
        lines.append(line)
    return "\r\n".join(lines).encode() + b"\r\n\r\n" + body


@settings(SLOW, max_examples=200)
@given(
    st.lists(
        st.tuples(st.sampled_from(ACTIONS), st.sampled_from(["ours", "wrong", None]),
                  st.integers(-1, 2), st.sampled_from(["a", "b", "pN3XS1gc6mm3e"]),
                  st.floats(0, 40)),
        max_size=14,
    ),
    st.integers(0, 2**16),
)  # fmt: skip
def test_agent_survives_any_dialog_sequence(
    steps: list[tuple[str, str | None, int, str, float]], seed: int
) -> None:
    agent = Agent(AgentConfig(address=("10.0.0.2", 5060)), random.Random(seed))
    out = agent.receive(INVITE, PBX, "udp", 0.0)
    [call] = [e for e in out if isinstance(e, IncomingCall)]
    assert call.remote_sdp is not None
    local, _ = answer(call.remote_sdp, Origin("c", 1, 1, "10.0.0.2"), "10.0.0.2", 30000)
    hold = parse_sdp(INVITE.split(b"\r\n\r\n", 1)[1]).encode().replace(b"a=ptime", b"a=sendonly")
    now, seq = 0.0, 112736211
    outputs: list[Output] = []
    for action, tag_kind, seq_step, branch, pause in steps:
        now += pause if action == "wait" else 0.01
        live = agent.calls.get(call.call_id)
        tag = {"ours": live.dialog.local_tag if live else "x", "wrong": "nope", None: None}
        seq += seq_step
        if action in COMMANDS:
            with contextlib.suppress(CallStateError):
                outputs += COMMANDS[action](agent, call.call_id, local, now)
            continue
        method, body, branch_used = {
            "ack": ("ACK", b"", branch + "ack"),
            "bye": ("BYE", b"", branch + "bye"),
            "cancel": ("CANCEL", b"", "pN3XS1gc6mm3e"),
            "hold": ("INVITE", hold, branch + "hold"),
            "update": ("UPDATE", b"", branch + "upd"),
            "options": ("OPTIONS", b"", branch + "opt"),
            "again": ("INVITE", INVITE.split(b"\r\n\r\n", 1)[1], "pN3XS1gc6mm3e"),
            "wait": ("OPTIONS", b"", branch + "w"),
        }[action]
        request_seq = 112736211 if action in ("cancel", "again") else seq
        data = in_dialog(method, request_seq, branch_used, tag[tag_kind], body)
        outputs += agent.receive(data, PBX, "udp", now)
        outputs += agent.handle_timer(now)
    outputs += drain(agent, now)
    assert agent.live_dialogs() == 0
    assert agent.live_transactions() == 0
    # Every call the application heard of ended exactly once (a UAC may reuse a Call-ID for a
    # new INVITE after a failure, as it does after a 401, so count, not dedupe).
    started = 1 + len([e for e in outputs if isinstance(e, IncomingCall)])
    assert len([e for e in outputs if isinstance(e, CallEnded)]) == started


STATUSES = [100, 180, 183, 200, 401, 407, 422, 486, 487, 491, 503]


def peer_response(invite: Request, status: int, tag: str | None, timer: bool) -> bytes:
    """What a trunk might answer to our INVITE: challenges, 422, answers with or without SDP."""
    headers: list[tuple[str, str]] = [("Contact", "<sip:peer@10.0.0.9:5060>")]
    if status in (401, 407):
        name = "WWW-Authenticate" if status == 401 else "Proxy-Authenticate"
        headers.append((name, f'Digest realm="t", nonce="{tag or "n"}", qop="auth"'))
    if status == 422:
        headers.append(("Min-SE", "600"))
    if timer:
        headers.append(("Session-Expires", "90;refresher=uas"))
    body = b""
    if status == 200 and invite.body:
        remote = parse_sdp(invite.body)
        body = answer(remote, Origin("p", 1, 1, "10.0.0.9"), "10.0.0.9", 50000)[0].encode()
    return response_to(invite, status, tag, tuple(headers), body).encode()


@settings(SLOW, max_examples=200)
@given(
    st.lists(
        st.tuples(st.sampled_from([*STATUSES, 0, 1, 2]), st.sampled_from(["t1", "t2", None]),
                  st.booleans(), st.floats(0, 40)),
        max_size=12,
    ),
    st.integers(0, 2**16),
)  # fmt: skip
def test_uac_survives_any_response_sequence(
    steps: list[tuple[int, str | None, bool, float]], seed: int
) -> None:
    agent = Agent(AgentConfig(address=("10.0.0.2", 5060)), random.Random(seed))
    sdp = offer(Origin("c", 1, 1, "10.0.0.2"), "10.0.0.2", 30000)
    call_id, sent = agent.dial(
        "sip:peer@10.0.0.9", sdp, 0.0, credentials=Credentials("u", "p"), proxy=("10.0.0.9", 5060)
    )
    outputs: list[Output] = list(sent)
    now = 0.0
    for status, tag, timer, pause in steps:
        now += pause if status == 0 else 0.01
        invites = [parse_message(o.data) for o in outputs if isinstance(o, Outgoing)]
        invite = [m for m in invites if isinstance(m, Request) and m.method == "INVITE"][-1]
        if status == 1:
            outputs += agent.hangup(call_id, now)
        elif status == 2:
            with contextlib.suppress(CallStateError):
                outputs += agent.reinvite(call_id, "inactive", now)
        elif status > 2:
            data = peer_response(invite, status, tag, timer)
            outputs += agent.receive(data, ("10.0.0.9", 5060), "udp", now)
        outputs += agent.handle_timer(now)
    outputs += drain(agent, now)
    if agent.live_dialogs():  # answered without a session timer: only a hangup ends it
        outputs += agent.hangup(call_id, now)
        outputs += drain(agent, now)
    assert agent.live_dialogs() == 0
    assert agent.live_transactions() == 0
    assert len([e for e in outputs if isinstance(e, CallEnded)]) == 1
