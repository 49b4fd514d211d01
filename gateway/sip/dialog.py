"""SIP dialogs (RFC 3261 section 12): identity, route set, CSeq spaces, in-dialog requests.

A dialog is identified by Call-ID, local tag and remote tag. The UAS side creates it from an
INVITE (the remote tag is the From tag; the local tag goes into the To of every response); the
UAC side from its own INVITE and the first response carrying a To tag. The route set comes
from Record-Route: as received on the UAS side, reversed on the UAC side. Every in-dialog
request goes to the remote target (the peer's Contact) through that route set; loose routing
(`;lr`) is assumed, as every SIP element of the last twenty years does.

    Early --1xx--> Early
    Early --2xx--> Confirmed          (UAC: 2xx received; UAS: 2xx sent)
    Confirmed --2xx--> Confirmed      (2xx retransmission, answered re-INVITE)
    Early --end--> Terminated         (failure, CANCEL, timeout)
    Confirmed --end--> Terminated     (BYE either way, session expiry, no ACK)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from gateway.sip.headers import NameAddr, Uri, Via, parse_name_addr
from gateway.sip.message import Request, Response


class DialogError(RuntimeError):
    """An event the dialog's state table does not allow."""


class DialogState(Enum):
    EARLY = "Early"
    CONFIRMED = "Confirmed"
    TERMINATED = "Terminated"


class DialogInput(Enum):
    PROVISIONAL = "1xx"
    ANSWER = "2xx"
    END = "end"


_TABLE = {
    (DialogState.EARLY, DialogInput.PROVISIONAL): DialogState.EARLY,
    (DialogState.EARLY, DialogInput.ANSWER): DialogState.CONFIRMED,
    (DialogState.EARLY, DialogInput.END): DialogState.TERMINATED,
    (DialogState.CONFIRMED, DialogInput.ANSWER): DialogState.CONFIRMED,
    (DialogState.CONFIRMED, DialogInput.END): DialogState.TERMINATED,
}


@dataclass
class Dialog:
    call_id: str
    local_tag: str
    remote_tag: str | None
    local_uri: NameAddr  # our From (UAC) or To (UAS), without tag
    remote_uri: NameAddr
    remote_target: Uri
    local_contact: str
    local_seq: int
    remote_seq: int | None = None
    route_set: tuple[str, ...] = ()
    state: DialogState = DialogState.EARLY

    def advance(self, event: DialogInput) -> DialogState:
        new = _TABLE.get((self.state, event))
        if new is None:
            raise DialogError(f"dialog {self.call_id}: {event.value} in {self.state.value}")
        self.state = new
        return new

    @classmethod
    def for_uas(cls, invite: Request, local_tag: str, local_contact: str) -> Dialog:
        contacts = invite.contacts
        return cls(
            call_id=invite.call_id,
            local_tag=local_tag,
            remote_tag=invite.from_addr.tag,
            local_uri=_untagged(invite.to_addr),
            remote_uri=_untagged(invite.from_addr),
            remote_target=contacts[0].uri if contacts else invite.from_addr.uri,
            local_contact=local_contact,
            local_seq=0,
            remote_seq=invite.cseq.seq,
            route_set=tuple(invite.header_values("Record-Route")),
        )

    @classmethod
    def for_uac(cls, invite: Request, local_contact: str) -> Dialog:
        return cls(
            call_id=invite.call_id,
            local_tag=invite.from_addr.tag or "",
            remote_tag=None,
            local_uri=_untagged(invite.from_addr),
            remote_uri=_untagged(invite.to_addr),
            remote_target=invite.uri,
            local_contact=local_contact,
            local_seq=invite.cseq.seq,
        )

    def learn_from_response(self, response: Response) -> None:
        """UAC side: a response with a To tag fixes the remote tag, target and route set."""
        self.remote_tag = response.to_addr.tag
        contacts = response.contacts
        if contacts:
            self.remote_target = contacts[0].uri
        if self.state is DialogState.EARLY:
            self.route_set = tuple(reversed(response.header_values("Record-Route")))

    def accept_remote_seq(self, request: Request) -> bool:
        """RFC 3261 12.2.2: a CSeq lower than the last one is out of order (answer 500)."""
        seq = request.cseq.seq
        if request.method in ("ACK", "CANCEL"):
            return True
        if self.remote_seq is not None and seq <= self.remote_seq:
            return False
        self.remote_seq = seq
        return True

    def request(
        self,
        method: str,
        via: Via,
        body: bytes = b"",
        headers: tuple[tuple[str, str], ...] = (),
        cseq: int | None = None,
    ) -> Request:
        """Build an in-dialog request; ACK passes the INVITE's CSeq number in `cseq`."""
        if cseq is None:
            self.local_seq += 1
            cseq = self.local_seq
        remote = (
            self.remote_uri
            if self.remote_tag is None
            else self.remote_uri.with_tag(self.remote_tag)
        )
        base: list[tuple[str, str]] = [
            ("Via", str(via)),
            ("Max-Forwards", "70"),
            ("From", str(self.local_uri.with_tag(self.local_tag))),
            ("To", str(remote)),
            ("Call-ID", self.call_id),
            ("CSeq", f"{cseq} {method}"),
        ]
        base.extend(("Route", route) for route in self.route_set)
        if method != "ACK":
            base.append(("Contact", self.local_contact))
        return Request((*base, *headers), body, method, self.remote_target)

    def next_hop(self) -> Uri:
        """Where an in-dialog request is sent: the first route, else the remote target."""
        if self.route_set:
            return parse_name_addr(self.route_set[0]).uri
        return self.remote_target


def _untagged(address: NameAddr) -> NameAddr:
    return NameAddr(
        address.uri,
        address.display_name,
        tuple(p for p in address.params if p[0].lower() != "tag"),
    )
