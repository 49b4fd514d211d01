"""The gateway's attach to its engine: control socket first, then the engine's ring."""

import asyncio
from pathlib import Path

import pytest

from engine.control import ControlServer
from engine.slots import Admission, SlotTable
from gateway.config import GatewayConfig
from gateway.engine_client import EngineClient, EngineUnavailable
from gateway.main import attach_engine


class NoObserver:
    def opened(self, call_id: str, admission: Admission) -> None: ...

    def refused(self, call_id: str, reason: str) -> None: ...

    def closed(self, slot: int) -> None: ...


def test_a_ring_that_is_gone_is_waited_for_like_an_engine_that_is_down(tmp_path: Path) -> None:
    """An engine that answers hello and dies before its segment is mapped: attach keeps
    trying until its deadline and says the engine is unavailable, which the gateway's engine
    watch retries on (any other exception would end the watch for good)."""
    path = tmp_path / "engine.sock"
    hello = {"ring": "cadence-test-attach-no-such-ring"}
    control = ControlServer(path, SlotTable(1), hello, dict, NoObserver())
    control.start()
    try:
        client = EngineClient(path)
        with pytest.raises(EngineUnavailable, match="no shared-memory segment"):
            asyncio.run(attach_engine(GatewayConfig(path), client, wait_s=0.3))
        assert not client.connected, "the failed attempt's connection is closed"
    finally:
        control.stop()
