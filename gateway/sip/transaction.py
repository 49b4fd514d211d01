"""SIP transactions (RFC 3261 section 17, with the RFC 6026 Accepted state), sans-IO.

Each of the four machines is a table `(state, input) -> state`; a pair missing from its table
is illegal and raises `TransactionError`. Inputs from the network that RFC 3261 says to absorb
(a retransmitted INVITE in Confirmed, a late 1xx in Completed) are in the tables as self-loops,
so only a bug in the caller can raise. Effects (what is sent, what the TU sees) follow the
transition in code; timers live in `self.deadlines` and fire through `handle_timer(now)`.

Client INVITE (17.1.1)                     Client non-INVITE (17.1.2)
  Calling --1xx--> Proceeding                 Trying --1xx--> Proceeding
  Calling/Proceeding --2xx--> Accepted(M)     Trying/Proceeding --final--> Completed(K)
  Calling/Proceeding --3xx-6xx--> Completed   Trying --E--> Trying (retransmit)
      (send ACK, D)                           Proceeding --E--> Proceeding (retransmit)
  Calling --A--> Calling (retransmit)         Trying/Proceeding --F--> Terminated (timeout)
  Calling --B--> Terminated (timeout)         Completed --K--> Terminated
  Proceeding --B--> Terminated (B re-armed when we CANCEL: RFC 3261 9.1)
  Completed --3xx-6xx--> Completed (ACK again)
  Completed --D--> Terminated, Accepted --M--> Terminated

Server INVITE (17.2.1)                     Server non-INVITE (17.2.2)
  Proceeding --send 1xx--> Proceeding         Trying --send 1xx--> Proceeding
  Proceeding --send 2xx--> Accepted(L)        Trying/Proceeding --send final--> Completed(J)
  Proceeding --send 3xx-6xx--> Completed(G,H) Proceeding --request--> Proceeding (resend)
  Completed --ACK--> Confirmed(I)             Completed --request--> Completed (resend)
  Completed --G--> Completed (resend)         Completed --J--> Terminated
  Completed --H--> Terminated (timeout)
  Confirmed --I--> Terminated, Accepted --L--> Terminated

Over a reliable transport (TCP) A, E and G are never armed and D, I, J, K fire at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar

from gateway.sip.message import Request, Response

Address = tuple[str, int]


class TransactionError(RuntimeError):
    """An input that the transaction's state table does not allow in its current state."""


class State(Enum):
    CALLING = "Calling"
    TRYING = "Trying"
    PROCEEDING = "Proceeding"
    COMPLETED = "Completed"
    CONFIRMED = "Confirmed"
    ACCEPTED = "Accepted"
    TERMINATED = "Terminated"


class Input(Enum):
    PROVISIONAL = "1xx"
    SUCCESS = "2xx"
    FAILURE = "3xx-6xx"
    REQUEST = "request retransmission"
    ACK = "ACK"
    SEND_PROVISIONAL = "send 1xx"
    SEND_SUCCESS = "send 2xx"
    SEND_FAILURE = "send 3xx-6xx"
    A = "A"
    B = "B"
    D = "D"
    E = "E"
    F = "F"
    G = "G"
    H = "H"
    I = "I"  # noqa: E741 - RFC 3261 names the timer I
    J = "J"
    K = "K"
    L = "L"
    M = "M"


@dataclass(frozen=True)
class Timers:
    """RFC 3261 timer base values in seconds (table 4)."""

    t1: float = 0.5
    t2: float = 4.0
    t4: float = 5.0


@dataclass(frozen=True)
class Outgoing:
    """Bytes to send, where to, and over which transport."""

    data: bytes
    destination: Address
    transport: str


@dataclass
class Step:
    """What one input produced: datagrams to send, a response for the TU, a timeout."""

    sends: list[Outgoing] = field(default_factory=list)
    deliver: Response | None = None
    timed_out: bool = False


def classify(status: int) -> Input:
    if status < 200:
        return Input.PROVISIONAL
    return Input.SUCCESS if status < 300 else Input.FAILURE


