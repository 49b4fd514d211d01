"""Transaction state machines and their timers, driven by a fake clock."""

from __future__ import annotations

import pytest

from gateway.sip.message import Request, Response, parse_message, response_to
from gateway.sip.transaction import (
    ClientInvite,
    ClientNonInvite,
    ServerInvite,
    ServerNonInvite,
    State,
    Timers,
    Transaction,
    TransactionError,
)

PEER = ("192.0.2.1", 5060)
INVITE = (
    b"INVITE sip:bob@192.0.2.1 SIP/2.0\r\n"
    b"Via: SIP/2.0/UDP 192.0.2.2:5060;branch=z9hG4bKtx1\r\n"
    b"Max-Forwards: 70\r\nFrom: <sip:alice@192.0.2.2>;tag=a1\r\nTo: <sip:bob@192.0.2.1>\r\n"
    b"Call-ID: tx@192.0.2.2\r\nCSeq: 1 INVITE\r\nRoute: <sip:proxy.example.com;lr>\r\n"
    b"Content-Length: 0\r\n\r\n"
)


def request(method: str = "INVITE") -> Request:
    data = INVITE.replace(b"INVITE", method.encode())
    message = parse_message(data)
    assert isinstance(message, Request)
    return message


def reply(status: int, method: str = "INVITE") -> Response:
    return response_to(request(method), status, "b1")


def state(transaction: Transaction) -> State:
    """Read the state through a call, so that mypy does not narrow it between inputs."""
    return transaction.state


def run_until(transaction: Transaction, end: float) -> list[float]:
    """Fire every timer up to `end`; return the times at which something was (re)sent."""
    sent: list[float] = []
    while (deadline := transaction.next_timer()) is not None and deadline <= end:
        if transaction.handle_timer(deadline).sends:
            sent.append(deadline)
    return sent


def test_client_invite_udp_retransmits_on_a_and_times_out_on_b() -> None:
    txn = ClientInvite(request(), PEER, "udp", 0.0, Timers())
    assert len(txn.start(0.0).sends) == 1
    assert run_until(txn, 31.9) == [0.5, 1.5, 3.5, 7.5, 15.5, 31.5]
    assert txn.handle_timer(32.0).timed_out
    assert txn.terminated


def test_client_invite_tcp_never_retransmits() -> None:
    txn = ClientInvite(request(), PEER, "tcp", 0.0, Timers())
    txn.start(0.0)
    assert run_until(txn, 31.9) == []
    assert txn.next_timer() == 32.0


def test_client_invite_failure_is_acked_and_absorbed_in_completed() -> None:
    txn = ClientInvite(request(), PEER, "udp", 0.0, Timers())
    txn.start(0.0)
    assert txn.receive(reply(180), 0.1).deliver is not None
    assert state(txn) is State.PROCEEDING
    assert run_until(txn, 10.0) == []  # no retransmission once a 1xx arrived
    step = txn.receive(reply(486), 10.0)
    assert step.deliver is not None
    ack = parse_message(step.sends[0].data)
    assert isinstance(ack, Request)
    assert (ack.method, ack.vias[0].branch, ack.to_addr.tag) == ("ACK", "z9hG4bKtx1", "b1")
    assert ack.header_values("Route") == ["<sip:proxy.example.com;lr>"]
    again = txn.receive(reply(486), 11.0)
    assert again.deliver is None
    assert [s.data for s in again.sends] == [step.sends[0].data]
    assert txn.next_timer() == 42.0  # timer D, 32 s over UDP
    txn.handle_timer(42.0)
    assert txn.terminated


def test_client_invite_2xx_goes_to_accepted_and_passes_retransmissions() -> None:
    txn = ClientInvite(request(), PEER, "udp", 0.0, Timers())
    txn.start(0.0)
    assert txn.receive(reply(200), 1.0).deliver is not None
    assert state(txn) is State.ACCEPTED
    assert txn.receive(reply(200), 2.0).deliver is not None
    assert txn.receive(reply(180), 2.0).deliver is None
    assert txn.next_timer() == 33.0  # timer M
    txn.handle_timer(33.0)
    assert txn.terminated


