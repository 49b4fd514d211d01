"""Call admission against a real control socket, slot table and rings (no transport)."""

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiortc import RTCPeerConnection

from engine.control import ControlServer, ask_once
from engine.engine import Engine
from engine.executors import build_executor
from engine.metrics import EngineMetrics
from engine.models.echo import EchoModel
from engine.ring import RingSpec, SharedRing
from engine.slots import SlotTable
from gateway.calls import RETRY_AFTER_S, CallRefused, CallRegistry
from gateway.config import GatewayConfig
from gateway.engine_client import EngineClient, SlotLease
from gateway.ice import restrict_host_candidates
from gateway.media.clock import PumpGrid
from gateway.metrics import REFUSAL_REASONS, GatewayMetrics
from gateway.phone.bridge import DialUnavailable, PhoneBridge
from gateway.phone.codec import G711Decoder
from gateway.webrtc import answer

PERIOD_NS = 80_000_000
SPEC = RingSpec(2, 1920, 24000, 0, 4, PERIOD_NS)


def _ring(tag: str) -> SharedRing:
    return SharedRing.create(f"cadence-test-calls-{tag}-{time.monotonic_ns()}", SPEC)


async def _registry(
    path: Path, ring: SharedRing, metrics: GatewayMetrics | None = None
) -> tuple[EngineClient, CallRegistry]:
    """A gateway's call registry on `ring`, connected to the engine's control socket."""
    client = EngineClient(path)
    await client.connect()
    grid = PumpGrid(time.monotonic(), PERIOD_NS / 1e9, 4, 0.015)
    registry = CallRegistry(GatewayConfig(path), client, ring, grid, metrics or GatewayMetrics())
    return client, registry


@pytest.fixture
def restarted(tmp_path: Path) -> Iterator[tuple[SharedRing, SharedRing, SlotTable, Path]]:
    """The ring of an engine that died, and a new engine (ring, table, control socket)."""
    old, new = _ring("old"), _ring("new")
    table = SlotTable(SPEC.slots)
    engine = Engine(build_executor("eager", EchoModel(2)), new, table, EngineMetrics(), PERIOD_NS)
    path = tmp_path / "engine.sock"
    control = ControlServer(path, table, {"ring": new.name}, engine.status, engine)
    control.start()
    yield old, new, table, path
    control.stop()
    new.close()
    old.close()


def test_no_call_is_admitted_into_a_ring_the_media_clock_has_not_switched_to(
    restarted: tuple[SharedRing, SharedRing, SlotTable, Path],
) -> None:
    """Between reconnecting to a restarted engine and switching rings (while the new engine
    warms up), an admitted call would pump its media into the dead engine's ring."""
    old, new, table, path = restarted

    async def scenario() -> None:
        client, calls = await _registry(path, old)
        with pytest.raises(CallRefused) as refused:
            await calls.start_sip(G711Decoder("PCMU"), 160)
        assert refused.value.reason == "unavailable"
        assert table.live_count == 0, "the new engine holds no slot for a refused call"
        calls.ring = new  # what the gateway's engine watch does once the engine is ready
        call = await calls.start_sip(G711Decoder("PCMU"), 160)
        assert table.live_count == 1
        await calls.end(call.id, "hangup")
        assert table.live_count == 0
        await client.close()

    asyncio.run(scenario())