S, I_ = State, Input


class Transaction:
    """Common machinery: the table walk, timers and the last message for retransmission."""

    TABLE: ClassVar[dict[tuple[State, Input], State]]
    INITIAL: ClassVar[State]

    def __init__(
        self, request: Request, peer: Address, transport: str, now: float, timers: Timers
    ) -> None:
        self.request = request
        self.peer = peer
        self.transport = transport
        self.reliable = transport != "udp"
        self.timers = timers
        self.state = self.INITIAL
        self.deadlines: dict[Input, float] = {}
        self.last_sent: bytes | None = None
        self.intervals: dict[Input, float] = {}
        self.created = now

    def _advance(self, event: Input) -> State:
        new = self.TABLE.get((self.state, event))
        if new is None:
            raise TransactionError(f"{type(self).__name__}: {event.value} in {self.state.value}")
        if new != self.state:
            self.deadlines.clear()  # every timer belongs to the state that armed it
        self.state = new
        return new

    def _arm(self, timer: Input, now: float, delay: float) -> None:
        self.deadlines[timer] = now + delay
        self.intervals[timer] = delay

    def _send(self, data: bytes) -> Outgoing:
        self.last_sent = data
        return Outgoing(data, self.peer, self.transport)

    def next_timer(self) -> float | None:
        return min(self.deadlines.values(), default=None)

    @property
    def terminated(self) -> bool:
        return self.state is State.TERMINATED

    def handle_timer(self, now: float) -> Step:
        step = Step()
        for timer, deadline in sorted(self.deadlines.items(), key=lambda item: item[1]):
            if deadline <= now and self.deadlines.get(timer) == deadline:
                del self.deadlines[timer]
                self._fire(timer, now, step)
        return step

    def _fire(self, timer: Input, now: float, step: Step) -> None:
        self._advance(timer)
        if timer in (Input.A, Input.E, Input.G):
            interval = self.intervals[timer] * 2
            if timer is not Input.A:
                interval = min(interval, self.timers.t2)
            if self.state is State.PROCEEDING and timer is Input.E:
                interval = self.timers.t2  # 17.1.2.2: Proceeding retransmits every T2
            self._arm(timer, now, interval)
            if self.last_sent is not None:
                step.sends.append(self._send(self.last_sent))
        elif timer in (Input.B, Input.F, Input.H):
            step.timed_out = True


