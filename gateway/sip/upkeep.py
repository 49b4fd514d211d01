"""Keeping calls alive and honest: responses to our requests and the per-call timers.

`Upkeep` sits between `Caller` (our outbound requests) and `Agent` (the inbound side). It
routes every response to the call or registration whose transaction sent the request; sends
our re-INVITEs (the `reinvite` command for hold/resume, or a session refresh when the peer
lacks UPDATE) and UPDATEs, each resent with digest credentials after a 401/407 when the
call has them (our BYE too, caller.py); retransmits our 2xx until its ACK (RFC 3261
13.3.1.4); and fires the per-call deadlines: ring timeout, missing ACK, session refresh or
expiry (RFC 4028), and transaction timeouts, each of which ends the call rather than leaving
it, and its engine slot, behind.
"""

from __future__ import annotations

from dataclasses import replace

from gateway.sip import session_timer
from gateway.sip.call import Call, CallStateError
from gateway.sip.caller import ALLOW, Caller, credentials_of
from gateway.sip.events import MediaChanged, MessageDropped, Output, RegistrationFailed
from gateway.sip.headers import SipParseError
from gateway.sip.message import Response, response_to
from gateway.sip.sdp import accepted_stream, parse_sdp
from gateway.sip.sdp import offer as make_offer
from gateway.sip.transaction import (
    Address,
    ClientInvite,
    ClientNonInvite,
    Outgoing,
    State,
    Transaction,
)

CallTxn = ClientInvite | ClientNonInvite
DIALOG_GONE = (408, 481)  # answers to an in-dialog request that mean the dialog is dead