def test_a_webrtc_call_whose_engine_restarts_during_its_answer_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer (ICE gathering) takes a while; an engine that died meanwhile ended every
    registered call, not this one. It used to be registered afterwards with the dead engine's
    lease: media into a ring no engine reads, and its end closing the same slot and
    generation in the new engine, another call's there."""
    restrict_host_candidates(["127.0.0.1"])
    path = tmp_path / "engine.sock"
    old, new = _ring("old"), _ring("new")
    controls: list[ControlServer] = []

    def start_engine(ring: SharedRing) -> SlotTable:
        table = SlotTable(SPEC.slots)
        engine = Engine(
            build_executor("eager", EchoModel(2)), ring, table, EngineMetrics(), PERIOD_NS
        )
        controls.append(ControlServer(path, table, {"ring": ring.name}, engine.status, engine))
        controls[-1].start()
        return table

    async def scenario() -> None:
        start_engine(old)
        client, calls = await _registry(path, old)
        other = EngineClient(path)

        async def answer_across_a_restart(*args: Any) -> tuple[RTCPeerConnection, str]:
            controls[0].stop()  # the engine dies; then what the gateway's engine watch does:
            await client.close()
            start_engine(new)
            await client.connect()
            calls.ring = new
            await other.connect()  # another gateway's call takes slot 0, generation 1
            assert await other.open("other") == SlotLease(0, 1, new.name)
            return await answer(*args)

        monkeypatch.setattr("gateway.calls.answer", answer_across_a_restart)
        browser = RTCPeerConnection()
        browser.addTransceiver("audio", direction="sendrecv")
        await browser.setLocalDescription(await browser.createOffer())
        try:
            with pytest.raises(CallRefused) as refused:
                await calls.start_webrtc(browser.localDescription.sdp)
        finally:
            await browser.close()
        assert refused.value.reason == "unavailable"
        assert calls.calls == {}
        status = ask_once(path, {"op": "status"})
        assert [call["call_id"] for call in status["calls"]] == ["other"], "kept its slot"
        await other.close()
        await client.close()

    try:
        asyncio.run(scenario())
    finally:
        for control in controls[1:]:
            control.stop()
        new.close()
        old.close()


