"""SIP over UDP and TCP for the sans-IO `Agent`: sockets in, one timer, datagrams out.

Everything the agent decides comes back as a list of outputs: `Outgoing` bytes are sent on
the transport they name (a TCP response goes back on the connection its request came in on;
a request to a peer we have no connection to opens one), every other output is an event for
the call layer. After each input the single timer is re-armed at `agent.next_timer()`.

A destination given by name (a --sip-proxy or registrar host, a dialled sip:bob@pbx.example,
a Contact) is looked up off the event loop and kept for NAME_TTL_S: a UDP send to a name
would otherwise run getaddrinfo inside the loop, stalling every call's media for as long as
DNS takes, on every retransmission.
"""

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.sip.agent import Agent
from gateway.sip.events import Event, Output
from gateway.sip.headers import SipParseError
from gateway.sip.message import StreamFramer
from gateway.sip.transaction import Address, Outgoing

log = logging.getLogger(__name__)

READ_BYTES = 65536
NAME_TTL_S = 60.0  # a name's address is looked up again this long after


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, signalling: "SipSignalling") -> None:
        self._signalling = signalling

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        self._signalling.receive(data, (str(addr[0]), int(addr[1])), "udp")


class SipSignalling:
    def __init__(self, agent: Agent, on_event: Callable[[Event], None]) -> None:
        self.agent = agent
        self._on_event = on_event
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._streams: dict[Address, asyncio.StreamWriter] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._names: dict[str, tuple[str, float]] = {}  # name -> (address, looked up until)
        # one lookup per name at a time: the sends behind it resume, and go out, in order
        self._lookups: dict[str, asyncio.Task[str | None]] = {}

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._udp, _ = await loop.create_datagram_endpoint(
            lambda: _Datagrams(self), local_addr=(host, port)
        )
        self._tcp = await asyncio.start_server(self._serve_connection, host, port)
        log.info("SIP listening on %s:%d (UDP and TCP)", host, port)

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._udp is not None:
            self._udp.close()
        if self._tcp is not None:
            self._tcp.close()
        for writer in list(self._streams.values()):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- input -------------------------------------------------------------------------------

    def receive(self, data: bytes, source: Address, transport: str) -> None:
        self.deliver(self.agent.receive(data, source, transport, time.monotonic()))

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        host, port = writer.get_extra_info("peername")[:2]
        peer = (str(host), int(port))
        if not self.agent.config.allows(peer):
            # the agent would drop every message anyway; do not hold a socket open for it
            log.info("SIP over TCP from %s:%d refused: not in --sip-allow", *peer)
            writer.close()
            return
        await self._read_stream(peer, reader, writer)

    async def _read_stream(
        self, peer: Address, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._streams[peer] = writer
        framer = StreamFramer()
        try:
            while data := await reader.read(READ_BYTES):
                for message in framer.feed(data):
                    self.receive(message, peer, "tcp")
        except SipParseError as error:
            log.warning("SIP over TCP from %s:%d unframeable (%s): closing", *peer, error)
        except ConnectionError:
            pass
        finally:
            if self._streams.get(peer) is writer:
                del self._streams[peer]
            writer.close()

    # -- output ------------------------------------------------------------------------------

    def deliver(self, outputs: list[Output]) -> None:
        """Send what the agent wants sent, hand events on, re-arm the timer."""
        for output in outputs:
            if isinstance(output, Outgoing):
                self._send(output)
            else:
                try:
                    self._on_event(output)
                except Exception:
                    log.exception("SIP event %s failed", type(output).__name__)
        self._arm()

    def _send(self, out: Outgoing) -> None:
        if out.transport == "udp":
            host, port = out.destination
            known = host if _is_address(host) else self._known_address(host)
            if known is None or host in self._lookups:
                self._spawn(self._look_up_and_send(out))
            elif self._udp is not None:
                self._udp.sendto(out.data, (known, port))
            return
        writer = self._streams.get(out.destination)
        if writer is not None and not writer.is_closing():
            writer.write(out.data)
            return
        self._spawn(self._connect_and_send(out))  # open_connection looks names up off the loop

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _known_address(self, name: str) -> str | None:
        known = self._names.get(name)
        return known[0] if known is not None and known[1] > time.monotonic() else None

    async def _look_up_and_send(self, out: Outgoing) -> None:
        host, port = out.destination
        lookup = self._lookups.get(host)
        if lookup is None:
            lookup = self._lookups[host] = asyncio.create_task(self._look_up(host, port))
            lookup.add_done_callback(lambda _: self._lookups.pop(host, None))
        address = await lookup
        if address is not None and self._udp is not None:
            self._udp.sendto(out.data, (address, port))

    async def _look_up(self, host: str, port: int) -> str | None:
        if self._udp is None:
            return None
        family = self._udp.get_extra_info("socket").family
        try:
            found = await asyncio.get_running_loop().getaddrinfo(
                host, port, family=family, type=socket.SOCK_DGRAM
            )
        except OSError as error:  # socket.gaierror: the transaction times out, ending its call
            log.warning("SIP to %s:%d not sent: %s", host, port, error)
            return None
        address = str(found[0][4][0])
        self._names[host] = (address, time.monotonic() + NAME_TTL_S)
        return address

    async def _connect_and_send(self, out: Outgoing) -> None:
        try:
            reader, writer = await asyncio.open_connection(*out.destination)
        except OSError as error:
            log.warning("SIP over TCP to %s:%d failed: %s", *out.destination, error)
            return  # the transaction times out and ends the call
        writer.write(out.data)
        await self._read_stream(out.destination, reader, writer)

    def _arm(self) -> None:
        deadline = self.agent.next_timer()
        if self._timer is not None:
            if deadline is not None and self._timer.when() == deadline:
                return
            self._timer.cancel()
            self._timer = None
        if deadline is not None:
            self._timer = asyncio.get_running_loop().call_at(deadline, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self.deliver(self.agent.handle_timer(time.monotonic()))


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
