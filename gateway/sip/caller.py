"""The UAC half of the agent: outbound calls, registrations, and the plumbing both halves use.

`Caller` holds the agent's state (transactions, calls, registrations, config, seeded RNG) and
everything that starts from our side: dial (INVITE, retried on 401/407 answering every challenge
the call drew, see digest.Answers, and once on 422), CANCEL, the ACK for a 2xx, REGISTER (answered
the same way) with refresh before expiry. `Agent` (agent.py) adds the UAS half and the entry
points a driver calls.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field, replace

from gateway.sip import digest, session_timer
from gateway.sip.call import Call
from gateway.sip.dialog import Dialog, DialogInput, DialogState
from gateway.sip.events import (
    AgentConfig,
    CallAnswered,
    CallEnded,
    CallRinging,
    Output,
    Registered,
    RegistrationFailed,
)
from gateway.sip.headers import SipParseError, SipUri, Uri, Via, decimal, param, parse_uri
from gateway.sip.message import Request, Response, response_to
from gateway.sip.sdp import SessionDescription, parse_sdp
from gateway.sip.stack import TransactionLayer
from gateway.sip.transaction import (
    Address,
    ClientInvite,
    Outgoing,
    State,
    Transaction,
)

ALLOW = "INVITE, ACK, CANCEL, BYE, OPTIONS, UPDATE, INFO"
AUTH_HEADERS = ("authorization", "proxy-authorization")


def credentials_of(invite: Request) -> tuple[tuple[str, str], ...]:
    """The authorization headers of an INVITE, for the ACK of its 2xx (RFC 3261 13.2.2.4)."""
    return tuple((n, v) for n, v in invite.headers if n.lower() in AUTH_HEADERS)


@dataclass
class Registration:
    aor: str
    registrar: Uri
    peer: Address
    transport: str
    call_id: str
    from_tag: str
    credentials: digest.Credentials | None
    expires: int
    cseq: int = 0
    refresh_at: float | None = None
    transaction: Transaction | None = None
    auth: digest.Answers = field(default_factory=digest.Answers)


class Caller:
    def __init__(self, config: AgentConfig, rng: random.Random) -> None:
        self.config = config
        self.rng = rng
        self.stack = TransactionLayer(config.timers)
        self.calls: dict[str, Call] = {}
        self.registrations: dict[str, Registration] = {}
        # calls ended locally whose BYE, sent with credentials at hand, awaits its final
        # response: a 401/407 is answered (a new CSeq), anything else forgets the call
        self.ending: dict[str, Call] = {}

    # -- identifiers and addresses ---------------------------------------------------------

    def _token(self) -> str:
        return f"{self.rng.getrandbits(64):016x}"

    def _via(self, transport: str) -> Via:
        host, port = self.config.address
        branch = "z9hG4bK" + self._token()
        return Via(transport.upper(), host, port, (("branch", branch), ("rport", None)))

    def _contact(self, transport: str) -> str:
        host, port = self.config.address
        suffix = ";transport=tcp" if transport == "tcp" else ""
        return f"<sip:{self.config.user}@{host}:{port}{suffix}>"

    @staticmethod
    def _resolve(uri: Uri) -> Address:
        if not isinstance(uri, SipUri):
            raise SipParseError(f"cannot route to {uri}; give a proxy")
        return (uri.host.strip("[]"), uri.port or (5061 if uri.scheme == "sips" else 5060))

    def _send(self, request: Request, peer: Address, transport: str, now: float) -> list[Output]:
        return list(self.stack.start_client(request, peer, transport, now)[1])

    def _report(
        self, call: Call, reason: str, status: int | None = None, retry_after: int | None = None
    ) -> list[Output]:
        """CallEnded, once per call, however many paths lead to the end."""
        if call.reported:
            return []
        call.reported = True
        return [CallEnded(call.call_id, reason, status, retry_after)]

    def _end(
        self,
        call: Call,
        now: float,
        reason: str,
        status: int | None = None,
        retry_after: int | None = None,
    ) -> list[Output]:
        """Forget the call; its transactions finish on their own timers.

        An INVITE still unanswered gets 487 first (RFC 3261 15.1.2), or its transaction
        would wait for a final response forever.
        """
        out: list[Output] = []
        pending = call.server_invite
        if pending is not None and pending.state is State.PROCEEDING:
            terminated = response_to(call.invite, 487, call.dialog.local_tag)
            out += pending.respond(terminated, now).sends
        self.calls.pop(call.call_id, None)
        if call.dialog.state is not DialogState.TERMINATED:
            call.dialog.advance(DialogInput.END)
        return [*out, *self._report(call, reason, status, retry_after)]

    def _bye(self, call: Call, now: float) -> list[Output]:
        """Send BYE (the caller then ends the call). With credentials for the call, the BYE
        is tracked in `ending` until its final response, so a 401/407 gets an answer."""
        request = call.dialog.request("BYE", self._via(call.transport))
        transaction, sends = self.stack.start_client(request, call.peer, call.transport, now)
        if call.credentials is not None:
            call.bye, call.bye_auth = transaction, call.auth.next_request()
            self.ending[call.call_id] = call
        return list(sends)

    def _resend_in_dialog(
        self, call: Call, old: Request, answers: digest.Answers, now: float
    ) -> tuple[Transaction, list[Output]]:
        """Re-send an in-dialog request answering its challenges (RFC 3261 22.2-22.3): the
        same Call-ID, tags, body and headers, a new branch and the dialog's next CSeq."""
        assert call.credentials is not None
        call.dialog.local_seq += 1
        auth = answers.headers(call.credentials, old.method, str(old.uri))
        request = self._resent(call, old, call.dialog.local_seq, auth)
        transaction, sends = self.stack.start_client(request, call.peer, call.transport, now)
        return transaction, list(sends)

    def _resent(
        self, call: Call, old: Request, seq: int, added: tuple[tuple[str, str], ...]
    ) -> Request:
        """`old` again with a new Via (a new branch), CSeq `seq`, its authorization headers
        and those named in `added` replaced by `added`."""
        replaced = {"via", "cseq", *AUTH_HEADERS, *(n.lower() for n, _ in added)}
        headers = [(n, v) for n, v in old.headers if n.lower() not in replaced]
        headers[:0] = [("Via", str(self._via(call.transport))), ("CSeq", f"{seq} {old.method}")]
        return replace(old, headers=(*headers, *added))

    def _answer_in_dialog(
        self, call: Call, answers: digest.Answers | None, response: Response
    ) -> bool:
        """A 401/407 to an in-dialog request: True to resend it with credentials. Only a call
        dialled with credentials answers (the trunk's; never a host dialled without them)."""
        if response.status not in (401, 407) or call.credentials is None or answers is None:
            return False
        return self._challenged(answers, response) is None

    def _on_bye_response(self, call: Call, response: Response, now: float) -> list[Output]:
        """Our BYE's final response; the call already ended (CallEnded reported)."""
        if response.status < 200:
            return []
        if call.bye is not None and self._answer_in_dialog(call, call.bye_auth, response):
            assert call.bye_auth is not None
            call.bye, sends = self._resend_in_dialog(call, call.bye.request, call.bye_auth, now)
            return sends
        self.ending.pop(call.call_id, None)  # accepted, refused or failed: nothing left to do
        return []

    # -- outbound calls ------------------------------------------------------------------

    def dial(
        self,
        uri: str,
        sdp: SessionDescription,
        now: float,
        *,
        credentials: digest.Credentials | None = None,
        proxy: Address | None = None,
        transport: str = "udp",
        from_uri: str | None = None,
    ) -> tuple[str, list[Output]]:
        """Place a call; returns its Call-ID and the INVITE to send.

        `proxy` (the trunk) receives every request of the call; without it the target URI
        must name a SIP host. `from_uri` is the caller identity a trunk shows (default: our
        user at our address). A malformed URI raises SipParseError.
        """
        target = parse_uri(uri)
        host = self.config.address[0]
        caller = parse_uri(from_uri or f"sip:{self.config.user}@{host}")
        call_id = f"{self._token()}@{host}"
        headers = (
            ("Via", str(self._via(transport))),
            ("Max-Forwards", "70"),
            ("From", f"<{caller}>;tag={self._token()}"),
            ("To", f"<{target}>"),
            ("Call-ID", call_id),
            ("CSeq", "1 INVITE"),
            ("Contact", self._contact(transport)),
            ("Allow", ALLOW),
            ("Supported", "timer"),
            ("Session-Expires", str(self.config.session_expires)),
            ("Min-SE", str(self.config.min_se)),
            ("User-Agent", self.config.user_agent),
            ("Content-Type", "application/sdp"),
        )
        invite = Request(headers, sdp.encode(), "INVITE", target)
        dialog = Dialog.for_uac(invite, self._contact(transport))
        peer = proxy or self._resolve(target)
        call = Call(call_id, True, dialog, peer, transport, invite, local_sdp=sdp)
        call.credentials = credentials
        call.outbound_proxy = proxy is not None
        call.ring_deadline = now + self.config.ring_timeout_s
        self.calls[call_id] = call
        return call_id, self._start_invite(call, invite, now)

    def _start_invite(self, call: Call, invite: Request, now: float) -> list[Output]:
        transaction, sends = self.stack.start_client(invite, call.peer, call.transport, now)
        assert isinstance(transaction, ClientInvite)
        call.invite = invite
        call.client_invite = transaction
        return list(sends)

    def _retry_invite(
        self, call: Call, now: float, extra: tuple[tuple[str, str], ...] = ()
    ) -> list[Output]:
        """Re-send our INVITE with a new branch, the next CSeq, `extra` replacing headers of
        its names, and an answer to every challenge the call has drawn."""
        old = call.invite
        seq = old.cseq.seq + 1
        auth: tuple[tuple[str, str], ...] = ()
        if call.credentials is not None:
            auth = call.auth.headers(call.credentials, "INVITE", str(old.uri))
        call.dialog.local_seq = seq
        return self._start_invite(call, self._resent(call, old, seq, (*extra, *auth)), now)

    def _cancel(self, call: Call, now: float) -> list[Output]:
        invite = call.invite
        headers = [("Via", str(invite.vias[0]))]
        headers += [(n, v) for n, v in invite.headers if n in ("From", "To", "Call-ID", "Route")]
        headers += [("Max-Forwards", "70"), ("CSeq", f"{invite.cseq.seq} CANCEL")]
        cancel = Request(tuple(headers), b"", "CANCEL", invite.uri)
        call.cancelled = True
        if call.client_invite is not None:
            call.client_invite.cancelled(now)
        return self._send(cancel, call.peer, call.transport, now)

    def _on_invite_response(self, call: Call, response: Response, now: float) -> list[Output]:
        status = response.status
        out: list[Output] = []
        if status < 200:
            if response.to_addr.tag:
                call.dialog.learn_from_response(response)
            if call.hangup_requested and not call.cancelled:
                return self._cancel(call, now)
            if status in (180, 183) and not call.ringing and not call.reported:
                call.ringing = True
                out.append(CallRinging(call.call_id, status))
            return out
        if status < 300:
            call.ring_deadline = None
            return self._on_invite_success(call, response, now)
        # A resend (401/407, 422) keeps the ring deadline set at dial: the call still rings
        # for at most ring_timeout_s. One hung up (or timed out) before any 1xx let us CANCEL
        # ends here: the app was told CallEnded, and a resend would ring the phone.
        if not call.hangup_requested:
            challenged = status in (401, 407) and call.credentials is not None
            if challenged and self._challenged(call.auth, response) is None:
                return self._retry_invite(call, now)
            if status == 422:
                interval = session_timer.retry_interval(response)
                if interval > int(call.invite.header("Session-Expires") or "0"):
                    # RFC 4028 section 7.4: Min-SE too, so no element downstream goes lower
                    retry = (("Session-Expires", str(interval)), ("Min-SE", str(interval)))
                    return self._retry_invite(call, now, retry)
        call.ring_deadline = None
        after = decimal((response.header("Retry-After") or "").split(";")[0].strip(), 8)
        reason = "cancelled" if status == 487 else "rejected"
        return self._end(call, now, reason, status, after)

    def _on_invite_success(self, call: Call, response: Response, now: float) -> list[Output]:
        if call.ack is not None:
            return [Outgoing(call.ack, call.peer, call.transport)]  # our ACK was lost
        call.dialog.learn_from_response(response)
        call.dialog.advance(DialogInput.ANSWER)
        if not call.outbound_proxy:
            # Without an outbound proxy, in-dialog requests follow the route set or Contact.
            with contextlib.suppress(SipParseError):
                call.peer = self._resolve(call.dialog.next_hop())
        via = self._via(call.transport)
        ack = call.dialog.request(
            "ACK", via, headers=credentials_of(call.invite), cseq=call.invite.cseq.seq
        )
        call.ack = ack.encode()
        call.confirmed = call.answered = True
        call.last_refresh = now
        call.session_timer = session_timer.from_uac_response(response, self.config.min_se)
        call.peer_update = "UPDATE" in [a.upper() for a in response.header_values("Allow")]
        out: list[Output] = [Outgoing(call.ack, call.peer, call.transport)]
        try:
            call.remote_sdp = parse_sdp(response.body) if response.body else None
        except SipParseError:
            return [*out, *self._bye(call, now), *self._end(call, now, "bad_sdp")]
        if call.hangup_requested:
            return [*out, *self._bye(call, now), *self._end(call, now, "local_hangup")]
        return [*out, CallAnswered(call.call_id, call.remote_sdp)]

    def _challenged(self, auth: digest.Answers, response: Response) -> str | None:
        """Take a 401's or 407's challenges into `auth`: None to resend, else why not."""
        header = "WWW-Authenticate" if response.status == 401 else "Proxy-Authenticate"
        return auth.take(response.status, response.header_values(header), self._token)

    # -- registration --------------------------------------------------------------------

    def register(
        self,
        registrar: str,
        aor: str,
        now: float,
        *,
        credentials: digest.Credentials | None = None,
        expires: int = 3600,
        proxy: Address | None = None,
        transport: str = "udp",
    ) -> list[Output]:
        """Register `aor` (expires=0 removes the binding); refreshed before it lapses."""
        target = parse_uri(registrar)
        existing = self.registrations.get(aor)
        registration = existing or Registration(
            aor,
            target,
            proxy or self._resolve(target),
            transport,
            f"{self._token()}@{self.config.address[0]}",
            self._token(),
            credentials,
            expires,
        )
        registration.expires = expires
        self.registrations[aor] = registration
        return self._send_register(registration, now)

    def _send_register(self, registration: Registration, now: float) -> list[Output]:
        registration.cseq += 1
        registration.refresh_at = None
        headers = [
            ("Via", str(self._via(registration.transport))),
            ("Max-Forwards", "70"),
            ("From", f"<{registration.aor}>;tag={registration.from_tag}"),
            ("To", f"<{registration.aor}>"),
            ("Call-ID", registration.call_id),
            ("CSeq", f"{registration.cseq} REGISTER"),
            ("Contact", self._contact(registration.transport)),
            ("Expires", str(registration.expires)),
            ("User-Agent", self.config.user_agent),
        ]
        if registration.credentials is not None:
            uri = str(registration.registrar)
            headers += registration.auth.headers(registration.credentials, "REGISTER", uri)
        request = Request(tuple(headers), b"", "REGISTER", registration.registrar)
        transaction, sends = self.stack.start_client(
            request, registration.peer, registration.transport, now
        )
        registration.transaction = transaction
        return list(sends)

    def _granted_expiry(self, registration: Registration, response: Response) -> int:
        """The registrar may shorten our binding: our Contact's expires (a Contact without a
        port is on 5060), else the shortest any returned Contact has (a NAT may have rewritten
        ours: refreshing early is harmless, late loses the binding), else Expires."""
        host, port = self.config.address
        granted: list[int] = []
        for contact in response.contacts:
            uri, value = contact.uri, param(contact.params, "expires")
            seconds = decimal(value, 9) if value is not None else None
            if seconds is None:
                continue
            if isinstance(uri, SipUri) and (uri.host.lower(), uri.port or 5060) == (
                host.lower(),
                port,
            ):
                return seconds
            granted.append(seconds)
        if granted:
            return min(granted)
        seconds = decimal((response.header("Expires") or "").strip(), 9)
        return registration.expires if seconds is None else seconds

    def _on_register_response(
        self, registration: Registration, response: Response, now: float
    ) -> list[Output]:
        status = response.status
        if status < 200:
            return []
        if status < 300:
            registration.auth = digest.Answers()  # a refresh starts unchallenged
            expires = self._granted_expiry(registration, response)
            if expires == 0:
                del self.registrations[registration.aor]
            else:
                registration.refresh_at = now + max(1.0, expires - min(60.0, expires / 2))
            return [Registered(registration.aor, expires)]
        reason = None
        if status in (401, 407) and registration.credentials is not None:
            reason = self._challenged(registration.auth, response)
            if reason is None:
                return self._send_register(registration, now)
        del self.registrations[registration.aor]
        return [RegistrationFailed(registration.aor, status, reason)]