def test_a_phone_call_ended_while_its_rtp_port_binds_gives_the_port_back(
    restarted: tuple[SharedRing, SharedRing, SlotTable, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registry's end ran the bridge's goodbye before the socket existed; the port
    bound after it stayed taken, its socket open, for good (and the INVITE still went out)."""
    _, new, table, path = restarted

    async def scenario() -> None:
        client, calls = await _registry(path, new)
        bridge = PhoneBridge(GatewayConfig(path, sip_port=5099, rtp_ports=(43000, 43009)), calls)
        loop = asyncio.get_running_loop()
        bind = loop.create_datagram_endpoint

        async def hung_up_while_binding(*args: Any, **kwargs: Any) -> Any:
            (call,) = calls.calls.values()
            await calls.end(call.id, "hangup")  # DELETE /v1/calls/{id}, or the engine lost
            return await bind(*args, **kwargs)

        monkeypatch.setattr(loop, "create_datagram_endpoint", hung_up_while_binding)
        free = bridge.ports.free
        with pytest.raises(DialUnavailable, match="ended while its RTP port was opened"):
            await bridge.dial("sip:bob@127.0.0.1:5999")
        assert bridge.ports.free == free
        assert (calls.calls, bridge.phones, table.live_count) == ({}, {}, 0)
        await client.close()

    asyncio.run(scenario())


def test_a_failing_transport_goodbye_still_ends_the_call_once(
    restarted: tuple[SharedRing, SharedRing, SlotTable, Path],
) -> None:
    """`end` is every way out of a call: a transport whose goodbye raises (a SIP BYE on a
    socket already gone, say) must not leave the call counted live or unlogged."""
    _, new, table, path = restarted

    async def scenario() -> None:
        metrics = GatewayMetrics()
        client, calls = await _registry(path, new, metrics)
        call = await calls.start_sip(G711Decoder("PCMU"), 160)

        async def goodbye(reason: str) -> None:
            raise OSError("the socket is gone")

        call.on_end = goodbye
        record = await calls.end(call.id, "peer_hangup")
        assert record is not None
        assert record["end_reason"] == "peer_hangup"
        assert await calls.end(call.id, "hangup") is None, "a call ends once"
        assert table.live_count == 0
        active = metrics.registry.get_sample_value(
            "cadence_gateway_calls_active", {"transport": "sip"}
        )
        ended = metrics.registry.get_sample_value(
            "cadence_gateway_calls_total", {"transport": "sip", "outcome": "completed"}
        )
        assert (active, ended) == (0.0, 1.0)
        await client.close()

    asyncio.run(scenario())


def test_a_call_whose_media_fails_is_ended_and_the_others_keep_their_pump(
    restarted: tuple[SharedRing, SharedRing, SlotTable, Path],
) -> None:
    _, new, table, path = restarted

    async def scenario() -> None:
        client, calls = await _registry(path, new)
        broken = await calls.start_sip(G711Decoder("PCMU"), 160)
        healthy = await calls.start_sip(G711Decoder("PCMU"), 160)

        def fail(now_s: float, release_s: float | None) -> None:
            raise RuntimeError("a decoder bug")

        broken.session.pump = fail  # type: ignore[method-assign]
        calls.pump(0, time.monotonic())  # index 0 completes a frame
        assert healthy.session.counters.frames_sent == 1, "the next call was still pumped"
        await asyncio.sleep(0.1)  # the failed call ends on its own task
        assert broken.id not in calls.calls
        assert calls.ended[broken.id]["end_reason"] == "media_error"
        assert table.live_count == 1
        await calls.end(healthy.id, "hangup")
        await client.close()

    asyncio.run(scenario())


def test_frames_that_miss_their_tick_are_counted_late_per_call_and_in_the_metric(
    restarted: tuple[SharedRing, SharedRing, SlotTable, Path],
) -> None:
    _, new, _, path = restarted

    async def scenario() -> None:
        metrics = GatewayMetrics()
        client, calls = await _registry(path, new, metrics)
        call = await calls.start_sip(G711Decoder("PCMU"), 160)
        grid = calls.grid

        def late() -> tuple[int, float | None]:
            sample = metrics.registry.get_sample_value(
                "cadence_gateway_late_frames_total", {"transport": "sip"}
            )
            return call.session.counters.late_frames, sample

        assert grid.release(1) is None
        release_0 = grid.release(0)
        assert release_0 is not None
        assert release_0 < time.monotonic()
        calls.pump(0, time.monotonic())  # tick 0 was released before the registry existed
        assert late() == (1, 1.0)

        upcoming = (grid.index_at(time.monotonic()) // 4 + 2) * 4  # a tick 80-160 ms away
        calls.pump(upcoming, time.monotonic())
        calls.pump(upcoming + 1, time.monotonic())  # completes no frame
        assert call.session.counters.frames_sent == 2
        assert late() == (1, 1.0), "a frame in the ring before its release is on time"

        calls.skip(upcoming + 1, upcoming + 13)  # a stall: instants +4 and +8 and +12 skipped
        assert late() == (4, 4.0)
        record = calls.record(call)
        assert record["uplink"]["late_frames"] == 4
        await calls.end(call.id, "hangup")
        await client.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("start", "stop", "frames"), [(0, 0, 0), (0, 1, 1), (1, 4, 0), (1, 5, 1), (3, 13, 3), (5, 2, 0)]
)
def test_the_grid_counts_the_frame_completing_instants_in_a_range(
    start: int, stop: int, frames: int
) -> None:
    grid = PumpGrid(100.0, 0.08, 4, 0.015)
    assert grid.frames_between(start, stop) == frames
    assert frames == sum(grid.release(i) is not None for i in range(start, stop))
    assert grid.release(8) == pytest.approx(100.0 + 2 * 0.08)


def test_a_stopping_gateway_admits_no_call(
    restarted: tuple[SharedRing, SharedRing, SlotTable, Path],
) -> None:
    _, new, table, path = restarted

    async def scenario() -> None:
        metrics = GatewayMetrics()
        client, calls = await _registry(path, new, metrics)
        calls.stopping = True
        with pytest.raises(CallRefused) as refused:
            await calls.start_sip(G711Decoder("PCMU"), 160)
        assert refused.value.reason == "draining"
        assert (calls.calls, table.live_count) == ({}, 0)
        sample = metrics.registry.get_sample_value(
            "cadence_gateway_admission_refusals_total", {"reason": "draining"}
        )
        assert sample == 1.0
        await client.close()

    asyncio.run(scenario())


def test_every_refusal_reason_has_a_retry_after() -> None:
    """HTTP and SIP 503s read one table: each reason the metrics know has its wait (the SIP
    bridge's own table once lacked "starting" and told phones 10 s where HTTP said 5)."""
    assert set(RETRY_AFTER_S) == set(REFUSAL_REASONS)
    assert RETRY_AFTER_S["starting"] == RETRY_AFTER_S["full"] == 5
