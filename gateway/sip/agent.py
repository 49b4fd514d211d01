"""The sans-IO SIP user agent: bytes and `now` in; events, datagrams and a deadline out.

A driver owns the sockets and one timer:

    agent = Agent(AgentConfig(address=("192.0.2.10", 5060)), random.Random())
    for item in agent.receive(data, source, "udp", now):   # and after handle_timer(now)
        Outgoing -> sendto(item.data, item.destination); anything else is an event
    arm a timer for agent.next_timer(); when it fires, call agent.handle_timer(now)

Inbound calls arrive as `IncomingCall`; the application answers with `ring`, `answer`, `reject`
(486 Busy Here or 503 with Retry-After while the engine is full or draining) or `hangup`.
Outbound calls and registrations start with `dial` and `register` (caller.py). The agent
answers OPTIONS, CANCEL, re-INVITE (hold/resume), UPDATE and BYE by itself and keeps session
timers. Malformed datagrams get 400 when they can be answered; nothing a peer sends can leave a
call or transaction behind once the timers have run: `live_dialogs()` and
`live_transactions()` let tests hold it to that.
"""

from __future__ import annotations

from dataclasses import replace

from gateway.sip import session_timer
from gateway.sip.call import Call, CallStateError
from gateway.sip.caller import ALLOW
from gateway.sip.dialog import Dialog, DialogInput
from gateway.sip.events import (
    CallConfirmed,
    IncomingCall,
    MediaChanged,
    MessageDropped,
    Output,
)
from gateway.sip.headers import SipParseError, SipUri, TelUri
from gateway.sip.message import Request, Response, error_response, parse_message, response_to
from gateway.sip.sdp import SessionDescription, accepted_stream, answer, parse_sdp
from gateway.sip.transaction import (
    Address,
    Outgoing,
    ServerInvite,
    ServerNonInvite,
    State,
)
from gateway.sip.upkeep import Upkeep

__all__ = ["Agent", "CallStateError"]

KNOWN_METHODS = {"REGISTER", "SUBSCRIBE", "NOTIFY", "PRACK", "MESSAGE", "REFER", "PUBLISH"}
SUPPORTED_EXTENSIONS = {"timer"}
ServerTxn = ServerInvite | ServerNonInvite