class Upkeep(Caller):
    # -- responses -----------------------------------------------------------------------

    def _on_response(self, response: Response, source: Address, now: float) -> list[Output]:
        transaction = self.stack.match_response(response)
        if transaction is None:
            return [MessageDropped(source, "stray response")]
        step = transaction.receive(response, now)
        out: list[Output] = list(step.sends)
        if step.deliver is not None:
            out += self._deliver(transaction, step.deliver, now)
        return out

    def _deliver(self, transaction: CallTxn, response: Response, now: float) -> list[Output]:
        for registration in self.registrations.values():
            if registration.transaction is transaction:
                return self._on_register_response(registration, response, now)
        ending = self.ending.get(response.call_id)
        if ending is not None and transaction is ending.bye:
            return self._on_bye_response(ending, response, now)
        call = self.calls.get(response.call_id)
        if call is None:
            return []
        if transaction is call.client_invite:
            return self._on_invite_response(call, response, now)
        if transaction is call.reinvite:
            return self._on_reinvite_response(call, response, now)
        if transaction is call.refresh and response.status >= 200:
            return self._on_refresh_response(call, response, now)
        return []

    def _on_reinvite_response(self, call: Call, response: Response, now: float) -> list[Output]:
        if response.status < 200:
            return []
        if response.status >= 300:
            assert call.reinvite is not None
            if self._answer_in_dialog(call, call.reinvite_auth, response):
                assert call.reinvite_auth is not None
                old = call.reinvite.request
                resent, sends = self._resend_in_dialog(call, old, call.reinvite_auth, now)
                assert isinstance(resent, ClientInvite)
                resent.bounded = True
                call.reinvite, call.reinvite_ack = resent, None
                return sends
            if response.status in DIALOG_GONE:
                return [*self._bye(call, now), *self._end(call, now, "remote_gone")]
            if response.status == 491 and call.reinvite_direction is not None:
                # Both sides re-INVITEd at once; the Call-ID's owner waits longer, so the two
                # retries do not collide again.
                low, high = (2.1, 4.0) if call.uac else (0.0, 2.0)
                call.reinvite_retry_at = now + round(self.rng.uniform(low, high), 2)
            return []
        if call.reinvite_ack is not None:
            return [Outgoing(call.reinvite_ack, call.peer, call.transport)]
        assert call.reinvite is not None
        reinvite = call.reinvite.request
        via = self._via(call.transport)
        auth = credentials_of(reinvite)
        ack = call.dialog.request("ACK", via, headers=auth, cseq=reinvite.cseq.seq)
        call.reinvite_ack = ack.encode()
        out: list[Output] = [Outgoing(call.reinvite_ack, call.peer, call.transport)]
        self._take_timer(call, response, now)
        try:
            remote = parse_sdp(response.body) if response.body else None
        except SipParseError:
            return [*out, *self._bye(call, now), *self._end(call, now, "bad_sdp")]
        if remote is not None:
            call.remote_sdp = remote
            stream = accepted_stream(remote)
            if stream is not None and call.settle(stream, moved=False):
                out.append(MediaChanged(call.call_id, stream, remote))
        return out

    def _on_refresh_response(self, call: Call, response: Response, now: float) -> list[Output]:
        if call.refresh is not None and self._answer_in_dialog(call, call.refresh_auth, response):
            assert call.refresh_auth is not None
            old = call.refresh.request
            call.refresh, sends = self._resend_in_dialog(call, old, call.refresh_auth, now)
            return sends
        if response.status in DIALOG_GONE:
            return [*self._bye(call, now), *self._end(call, now, "remote_gone")]
        if response.status < 300:
            self._take_timer(call, response, now)
        return []

    def _take_timer(self, call: Call, response: Response, now: float) -> None:
        if response.header("Session-Expires") is not None:
            call.session_timer = session_timer.from_uac_response(response, self.config.min_se)
        call.last_refresh = now

    # -- requests we send inside a dialog ----------------------------------------------

    def _refresh_headers(self, call: Call) -> tuple[tuple[str, str], ...]:
        headers = [("Allow", ALLOW), ("Supported", "timer")]
        if call.session_timer is not None:
            headers.append(("Session-Expires", call.session_timer.header(we_are_uac=True)))
        return tuple(headers)

    def reinvite(self, call_id: str, direction: str, now: float) -> list[Output]:
        """Hold (sendonly/inactive) or resume (sendrecv) by re-offering our SDP."""
        call = self.calls.get(call_id)
        if call is None:
            return []
        if not call.confirmed or call.reinvite_pending() or call.local_sdp is None:
            raise CallStateError(f"call {call_id} cannot re-INVITE now")
        old = call.local_sdp
        media = old.media[0]
        origin = replace(old.origin, session_version=old.origin.session_version + 1)
        address = media.connection or old.connection or self.config.address[0]
        event = next((int(f) for f in media.formats if f not in ("0", "8") and f.isdigit()), 101)
        call.local_sdp = make_offer(origin, address, media.port, direction, event)
        call.wanted_direction = direction
        return self._send_reinvite(call, direction, now)

    def _send_reinvite(self, call: Call, direction: str | None, now: float) -> list[Output]:
        assert call.local_sdp is not None
        headers = (*self._refresh_headers(call), ("Content-Type", "application/sdp"))
        body = call.local_sdp.encode()
        request = call.dialog.request("INVITE", self._via(call.transport), body, headers)
        transaction, sends = self.stack.start_client(request, call.peer, call.transport, now)
        assert isinstance(transaction, ClientInvite)
        transaction.bounded = True  # no human answers a re-INVITE: 1xx does not stop timer B
        call.reinvite, call.reinvite_ack, call.reinvite_direction = transaction, None, direction
        call.reinvite_auth = call.auth.next_request()
        return list(sends)

    def _send_refresh(self, call: Call, now: float) -> list[Output]:
        call.last_refresh = now  # the next refresh is due half an interval after this one
        if not call.peer_update:
            if call.reinvite_pending() or call.local_sdp is None:
                return []
            return self._send_reinvite(call, None, now)
        request = call.dialog.request(
            "UPDATE", self._via(call.transport), headers=self._refresh_headers(call)
        )
        call.refresh, sends = self.stack.start_client(request, call.peer, call.transport, now)
        call.refresh_auth = call.auth.next_request()
        return list(sends)

    # -- timers --------------------------------------------------------------------------

    def _start_ok_retransmission(self, call: Call, sent: Output, now: float) -> None:
        assert isinstance(sent, Outgoing)
        timers = self.config.timers
        call.ok_response, call.ok_destination = sent.data, sent.destination
        call.ok_interval = timers.t1
        call.ok_next = now + timers.t1 if call.transport == "udp" else None
        call.ok_give_up = now + 64 * timers.t1

    def _on_transaction_timeout(self, transaction: Transaction, now: float) -> list[Output]:
        for aor, registration in list(self.registrations.items()):
            if registration.transaction is transaction:
                del self.registrations[aor]
                return [RegistrationFailed(aor, None)]
        for call_id, ending in list(self.ending.items()):
            if transaction is ending.bye:
                del self.ending[call_id]  # the call ended when the BYE was sent
                return []
        for call in list(self.calls.values()):
            if transaction is call.client_invite:
                return self._end(call, now, "timeout")
            if transaction is call.reinvite or transaction is call.refresh:
                return [*self._bye(call, now), *self._end(call, now, "timeout")]
        return []

    def _call_timers(self, call: Call, now: float) -> list[Output]:
        if call.ring_deadline is not None and call.ring_deadline <= now:
            call.ring_deadline = None
            if call.uac:
                # Nobody answered our call in time; a proxy's timer C may never fire for us.
                call.hangup_requested = True
                invite = call.client_invite
                proceeding = invite is not None and invite.state is State.PROCEEDING
                sends: list[Output] = self._cancel(call, now) if proceeding else []
                return [*sends, *self._report(call, "ring_timeout")]
            assert call.server_invite is not None
            response = response_to(call.invite, 480, call.dialog.local_tag)
            sent = call.server_invite.respond(response, now).sends
            return [*sent, *self._end(call, now, "ring_timeout")]
        if call.ok_give_up is not None and call.ok_give_up <= now:
            call.stop_ok_retransmission()
            reason = "local_hangup" if call.hangup_requested else "no_ack"
            return [*self._bye(call, now), *self._end(call, now, reason)]
        out: list[Output] = []
        if call.ok_next is not None and call.ok_next <= now and call.ok_response is not None:
            destination = call.ok_destination or call.peer
            out.append(Outgoing(call.ok_response, destination, call.transport))
            call.ok_interval = min(2 * call.ok_interval, self.config.timers.t2)
            call.ok_next = now + call.ok_interval
        retry = call.reinvite_retry_at
        if retry is not None and retry <= now:
            call.reinvite_retry_at = None
            if not call.reinvite_pending():  # offer afresh: the SDP may have moved meanwhile
                out += self.reinvite(call.call_id, call.wanted_direction, now)
        timer = call.session_timer
        if timer is not None and call.confirmed and timer.deadline(call.last_refresh) <= now:
            if timer.we_refresh:
                out += self._send_refresh(call, now)
            else:
                out += [*self._bye(call, now), *self._end(call, now, "session_expired")]
        return out
