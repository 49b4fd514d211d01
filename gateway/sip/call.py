"""One call as the agent tracks it: its dialog plus the timers that belong to the call.

Besides the dialog (dialog.py) and its INVITE transaction, a call owns the timers that RFC 3261
puts in the transaction user rather than in a transaction: the UAS's 2xx retransmission until
the ACK arrives (13.3.1.4: T1 doubling to T2, give up after 64*T1), the UAC's ACK kept for
retransmitted 2xx, the session timer (RFC 4028), and Cadence's own ring timeout for inbound
calls the application never answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.sip.dialog import Dialog
from gateway.sip.digest import Answers, Credentials
from gateway.sip.message import Request
from gateway.sip.sdp import AudioStream, SessionDescription
from gateway.sip.session_timer import SessionTimer
from gateway.sip.transaction import Address, ClientInvite, ServerInvite, State, Transaction


class CallStateError(RuntimeError):
    """A command the call's state does not allow (answering twice, re-INVITE while ringing)."""


@dataclass
class Call:
    call_id: str
    uac: bool
    dialog: Dialog
    peer: Address  # next hop for in-dialog requests
    transport: str
    invite: Request  # the INVITE that created the call (ours as UAC, theirs as UAS)
    server_invite: ServerInvite | None = None
    client_invite: ClientInvite | None = None
    local_sdp: SessionDescription | None = None
    remote_sdp: SessionDescription | None = None
    direction: str = "sendrecv"  # the media direction in force, from our side
    stream: AudioStream | None = None  # the media in force, once an in-dialog exchange settled it
    wanted_direction: str = "sendrecv"  # what our last `reinvite` asked for
    ringing: bool = False
    answered: bool = False
    confirmed: bool = False
    offer_in_ok: bool = False  # our 2xx to an offerless re-INVITE offered: its ACK answers
    hangup_requested: bool = False
    cancelled: bool = False
    ok_response: bytes | None = None
    ok_interval: float = 0.0
    ok_next: float | None = None
    ok_give_up: float | None = None
    ack: bytes | None = None
    session_timer: SessionTimer | None = None
    last_refresh: float = 0.0
    ring_deadline: float | None = None
    credentials: Credentials | None = None
    outbound_proxy: bool = False  # every request of the call goes to `peer`, whatever Contact says
    auth: Answers = field(default_factory=Answers)  # the challenges our INVITE drew
    # the challenges each of our in-dialog requests drew (RFC 3261 22.2-22.3): they share
    # `auth`'s nonce ledger (Answers.next_request), each resend answers them all
    reinvite_auth: Answers | None = None
    refresh_auth: Answers | None = None
    bye: Transaction | None = None  # our BYE, tracked past the call's end while challengeable
    bye_auth: Answers | None = None
    reinvite: ClientInvite | None = None
    reinvite_direction: str | None = None
    reinvite_ack: bytes | None = None
    reinvite_retry_at: float | None = None  # after 491 (glare), RFC 3261 14.1
    refresh: Transaction | None = None  # our UPDATE or re-INVITE refreshing the session
    peer_update: bool = False  # the peer's Allow lists UPDATE, so refreshes may use it
    ok_destination: Address | None = None
    reported: bool = False  # CallEnded already emitted (the call may linger to send BYE)

    def deadlines(self) -> list[float]:
        found = [self.ring_deadline, self.ok_next, self.ok_give_up, self.reinvite_retry_at]
        if self.session_timer is not None and self.confirmed:
            found.append(self.session_timer.deadline(self.last_refresh))
        return [d for d in found if d is not None]

    def settle(self, stream: AudioStream, moved: bool) -> bool:
        """Record what an in-dialog offer/answer settled; True if the media in force changed
        (`moved`: the peer's SDP did, for when no earlier exchange is on record)."""
        changed = stream.direction != self.direction or (
            stream != self.stream if self.stream is not None else moved
        )
        self.stream, self.direction = stream, stream.direction
        return changed

    def reinvite_pending(self) -> bool:
        return self.reinvite is not None and self.reinvite.state in (
            State.CALLING,
            State.PROCEEDING,
        )

    def stop_ok_retransmission(self) -> None:
        self.ok_response = None
        self.ok_next = None
        self.ok_give_up = None
