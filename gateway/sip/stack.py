"""The transaction layer: match messages to live transactions, create them, run their timers.

Matching follows RFC 3261 17.1.3 (responses: top Via branch and CSeq method) and 17.2.3
(requests: branch, sent-by and method, with ACK matching its INVITE). Requests from RFC 2543
peers, whose branch lacks the magic cookie, match on Call-ID, From tag, CSeq and top Via.
Terminated transactions are removed at once, so `len()` is the number really alive.
"""

from __future__ import annotations

from gateway.sip.message import Request, Response
from gateway.sip.transaction import (
    Address,
    ClientInvite,
    ClientNonInvite,
    Outgoing,
    ServerInvite,
    ServerNonInvite,
    Step,
    Timers,
)

MAGIC_COOKIE = "z9hG4bK"
ClientTransaction = ClientInvite | ClientNonInvite
ServerTransaction = ServerInvite | ServerNonInvite
Transaction = ClientTransaction | ServerTransaction
ServerKey = tuple[str, ...]


def server_key(request: Request, method: str | None = None) -> ServerKey:
    via = request.vias[0]
    method = method or ("INVITE" if request.method == "ACK" else request.method)
    branch = via.branch or ""
    if branch.startswith(MAGIC_COOKIE):
        return (branch, via.host.lower(), str(via.port or 5060), method)
    from_tag = request.from_addr.tag or ""
    return ("rfc2543", request.call_id, from_tag, str(request.cseq.seq), str(via), method)


class TransactionLayer:
    def __init__(self, timers: Timers) -> None:
        self.timers = timers
        self.clients: dict[tuple[str, str], ClientTransaction] = {}
        self.servers: dict[ServerKey, ServerTransaction] = {}

    def __len__(self) -> int:
        return len(self.clients) + len(self.servers)

    def start_client(
        self, request: Request, peer: Address, transport: str, now: float
    ) -> tuple[ClientTransaction, list[Outgoing]]:
        kind = ClientInvite if request.method == "INVITE" else ClientNonInvite
        transaction = kind(request, peer, transport, now, self.timers)
        branch = request.vias[0].branch or ""
        self.clients[(branch, request.method)] = transaction
        return transaction, transaction.start(now).sends

    def match_response(self, response: Response) -> ClientTransaction | None:
        branch = response.vias[0].branch or ""
        return self.clients.get((branch, response.cseq.method))

    def match_request(self, request: Request) -> ServerTransaction | None:
        return self.servers.get(server_key(request))

    def invite_of_cancel(self, cancel: Request) -> ServerInvite | None:
        found = self.servers.get(server_key(cancel, "INVITE"))
        return found if isinstance(found, ServerInvite) else None

    def start_server(
        self, request: Request, source: Address, transport: str, now: float
    ) -> ServerTransaction:
        kind = ServerInvite if request.method == "INVITE" else ServerNonInvite
        transaction = kind(request, source, transport, now, self.timers)
        self.servers[server_key(request)] = transaction
        return transaction

    def next_timer(self) -> float | None:
        deadlines = [t.next_timer() for t in (*self.clients.values(), *self.servers.values())]
        return min((d for d in deadlines if d is not None), default=None)

    def handle_timer(self, now: float) -> list[tuple[Transaction, Step]]:
        fired: list[tuple[Transaction, Step]] = []
        for transaction in (*self.clients.values(), *self.servers.values()):
            deadline = transaction.next_timer()
            if deadline is not None and deadline <= now:
                fired.append((transaction, transaction.handle_timer(now)))
        self.reap()
        return fired

    def reap(self) -> None:
        self.clients = {k: t for k, t in self.clients.items() if not t.terminated}
        self.servers = {k: t for k, t in self.servers.items() if not t.terminated}