class ClientInvite(Transaction):
    TABLE: ClassVar[dict[tuple[State, Input], State]] = {
        (S.CALLING, I_.A): S.CALLING,
        (S.CALLING, I_.B): S.TERMINATED,
        (S.CALLING, I_.PROVISIONAL): S.PROCEEDING,
        (S.PROCEEDING, I_.PROVISIONAL): S.PROCEEDING,
        (S.PROCEEDING, I_.B): S.TERMINATED,
        (S.CALLING, I_.SUCCESS): S.ACCEPTED,
        (S.PROCEEDING, I_.SUCCESS): S.ACCEPTED,
        (S.CALLING, I_.FAILURE): S.COMPLETED,
        (S.PROCEEDING, I_.FAILURE): S.COMPLETED,
        (S.COMPLETED, I_.FAILURE): S.COMPLETED,
        (S.COMPLETED, I_.PROVISIONAL): S.COMPLETED,
        (S.COMPLETED, I_.SUCCESS): S.COMPLETED,
        (S.COMPLETED, I_.D): S.TERMINATED,
        (S.ACCEPTED, I_.SUCCESS): S.ACCEPTED,
        (S.ACCEPTED, I_.PROVISIONAL): S.ACCEPTED,
        (S.ACCEPTED, I_.FAILURE): S.ACCEPTED,
        (S.ACCEPTED, I_.M): S.TERMINATED,
    }
    INITIAL = State.CALLING
    bounded = False  # keep timer B running in Proceeding (re-INVITEs, which no human answers)

    def start(self, now: float) -> Step:
        if not self.reliable:
            self._arm(Input.A, now, self.timers.t1)
        self._arm(Input.B, now, 64 * self.timers.t1)
        return Step(sends=[self._send(self.request.encode())])

    def receive(self, response: Response, now: float) -> Step:
        before = self.state
        event = classify(response.status)
        self._advance(event)
        step = Step()
        if before is State.COMPLETED:
            if event is Input.FAILURE and self.last_sent is not None:
                step.sends.append(self._send(self.last_sent))  # our ACK was lost
            return step
        if before is State.ACCEPTED:
            # 2xx retransmissions go to the TU, which answers each with its ACK (RFC 6026).
            step.deliver = response if event is Input.SUCCESS else None
            return step
        step.deliver = response
        if event is Input.PROVISIONAL and before is State.CALLING and self.bounded:
            self._arm(Input.B, now, 64 * self.timers.t1 - (now - self.created))
        if event is Input.SUCCESS:
            self._arm(Input.M, now, 64 * self.timers.t1)
        elif event is Input.FAILURE:
            step.sends.append(self._send(self.ack_for(response).encode()))
            self._arm(Input.D, now, 0.0 if self.reliable else 32.0)
        return step

    def cancelled(self, now: float) -> None:
        """After our CANCEL, give the INVITE 64*T1 to end before we forget it (RFC 3261 9.1)."""
        if self.state is State.PROCEEDING:
            self._arm(Input.B, now, 64 * self.timers.t1)

    def ack_for(self, response: Response) -> Request:
        """The ACK for a non-2xx final response (17.1.1.3): same branch, the response's To."""
        invite = self.request
        headers: list[tuple[str, str]] = [("Via", str(invite.vias[0]))]
        for name in ("Max-Forwards", "From", "Call-ID"):
            value = invite.header(name)
            if value is not None:
                headers.append((name, value))
        headers.append(("To", response.header("To") or ""))
        headers.append(("CSeq", f"{invite.cseq.seq} ACK"))
        headers.extend(("Route", r) for r in invite.header_values("Route"))
        return Request(tuple(headers), b"", "ACK", invite.uri)


class ClientNonInvite(Transaction):
    TABLE: ClassVar[dict[tuple[State, Input], State]] = {
        (S.TRYING, I_.E): S.TRYING,
        (S.TRYING, I_.F): S.TERMINATED,
        (S.TRYING, I_.PROVISIONAL): S.PROCEEDING,
        (S.TRYING, I_.SUCCESS): S.COMPLETED,
        (S.TRYING, I_.FAILURE): S.COMPLETED,
        (S.PROCEEDING, I_.E): S.PROCEEDING,
        (S.PROCEEDING, I_.F): S.TERMINATED,
        (S.PROCEEDING, I_.PROVISIONAL): S.PROCEEDING,
        (S.PROCEEDING, I_.SUCCESS): S.COMPLETED,
        (S.PROCEEDING, I_.FAILURE): S.COMPLETED,
        (S.COMPLETED, I_.PROVISIONAL): S.COMPLETED,
        (S.COMPLETED, I_.SUCCESS): S.COMPLETED,
        (S.COMPLETED, I_.FAILURE): S.COMPLETED,
        (S.COMPLETED, I_.K): S.TERMINATED,
    }
    INITIAL = State.TRYING

    def start(self, now: float) -> Step:
        if not self.reliable:
            self._arm(Input.E, now, self.timers.t1)
        self._arm(Input.F, now, 64 * self.timers.t1)
        return Step(sends=[self._send(self.request.encode())])

    def receive(self, response: Response, now: float) -> Step:
        before = self.state
        event = classify(response.status)
        self._advance(event)
        if before is State.COMPLETED:
            return Step()
        if event is not Input.PROVISIONAL:
            self._arm(Input.K, now, 0.0 if self.reliable else self.timers.t4)
        elif before is State.TRYING:
            if not self.reliable:
                self._arm(Input.E, now, self.timers.t2)
            self._arm(Input.F, now, 64 * self.timers.t1 - (now - self.created))
        return Step(deliver=response)


