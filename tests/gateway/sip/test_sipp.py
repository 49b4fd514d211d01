"""Interop with a real peer: SIPp's built-in uac and uas scenarios against the agent.

A minimal asyncio datagram loop stands in for the production driver: it feeds the agent bytes
and the loop's monotonic time, sends what the agent returns and keeps one timer. SIPp exits 0
only when every call of its scenario succeeded.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import socket
from typing import cast

import pytest

from gateway.sip.agent import Agent
from gateway.sip.events import AgentConfig, CallAnswered, CallEnded, Event, IncomingCall, Output
from gateway.sip.sdp import Origin, answer, offer
from gateway.sip.transaction import Outgoing

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("sipp") is None, reason="needs SIPp (Debian sip-tester)"),
]
HOST = "127.0.0.1"


class Loop(asyncio.DatagramProtocol):
    """One UDP socket, one agent, one timer; inbound calls are answered at once."""

    def __init__(self) -> None:
        self.agent: Agent | None = None
        self.transport: asyncio.DatagramTransport | None = None
        self.events: list[Event] = []
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # The selector loop's datagram transport does not subclass DatagramTransport.
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        assert self.agent is not None
        self.handle(self.agent.receive(data, addr, "udp", asyncio.get_running_loop().time()))

    def handle(self, outputs: list[Output]) -> None:
        assert self.agent is not None
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        for item in outputs:
            if isinstance(item, Outgoing):
                self.transport.sendto(item.data, item.destination)
                continue
            self.events.append(item)
            if isinstance(item, IncomingCall) and item.remote_sdp is not None:
                local, _ = answer(item.remote_sdp, Origin("cadence", 1, 1, HOST), HOST, 30000)
                self.handle(self.agent.ring(item.call_id, loop.time()))
                self.handle(self.agent.answer(item.call_id, local, loop.time()))
        if self.timer is not None:
            self.timer.cancel()
        deadline = self.agent.next_timer()
        self.timer = None if deadline is None else loop.call_at(deadline, self.on_timer)

    def on_timer(self) -> None:
        assert self.agent is not None
        self.timer = None
        self.handle(self.agent.handle_timer(asyncio.get_running_loop().time()))


async def start_agent() -> tuple[Loop, int]:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_datagram_endpoint(Loop, local_addr=(HOST, 0))
    port = transport.get_extra_info("sockname")[1]
    protocol.agent = Agent(AgentConfig(address=(HOST, port)), random.Random(1))
    return protocol, port


async def run_sipp(*args: str) -> int:
    process = await asyncio.create_subprocess_exec(
        "sipp", *args, "-i", HOST, "-nostdin", "-timeout", "20s", "-timeout_error",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        return await asyncio.wait_for(process.wait(), 30)
    finally:
        if process.returncode is None:  # a failed test must not leave SIPp holding its port
            process.kill()
            await process.wait()


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def test_sipp_uac_calls_the_agent() -> None:
    async def scenario() -> tuple[int, Loop]:
        protocol, port = await start_agent()
        code = await run_sipp(
            "-sn", "uac", "-m", "3", "-r", "10", "-d", "200", "-p", str(free_udp_port()),
            f"{HOST}:{port}",
        )  # fmt: skip
        await asyncio.sleep(0.1)
        return code, protocol

    code, protocol = asyncio.run(scenario())
    assert code == 0
    ended = [e for e in protocol.events if isinstance(e, CallEnded)]
    assert [e.reason for e in ended] == ["remote_hangup"] * 3
    assert protocol.agent is not None
    assert protocol.agent.live_dialogs() == 0


def test_agent_calls_sipp_uas() -> None:
    async def scenario() -> tuple[int, Loop]:
        protocol, _ = await start_agent()
        sipp_port = free_udp_port()
        sipp = asyncio.create_task(run_sipp("-sn", "uas", "-m", "1", "-p", str(sipp_port)))
        await asyncio.sleep(0.5)  # let SIPp bind; timer A retransmits the INVITE if it is late
        assert protocol.agent is not None
        loop = asyncio.get_running_loop()
        sdp = offer(Origin("cadence", 2, 1, HOST), HOST, 30002)
        call_id, out = protocol.agent.dial(f"sip:service@{HOST}:{sipp_port}", sdp, loop.time())
        protocol.handle(out)
        for _ in range(200):
            await asyncio.sleep(0.05)
            if any(isinstance(e, CallAnswered) for e in protocol.events):
                break
        protocol.handle(protocol.agent.hangup(call_id, loop.time()))
        return await sipp, protocol

    code, protocol = asyncio.run(scenario())
    assert code == 0
    assert [type(e) for e in protocol.events if not isinstance(e, IncomingCall)][-2:] == [
        CallAnswered,
        CallEnded,
    ]