class Agent(Upkeep):
    # -- driver entry points -------------------------------------------------------------

    def receive(self, data: bytes, source: Address, transport: str, now: float) -> list[Output]:
        if not data.strip(b"\r\n"):
            return []  # CRLF keep-alive (RFC 5626)
        allowed = self.config.allows(source)
        try:
            message = parse_message(data)
        except SipParseError as error:
            reply = error_response(data, error) if allowed else None
            sent = [Outgoing(reply, source, transport)] if reply else []
            return [*sent, MessageDropped(source, "malformed")]
        out: list[Output] = []
        if not allowed:
            answerable = isinstance(message, Request) and message.method != "ACK"
            if answerable and self.config.answer_forbidden and isinstance(message, Request):
                out.append(Outgoing(response_to(message, 403).encode(), source, transport))
            return [*out, MessageDropped(source, "forbidden")]
        if isinstance(message, Response):
            out += self._on_response(message, source, now)
        else:
            out += self._on_request(message, source, transport, now)
        return out + self.handle_timer(now)

    def next_timer(self) -> float | None:
        deadlines = [d for call in self.calls.values() for d in call.deadlines()]
        deadlines += [r.refresh_at for r in self.registrations.values() if r.refresh_at is not None]
        stack = self.stack.next_timer()
        if stack is not None:
            deadlines.append(stack)
        return min(deadlines, default=None)

    def handle_timer(self, now: float) -> list[Output]:
        out: list[Output] = []
        for transaction, step in self.stack.handle_timer(now):
            out += step.sends
            if step.timed_out:
                out += self._on_transaction_timeout(transaction, now)
        for call in list(self.calls.values()):
            out += self._call_timers(call, now)
        for registration in list(self.registrations.values()):
            if registration.refresh_at is not None and registration.refresh_at <= now:
                out += self._send_register(registration, now)
        return out

    def live_dialogs(self) -> int:
        return len(self.calls)

    def live_transactions(self) -> int:
        return len(self.stack)

    # -- application commands for inbound calls ----------------------------------------

    def ring(self, call_id: str, now: float) -> list[Output]:
        call = self._uas_call(call_id)
        if call is None:
            return []
        call.ringing = True
        call.dialog.advance(DialogInput.PROVISIONAL)
        return self._reply(call, 180, now, (("Contact", call.dialog.local_contact),))

    def answer(self, call_id: str, local_sdp: SessionDescription, now: float) -> list[Output]:
        call = self._uas_call(call_id)
        if call is None:
            return []
        call.local_sdp = local_sdp
        call.ring_deadline = None
        call.answered = True
        call.dialog.advance(DialogInput.ANSWER)
        call.last_refresh = now
        headers = self._answer_headers(call, call.invite)
        sent = self._reply(call, 200, now, headers, local_sdp.encode())
        self._start_ok_retransmission(call, sent[0], now)
        return sent

    def reject(
        self, call_id: str, status: int, now: float, retry_after: int | None = None
    ) -> list[Output]:
        call = self._uas_call(call_id)
        if call is None:
            return []
        headers = (("Retry-After", str(retry_after)),) if retry_after is not None else ()
        sent = self._reply(call, status, now, headers)
        return [*sent, *self._end(call, now, "rejected", status, retry_after)]

    def hangup(self, call_id: str, now: float) -> list[Output]:
        """End a call in whatever state: 480, CANCEL or BYE as the state requires."""
        call = self.calls.get(call_id)
        if call is None:
            return []
        if not call.uac and not call.answered:
            return [*self._reply(call, 480, now), *self._end(call, now, "local_hangup")]
        if call.confirmed:
            return [*self._bye(call, now), *self._end(call, now, "local_hangup")]
        # Too early for BYE: CANCEL once a 1xx proves the INVITE arrived (UAC), or BYE when
        # the ACK for our 2xx comes (UAS). Until then the call lingers, already reported.
        call.hangup_requested = True
        out: list[Output] = []
        invite = call.client_invite
        if call.uac and invite is not None and invite.state is State.PROCEEDING:
            out += self._cancel(call, now)
        return [*out, *self._report(call, "local_hangup")]

    def _uas_call(self, call_id: str) -> Call | None:
        """The inbound call a command names; None once it ended (the app saw CallEnded)."""
        call = self.calls.get(call_id)
        if call is not None and (call.uac or call.answered or call.server_invite is None):
            raise CallStateError(f"call {call_id} is not an unanswered inbound call")
        return call

    def _reply(
        self,
        call: Call,
        status: int,
        now: float,
        headers: tuple[tuple[str, str], ...] = (),
        body: bytes = b"",
    ) -> list[Output]:
        assert call.server_invite is not None
        return self._respond(call.server_invite, status, now, headers, body, call.dialog.local_tag)

    # -- requests ------------------------------------------------------------------------

    def _on_request(
        self, request: Request, source: Address, transport: str, now: float
    ) -> list[Output]:
        existing = self.stack.match_request(request)
        if existing is not None:
            if request.method != "ACK":
                return list(existing.receive_request(now).sends)
            if isinstance(existing, ServerInvite) and existing.state is not State.PROCEEDING:
                accepted = existing.state is State.ACCEPTED
                existing.receive_ack(now)
                # RFC 2543 peers reuse the INVITE's branch for the ACK of a 2xx.
                return self._on_ack(request, now) if accepted else []
            return [MessageDropped(source, "stray ACK")]
        if request.method == "ACK":
            return self._on_ack(request, now)
        if request.method == "CANCEL":
            return self._on_cancel(request, source, transport, now)
        txn = self.stack.start_server(request, source, transport, now)
        unsupported = [
            o for o in request.header_values("Require") if o.lower() not in SUPPORTED_EXTENSIONS
        ]
        if unsupported:
            return self._respond(txn, 420, now, (("Unsupported", ", ".join(unsupported)),))
        if not isinstance(request.uri, SipUri | TelUri):
            return self._respond(txn, 416, now)
        if request.to_addr.tag is not None:
            return self._in_dialog(request, txn, now)
        if request.method == "INVITE":
            return self._on_invite(request, txn, source, transport, now)
        if request.method == "OPTIONS":
            return self._respond(txn, 200, now, self._capabilities())
        if request.method == "BYE":
            return self._respond(txn, 481, now)
        status = 405 if request.method in KNOWN_METHODS | {"UPDATE", "INFO"} else 501
        return self._respond(txn, status, now, (("Allow", ALLOW),))

    def _capabilities(self) -> tuple[tuple[str, str], ...]:
        return (
            ("Allow", ALLOW),
            ("Accept", "application/sdp"),
            ("Supported", "timer"),
            ("Server", self.config.user_agent),
        )

    def _respond(
        self,
        txn: ServerTxn,
        status: int,
        now: float,
        headers: tuple[tuple[str, str], ...] = (),
        body: bytes = b"",
        to_tag: str | None = None,
    ) -> list[Output]:
        tag = to_tag if to_tag is not None else (self._token() if status > 100 else None)
        response = response_to(txn.request, status, tag, headers, body)
        return list(txn.respond(response, now).sends)

    def _on_invite(
        self, request: Request, txn: ServerTxn, source: Address, transport: str, now: float
    ) -> list[Output]:
        if request.call_id in self.calls:
            return self._respond(txn, 482, now)  # a merged request (RFC 3261 8.2.2.2)
        trying = self._respond(txn, 100, now)
        timer, min_se = session_timer.negotiate_uas(
            request, self.config.min_se, self.config.session_expires
        )
        if min_se is not None:
            return [*trying, *self._respond(txn, 422, now, (("Min-SE", str(min_se)),))]
        content_type = (request.header("Content-Type") or "").split(";")[0].strip().lower()
        if request.body and content_type != "application/sdp":
            accept = (("Accept", "application/sdp"),)
            return [*trying, *self._respond(txn, 415, now, accept)]
        try:
            remote = parse_sdp(request.body) if request.body else None
        except SipParseError:
            return [*trying, *self._respond(txn, 400, now)]
        dialog = Dialog.for_uas(request, self._token(), self._contact(transport))
        assert isinstance(txn, ServerInvite)
        # Requests we send in this dialog go back where the INVITE came from: trunks and
        # NATed phones expect that, and a Contact may name an address we cannot reach.
        call = Call(request.call_id, False, dialog, source, transport, request, server_invite=txn)
        call.remote_sdp = remote
        call.session_timer = timer
        call.peer_update = "UPDATE" in [a.upper() for a in request.header_values("Allow")]
        call.ring_deadline = now + self.config.ring_timeout_s
        self.calls[call.call_id] = call
        event = IncomingCall(
            call.call_id,
            str(request.from_addr.uri),
            str(request.to_addr.uri),
            remote,
            source,
            transport,
        )
        return [*trying, event]

    def _in_dialog(self, request: Request, txn: ServerTxn, now: float) -> list[Output]:
        call = self.calls.get(request.call_id)
        tags = (request.to_addr.tag, request.from_addr.tag)
        if call is None or tags != (call.dialog.local_tag, call.dialog.remote_tag):
            return self._respond(txn, 481, now)
        tag = call.dialog.local_tag
        if not call.dialog.accept_remote_seq(request):
            return self._respond(txn, 500, now, to_tag=tag)
        if request.method == "BYE":
            return [
                *self._respond(txn, 200, now, to_tag=tag),
                *self._end(call, now, "remote_hangup"),
            ]
        if request.method in ("INVITE", "UPDATE"):
            return self._refresh_or_reoffer(call, request, txn, now)
        if request.method in ("OPTIONS", "INFO"):
            return self._respond(txn, 200, now, to_tag=tag)
        status = 405 if request.method in KNOWN_METHODS else 501
        return self._respond(txn, status, now, (("Allow", ALLOW),), to_tag=tag)

    def _answer_headers(self, call: Call, request: Request) -> tuple[tuple[str, str], ...]:
        headers = [("Contact", call.dialog.local_contact), ("Allow", ALLOW)]
        headers += [("Supported", "timer"), ("Content-Type", "application/sdp")]
        if call.session_timer is not None:
            # We answer, so we are the UAS of this transaction whatever our dialog role.
            headers.append(("Session-Expires", call.session_timer.header(we_are_uac=False)))
            if session_timer.supports_timer(request):
                headers.append(("Require", "timer"))
        return tuple(headers)

    def _refresh_or_reoffer(
        self, call: Call, request: Request, txn: ServerTxn, now: float
    ) -> list[Output]:
        tag = call.dialog.local_tag
        offers = request.method == "INVITE" or bool(request.body)
        if offers and (call.reinvite_pending() or not call.confirmed):
            if call.reinvite_pending():
                return self._respond(txn, 491, now, to_tag=tag)  # glare (RFC 3261 14.2)
            return self._respond(txn, 500, now, (("Retry-After", "1"),), to_tag=tag)
        timer, min_se = session_timer.negotiate_uas(
            request, self.config.min_se, self.config.session_expires
        )
        if min_se is not None:
            return self._respond(txn, 422, now, (("Min-SE", str(min_se)),), to_tag=tag)
        call.session_timer = timer
        call.last_refresh = now
        out: list[Output] = []
        body = b""
        if request.body and call.local_sdp is not None:
            try:
                reoffer = parse_sdp(request.body)
            except SipParseError:
                return self._respond(txn, 400, now, to_tag=tag)
            local = call.local_sdp
            origin = replace(local.origin, session_version=local.origin.session_version + 1)
            media = next((m for m in local.media if m.port), None)
            address = (media.connection if media else None) or local.connection or ""
            port = media.port if media else 0
            sdp, stream = answer(reoffer, origin, address, port, call.wanted_direction)
            if stream is None:
                return self._respond(txn, 488, now, to_tag=tag)
            if replace(sdp, origin=local.origin) == local:
                sdp = local  # an unchanged answer keeps its o= version (RFC 3264 section 8)
            previous = call.remote_sdp
            call.local_sdp, call.remote_sdp = sdp, reoffer
            moved = previous is None or replace(reoffer, origin=previous.origin) != previous
            if call.settle(stream, moved):
                out.append(MediaChanged(call.call_id, stream, reoffer))
        # A re-INVITE always carries our SDP (an answer, or our offer if it had none); an
        # UPDATE only when it carried an offer.
        if call.local_sdp is not None and (request.method == "INVITE" or request.body):
            body = call.local_sdp.encode()
        headers = self._answer_headers(call, request)
        if not body:
            headers = tuple(h for h in headers if h[0] != "Content-Type")
        sent = self._respond(txn, 200, now, headers, body, to_tag=tag)
        if request.method == "INVITE" and sent:
            call.ok_destination = txn.peer
            call.offer_in_ok = not request.body and bool(body)
            self._start_ok_retransmission(call, sent[0], now)
        return [*sent, *out]

    def _on_ack(self, ack: Request, now: float) -> list[Output]:
        call = self.calls.get(ack.call_id)
        if call is None or call.ok_response is None:
            return []  # ACK for a 2xx we no longer track (or a stray): RFC says drop it
        call.stop_ok_retransmission()
        if call.confirmed:
            return self._answer_in_ack(call, ack, now)
        call.confirmed = True
        call.last_refresh = now
        if ack.body and call.remote_sdp is None:
            try:
                call.remote_sdp = parse_sdp(ack.body)
            except SipParseError:
                return [*self._bye(call, now), *self._end(call, now, "bad_sdp")]
        if call.hangup_requested:
            return [*self._bye(call, now), *self._end(call, now, "local_hangup")]
        return [CallConfirmed(call.call_id)]

    def _answer_in_ack(self, call: Call, ack: Request, now: float) -> list[Output]:
        """A re-INVITE without an offer drew ours in the 2xx; its ACK carries the answer
        (RFC 3264 section 8, RFC 3261 section 14.2): the media may have moved with it."""
        if not call.offer_in_ok:
            return []
        call.offer_in_ok = False
        if not ack.body:
            return []  # no answer: what was in force stays
        try:
            remote = parse_sdp(ack.body)
        except SipParseError:
            return [*self._bye(call, now), *self._end(call, now, "bad_sdp")]
        previous, call.remote_sdp = call.remote_sdp, remote
        moved = previous is None or replace(remote, origin=previous.origin) != previous
        stream = accepted_stream(remote)
        if stream is not None and call.settle(stream, moved):
            return [MediaChanged(call.call_id, stream, remote)]
        return []

    def _on_cancel(
        self, cancel: Request, source: Address, transport: str, now: float
    ) -> list[Output]:
        invite_txn = self.stack.invite_of_cancel(cancel)
        txn = self.stack.start_server(cancel, source, transport, now)
        # RFC 3261 section 9.1: a CANCEL repeats its INVITE's Call-ID and From; one matched
        # by branch alone would end no call and leave the INVITE's dialog half torn down
        if invite_txn is None or (invite_txn.request.call_id, invite_txn.request.from_addr.tag) != (
            cancel.call_id,
            cancel.from_addr.tag,
        ):
            return self._respond(txn, 481, now)
        call = self.calls.get(cancel.call_id)
        tag = call.dialog.local_tag if call else None
        out = self._respond(txn, 200, now, to_tag=tag)
        if invite_txn.state is State.PROCEEDING:
            out += self._respond(invite_txn, 487, now, to_tag=tag)
            if call is not None and not call.answered:
                out += self._end(call, now, "cancelled")
        return out