_SENDING = {  # a response class as the server transaction's input when the TU sends one
    Input.PROVISIONAL: Input.SEND_PROVISIONAL,
    Input.SUCCESS: Input.SEND_SUCCESS,
    Input.FAILURE: Input.SEND_FAILURE,
}


class ServerTransaction(Transaction):
    """Shared server logic: absorb retransmitted requests and resend the last response."""

    def receive_request(self, now: float) -> Step:
        self._advance(Input.REQUEST)
        last = self.last_sent
        if last is None or self.state in (State.ACCEPTED, State.CONFIRMED):
            return Step()
        return Step(sends=[self._send(last)])

    def respond(self, response: Response, now: float) -> Step:
        event = classify(response.status)
        self._advance(_SENDING[event])
        self._after_response(event, now)
        return Step(sends=[self._send(response.encode())])

    def _after_response(self, event: Input, now: float) -> None:
        raise NotImplementedError


class ServerInvite(ServerTransaction):
    TABLE: ClassVar[dict[tuple[State, Input], State]] = {
        (S.PROCEEDING, I_.REQUEST): S.PROCEEDING,
        (S.PROCEEDING, I_.SEND_PROVISIONAL): S.PROCEEDING,
        (S.PROCEEDING, I_.SEND_SUCCESS): S.ACCEPTED,
        (S.PROCEEDING, I_.SEND_FAILURE): S.COMPLETED,
        (S.COMPLETED, I_.REQUEST): S.COMPLETED,
        (S.COMPLETED, I_.G): S.COMPLETED,
        (S.COMPLETED, I_.H): S.TERMINATED,
        (S.COMPLETED, I_.ACK): S.CONFIRMED,
        (S.CONFIRMED, I_.REQUEST): S.CONFIRMED,
        (S.CONFIRMED, I_.ACK): S.CONFIRMED,
        (S.CONFIRMED, I_.I): S.TERMINATED,
        (S.ACCEPTED, I_.REQUEST): S.ACCEPTED,
        (S.ACCEPTED, I_.ACK): S.ACCEPTED,
        (S.ACCEPTED, I_.SEND_SUCCESS): S.ACCEPTED,
        (S.ACCEPTED, I_.L): S.TERMINATED,
    }
    INITIAL = State.PROCEEDING

    def _after_response(self, event: Input, now: float) -> None:
        if event is Input.SUCCESS and Input.L not in self.deadlines:
            self._arm(Input.L, now, 64 * self.timers.t1)
        elif event is Input.FAILURE:
            if not self.reliable:
                self._arm(Input.G, now, self.timers.t1)
            self._arm(Input.H, now, 64 * self.timers.t1)

    def receive_ack(self, now: float) -> Step:
        before = self.state
        self._advance(Input.ACK)
        if before is State.COMPLETED:
            self._arm(Input.I, now, 0.0 if self.reliable else self.timers.t4)
        return Step()


class ServerNonInvite(ServerTransaction):
    TABLE: ClassVar[dict[tuple[State, Input], State]] = {
        (S.TRYING, I_.REQUEST): S.TRYING,
        (S.TRYING, I_.SEND_PROVISIONAL): S.PROCEEDING,
        (S.TRYING, I_.SEND_SUCCESS): S.COMPLETED,
        (S.TRYING, I_.SEND_FAILURE): S.COMPLETED,
        (S.PROCEEDING, I_.REQUEST): S.PROCEEDING,
        (S.PROCEEDING, I_.SEND_PROVISIONAL): S.PROCEEDING,
        (S.PROCEEDING, I_.SEND_SUCCESS): S.COMPLETED,
        (S.PROCEEDING, I_.SEND_FAILURE): S.COMPLETED,
        (S.COMPLETED, I_.REQUEST): S.COMPLETED,
        (S.COMPLETED, I_.J): S.TERMINATED,
    }
    INITIAL = State.TRYING

    def _after_response(self, event: Input, now: float) -> None:
        if event is not Input.PROVISIONAL:
            self._arm(Input.J, now, 0.0 if self.reliable else 64 * self.timers.t1)
