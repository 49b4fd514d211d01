"""SIP over UDP and TCP for the sans-IO `Agent`: sockets in, one timer, datagrams out.

Everything the agent decides comes back as a list of outputs: `Outgoing` bytes are sent on
the transport they name (a TCP response goes back on the connection its request came in on;
a request to a peer we have no connection to opens one), every other output is an event for
the call layer. After each input the single timer is re-armed at `agent.next_timer()`.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from gateway.sip.agent import Agent
from gateway.sip.events import Event, Output
from gateway.sip.headers import SipParseError
from gateway.sip.message import StreamFramer
from gateway.sip.transaction import Address, Outgoing

log = logging.getLogger(__name__)

READ_BYTES = 65536


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
            if self._udp is not None:
                self._udp.sendto(out.data, out.destination)
            return
        writer = self._streams.get(out.destination)
        if writer is not None and not writer.is_closing():
            writer.write(out.data)
            return
        task = asyncio.create_task(self._connect_and_send(out))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
