"""A lossless (or selectively lossy) in-process network between SIP agents, with a fake clock.

Tests wire real agents together instead of mocking either side: every datagram an agent emits
is delivered to the agent listening at its destination, and `advance` moves time from one
timer deadline to the next, exactly as an asyncio driver would.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from typing import TypeVar

from gateway.sip.agent import Agent
from gateway.sip.events import AgentConfig, Event, Output
from gateway.sip.transaction import Address, Outgoing, Timers

E = TypeVar("E")


def make_agent(port: int, seed: int, **options: object) -> Agent:
    config = AgentConfig(address=("127.0.0.1", port), timers=Timers(), **options)  # type: ignore[arg-type]
    return Agent(config, random.Random(seed))


def first_line(data: bytes) -> str:
    return data.split(b"\r\n", 1)[0].decode()


class Wire:
    def __init__(self, *agents: Agent, transport: str = "udp") -> None:
        self.agents = {agent.config.address: agent for agent in agents}
        self.transport = transport
        self.now = 0.0
        self.events: dict[Address, list[Event]] = {a: [] for a in self.agents}
        self.queue: deque[tuple[Address, Outgoing]] = deque()
        self.log: list[tuple[Address, Address, str]] = []
        self.drop: Callable[[Address, Outgoing], bool] = lambda source, item: False

    def take(self, source: Agent, outputs: list[Output]) -> None:
        """Queue what `source` emitted; keep its events for the test to inspect."""
        address = source.config.address
        for item in outputs:
            if isinstance(item, Outgoing):
                self.queue.append((address, item))
            else:
                self.events[address].append(item)

    def pump(self) -> None:
        while self.queue:
            source, item = self.queue.popleft()
            self.log.append((source, item.destination, first_line(item.data)))
            target = self.agents.get(item.destination)
            if target is None or self.drop(source, item):
                continue
            self.take(target, target.receive(item.data, source, item.transport, self.now))

    def advance(self, until: float) -> None:
        """Run every timer due up to `until`, delivering what each produces."""
        self.pump()
        while True:
            deadlines = [a.next_timer() for a in self.agents.values()]
            due = min((d for d in deadlines if d is not None), default=None)
            if due is None or due > until:
                break
            self.now = max(self.now, due)
            for agent in self.agents.values():
                self.take(agent, agent.handle_timer(self.now))
            self.pump()
        self.now = until

    def sent(self, source: Agent) -> list[str]:
        return [line for s, _, line in self.log if s == source.config.address]

    def of(self, agent: Agent, kind: type[E]) -> list[E]:
        return [e for e in self.events[agent.config.address] if isinstance(e, kind)]