def test_client_non_invite_caps_retransmission_at_t2() -> None:
    txn = ClientNonInvite(request("OPTIONS"), PEER, "udp", 0.0, Timers())
    txn.start(0.0)
    sent = run_until(txn, 31.9)
    assert sent == [0.5, 1.5, 3.5, 7.5, 11.5, 15.5, 19.5, 23.5, 27.5, 31.5]
    assert txn.handle_timer(32.0).timed_out


def test_client_non_invite_proceeding_then_completed_then_k() -> None:
    txn = ClientNonInvite(request("BYE"), PEER, "udp", 0.0, Timers())
    txn.start(0.0)
    txn.receive(reply(100, "BYE"), 0.2)
    assert state(txn) is State.PROCEEDING
    assert run_until(txn, 9.0) == [4.2, 8.2]
    txn.receive(reply(200, "BYE"), 9.0)
    assert state(txn) is State.COMPLETED
    assert txn.receive(reply(200, "BYE"), 9.5).deliver is None
    assert txn.next_timer() == 14.0  # timer K = T4
    txn.handle_timer(14.0)
    assert txn.terminated


def test_server_invite_failure_retransmits_on_g_until_ack() -> None:
    txn = ServerInvite(request(), PEER, "udp", 0.0, Timers())
    txn.respond(reply(100), 0.0)
    assert len(txn.receive_request(0.1).sends) == 1  # the 100 again
    txn.respond(reply(503), 1.0)
    assert run_until(txn, 9.0) == [1.5, 2.5, 4.5, 8.5]
    assert len(txn.receive_request(9.0).sends) == 1
    txn.receive_ack(9.1)
    assert state(txn) is State.CONFIRMED
    assert txn.receive_request(9.2).sends == []
    assert txn.next_timer() == pytest.approx(14.1)  # timer I = T4
    txn.handle_timer(14.1)
    assert txn.terminated


def test_server_invite_h_fires_without_ack() -> None:
    txn = ServerInvite(request(), PEER, "udp", 0.0, Timers())
    txn.respond(reply(486), 0.0)
    run_until(txn, 31.9)
    assert txn.handle_timer(32.0).timed_out
    assert txn.terminated


def test_server_invite_2xx_accepted_until_l() -> None:
    txn = ServerInvite(request(), PEER, "tcp", 0.0, Timers())
    txn.respond(reply(200), 0.0)
    assert state(txn) is State.ACCEPTED
    assert txn.receive_request(1.0).sends == []  # the TU retransmits 2xx, not us
    assert txn.next_timer() == 32.0
    txn.handle_timer(32.0)
    assert txn.terminated


def test_server_non_invite_j_over_udp_and_zero_over_tcp() -> None:
    udp = ServerNonInvite(request("BYE"), PEER, "udp", 0.0, Timers())
    udp.respond(reply(200, "BYE"), 0.0)
    assert len(udp.receive_request(1.0).sends) == 1
    assert udp.next_timer() == 32.0
    tcp = ServerNonInvite(request("BYE"), PEER, "tcp", 0.0, Timers())
    tcp.respond(reply(200, "BYE"), 5.0)
    assert tcp.next_timer() == 5.0


def test_illegal_transitions_raise() -> None:
    txn = ServerNonInvite(request("BYE"), PEER, "udp", 0.0, Timers())
    txn.respond(reply(200, "BYE"), 0.0)
    with pytest.raises(TransactionError):
        txn.respond(reply(500, "BYE"), 0.1)
    invite = ServerInvite(request(), PEER, "udp", 0.0, Timers())
    with pytest.raises(TransactionError):
        invite.receive_ack(0.0)  # no final response sent yet
