"""SipSignalling's sending side on real sockets."""

import asyncio
import random
import socket
import threading
from typing import Any

import pytest

from gateway.phone.signalling import SipSignalling
from gateway.sip.agent import Agent
from gateway.sip.events import AgentConfig
from gateway.sip.transaction import Outgoing


def test_a_udp_send_to_a_name_is_looked_up_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A --sip-proxy or dialled host given by name: asyncio's sendto would run getaddrinfo on
    the loop's thread, stalling every call's media for as long as DNS takes."""
    looked_up_on: list[str] = []
    getaddrinfo = socket.getaddrinfo

    def recording(*args: Any, **kwargs: Any) -> Any:
        looked_up_on.append(threading.current_thread().name)
        return getaddrinfo(*args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", recording)

    async def scenario() -> list[bytes]:
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            peer.bind(("127.0.0.1", 0))
            peer.setblocking(False)
            port = peer.getsockname()[1]
            agent = Agent(AgentConfig(address=("127.0.0.1", 5060)), random.Random(1))
            signalling = SipSignalling(agent, lambda event: None)
            await signalling.start("127.0.0.1", 0)
            try:
                sent = [b"first", b"second"]  # both before the name is known: one lookup
                signalling.deliver([Outgoing(data, ("localhost", port), "udp") for data in sent])
                got = [await asyncio.wait_for(loop.sock_recv(peer, 100), 5) for _ in sent]
                lookups = len(looked_up_on)
                signalling.deliver([Outgoing(b"third", ("localhost", port), "udp")])
                got.append(await asyncio.wait_for(loop.sock_recv(peer, 100), 5))
                assert len(looked_up_on) == lookups, "the name's address was kept"
            finally:
                await signalling.stop()
        return got

    got = asyncio.run(scenario())
    assert got == [b"first", b"second", b"third"], "in order: an ACK, then its BYE"
    assert len(looked_up_on) == 1, (
        "looked up once, by getaddrinfo (sendto would, in C, on the loop)"
    )
    assert threading.main_thread().name not in looked_up_on, "never on the event loop's thread"
