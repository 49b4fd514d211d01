"""The gateway process: attach to the engine, serve HTTP/WebRTC, pump media on the tick grid."""

import asyncio
import contextlib
import logging
import signal
import time

from aiohttp import web
from prometheus_client import disable_created_metrics

from engine.ring import EngineState, RingError, SharedRing
from gateway.app import build_app, engine_health
from gateway.calls import CallRegistry
from gateway.captions import load_captioner
from gateway.config import GatewayConfig
from gateway.engine_client import EngineClient, EngineUnavailable
from gateway.ice import restrict_host_candidates
from gateway.media.clock import PumpGrid
from gateway.metrics import GatewayMetrics
from gateway.phone.bridge import PhoneBridge
from gateway.pump import run_media_clock

log = logging.getLogger(__name__)

WATCH_PERIOD_S = 0.5
STALE_HEARTBEAT_S = 1.0  # a heartbeat older than this: the engine is not up (engine_up 0)
# ... and one older than this, though its process still answers, has it given up for lost:
# past the engine's own step watchdog (10 s by default), which ends a hung engine (its
# control socket closes, and that ends the calls at once). A shorter stall (a GC pause, a
# GPU hiccup) costs the calls missed ticks, not the calls.
ENGINE_LOST_S = 12.0
FAREWELL_S = 1.5  # HTTP stays up this long after the calls end: over one page poll (1 s)


def run_gateway(config: GatewayConfig) -> int:
    disable_created_metrics()  # type: ignore[no-untyped-call]  # _created series: clutter
    return asyncio.run(_serve(config))


async def attach_engine(
    config: GatewayConfig, client: EngineClient, wait_s: float
) -> tuple[SharedRing, PumpGrid]:
    """Connect to the engine's control socket and ring, waiting up to wait_s for it."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            hello = await client.connect()
            ring = SharedRing.attach(str(hello["ring"]))
            break
        except (EngineUnavailable, RingError) as exc:
            # RingError: the engine answered, then died before its segment could be mapped
            await client.close()
            if time.monotonic() > deadline:
                raise EngineUnavailable(str(exc)) from exc
            await asyncio.sleep(0.2)
    while ring.engine_state() is not EngineState.READY:
        if time.monotonic() > deadline:
            ring.close()
            raise EngineUnavailable("the engine did not become ready in time")
        if not client.connected:  # it died warming up: wait for the one started after it
            ring.close()
            await client.close()
            return await attach_engine(config, client, max(0.0, deadline - time.monotonic()))
        await asyncio.sleep(0.05)
    t0_ns, period_ns = ring.clock()
    grid = PumpGrid(t0_ns / 1e9, period_ns / 1e9, config.pumps_per_tick, config.pump_lead_s)
    log.info("attached to engine ring %s (%d slots)", ring.name, ring.spec.slots)
    return ring, grid


async def _watch_engine(calls: CallRegistry, clock_task: list["asyncio.Task[None]"]) -> None:
    """End every call when the engine goes away, then wait for one to come back."""
    while True:
        await asyncio.sleep(WATCH_PERIOD_S)
        try:
            await _check_engine(calls, clock_task)
        except Exception:
            # the watch is what brings the gateway back after an engine restart: it must live
            log.exception("engine watch failed; trying again")


async def _check_engine(calls: CallRegistry, clock_task: list["asyncio.Task[None]"]) -> None:
    state, age = engine_health(calls)
    alive = calls.engine.connected and state == "ready"
    calls.metrics.engine_up.set(1 if alive and age < STALE_HEARTBEAT_S else 0)
    if alive and age < ENGINE_LOST_S:
        return
    log.error("engine is down (state %s, heartbeat %.1f s old): ending calls", state, age)
    await calls.end_all("engine_down")
    await calls.engine.close()
    try:
        ring, grid = await attach_engine(calls.config, calls.engine, wait_s=3600.0)
    except EngineUnavailable:
        return
    clock_task[0].cancel()
    calls.ring.close()
    calls.ring, calls.grid = ring, grid
    clock_task[0] = asyncio.create_task(run_media_clock(calls))


async def _serve(config: GatewayConfig) -> int:
    if config.ice_addresses:
        restrict_host_candidates(config.ice_addresses)
    client = EngineClient(config.engine_control)
    ring, grid = await attach_engine(config, client, config.engine_wait_s)
    metrics = GatewayMetrics()
    metrics.engine_up.set(1)
    calls = CallRegistry(
        config, client, ring, grid, metrics, load_captioner(config.captions_tokenizer)
    )
    phone = PhoneBridge(config, calls) if config.sip_port else None
    runner = web.AppRunner(build_app(calls, phone), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    log.info("gateway listening on http://%s:%d", config.host, config.port)
    if phone is not None:
        await phone.start()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    clock_task = [asyncio.create_task(run_media_clock(calls))]
    watch = asyncio.create_task(_watch_engine(calls, clock_task))
    await stop.wait()

    log.info("gateway stopping: ending %d calls", len(calls.calls))
    calls.stopping = True  # before ending them: a call admitted now would get no goodbye
    watch.cancel()
    ending = len(calls.calls)
    await calls.end_all("gateway_stopping")
    if ending:
        # the page learns why its call ended from the record it polls every second (410
        # gateway_stopping); without this it would only see its connection fail
        await asyncio.sleep(FAREWELL_S)
    if phone is not None:
        await phone.stop()
    clock_task[0].cancel()
    for task in (watch, clock_task[0]):
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await runner.cleanup()
    await client.close()
    calls.ring.close()
    log.info("gateway stopped")
    return 0
