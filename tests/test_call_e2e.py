"""End to end: real `cadence serve` processes, real aiortc callers, real UDP on loopback."""

import asyncio
import json
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.control import ask_once
from gateway.ice import restrict_host_candidates
from tests.support.caller import band_limited_noise, measure_delay, place_call
from tests.support.server import (
    Served,
    children_of,
    engine_control,
    start_serve,
    stop_serve,
)

log = logging.getLogger(__name__)

MAX_SERVER_DELAY_S = 0.35  # jitter buffer + framing + one echo tick + pacing, with slack


@pytest.fixture(autouse=True)
def loopback_only() -> None:
    restrict_host_candidates(["127.0.0.1"])


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    served = start_serve(tmp_path / "serve.log", "--slots=16")
    yield served
    if served.process.poll() is None:
        stop_serve(served)


def _shm_segments(serve_pid: int) -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith(f"cadence-{serve_pid}-")}


def test_one_call_echoes_audio_with_bounded_delay(served: Served) -> None:
    signal_pcm = band_limited_noise(12.0)
    result = asyncio.run(place_call(served.url, signal_pcm, talk_s=11.0))

    peak, delay_s = measure_delay(result, signal_pcm)
    log.info("one call: correlation %.3f, server-side delay %.1f ms", peak, delay_s * 1e3)
    print(f"server-side delay {delay_s * 1e3:.1f} ms, correlation {peak:.3f}")
    assert peak > 0.6, f"returned audio does not match what was sent (peak {peak:.3f})"
    assert 0.08 < delay_s < MAX_SERVER_DELAY_S, f"server-side delay {delay_s * 1e3:.0f} ms"

    engine = result.record["engine"]
    assert isinstance(engine, dict)
    assert engine["ticks"] >= 11.0 / 0.08 * 0.9
    assert engine["misses"] == 0
    # An underrun is a tick that found no fresh frame. The gateway writes each frame 15 ms before
    # its tick and counts the frames it wrote after the release (or skipped after a stall) as
    # late; on the 2-core CI machine, shared by the engine, the gateway and this caller, an
    # event-loop hiccup that long happens (2 in 138 ticks seen once). So: late frames are rare,
    # and every underrun is one of them; underruns the gateway cannot account for would mean
    # its pump grid is out of step with the engine's. One underrun of slack: this record may be
    # read after the engine's tick and before the gateway's late write for that tick.
    uplink = result.record["uplink"]
    assert isinstance(uplink, dict)
    assert uplink["late_frames"] <= 0.05 * engine["ticks"]
    assert engine["underruns"] <= uplink["late_frames"] + 1, json.dumps(result.record)
    assert served.engine_metrics()["cadence_engine_deadline_misses_total"] == 0

    status, calls = served.get("/v1/calls")
    assert status == 200
    assert calls == {"calls": []}, "hang-up must end the call on the server"


def test_ten_calls_at_once_meet_every_deadline(served: Served) -> None:
    signal_pcm = band_limited_noise(6.0)

    async def ten() -> list[object]:
        return await asyncio.gather(*(place_call(served.url, signal_pcm, 5.0) for _ in range(10)))

    results = asyncio.run(ten())
    assert len({r.call_id for r in results}) == 10  # type: ignore[attr-defined]
    for result in results:
        peak, delay_s = measure_delay(result, signal_pcm)  # type: ignore[arg-type]
        record = result.record  # type: ignore[attr-defined]
        assert peak > 0.6, json.dumps(record)
        assert delay_s < MAX_SERVER_DELAY_S, json.dumps(record)
        engine = result.record["engine"]  # type: ignore[attr-defined]
        assert engine["misses"] == 0
        assert engine["ticks"] > 50
    metrics = served.engine_metrics()
    assert metrics["cadence_engine_deadline_misses_total"] == 0
    assert metrics["cadence_engine_call_ticks_total"] >= 10 * 50


def test_an_engine_stall_of_seconds_costs_the_call_ticks_not_the_call(tmp_path: Path) -> None:
    served = start_serve(tmp_path / "serve.log", "--test-hooks")
    try:
        control = engine_control(served)

        async def stalled_call() -> object:
            call = asyncio.create_task(place_call(served.url, band_limited_noise(7.0), 7.0))
            await asyncio.sleep(2.0)
            stall = {"op": "stall", "seconds": 2.5}  # past the 1 s the gateway calls unhealthy
            loop = asyncio.get_running_loop()
            assert await loop.run_in_executor(None, ask_once, control, stall) == {"ok": True}
            return await call

        result = asyncio.run(stalled_call())
        record = result.record  # type: ignore[attr-defined]
        assert record.get("state") == "live", json.dumps(record)  # not ended as engine_down
        assert record["engine"]["misses"] >= 2.0 / 0.08, "the stalled ticks were counted"
        # about 25 ticks ran before the stall; the rest ran after it, and went back to the caller
        assert record["engine"]["ticks"] >= 40, json.dumps(record)
        assert record["downlink"]["frames"] >= 40, json.dumps(record)
    finally:
        stop_serve(served)


def test_a_killed_engine_ends_its_calls_at_once(served: Served) -> None:
    async def killed_mid_call() -> tuple[float, dict[str, object]]:
        call = asyncio.create_task(place_call(served.url, band_limited_noise(8.0), 8.0))
        loop = asyncio.get_running_loop()
        while not (
            calls := (await loop.run_in_executor(None, served.get, "/v1/calls"))[1]["calls"]
        ):
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        engine = next(
            pid
            for pid in children_of(served.process.pid)
            if b"cadence\x00engine\x00" in Path(f"/proc/{pid}/cmdline").read_bytes()
        )
        os.kill(engine, signal.SIGKILL)
        killed = time.monotonic()
        call_id = calls[0]["id"]
        while (answer := await loop.run_in_executor(None, served.get, f"/v1/calls/{call_id}"))[
            0
        ] == 200:
            await asyncio.sleep(0.05)
        ended_after_s = time.monotonic() - killed
        await call
        return ended_after_s, answer[1]

    ended_after_s, body = asyncio.run(killed_mid_call())
    assert body["call"]["end_reason"] == "engine_down"  # type: ignore[index]
    # the engine's socket closing says it at once; the 12 s stall limit is not what ended it
    assert ended_after_s < 3.0, f"the call outlived its engine by {ended_after_s:.1f} s"


def test_serve_stops_cleanly_on_sigint(tmp_path: Path) -> None:
    served = start_serve(tmp_path / "serve.log")
    pid = served.process.pid
    children = children_of(pid)
    assert len(children) == 2, "serve runs one engine and one gateway"
    assert len(_shm_segments(pid)) == 1
    assert stop_serve(served, signal.SIGINT) == 0
    assert _shm_segments(pid) == set(), "shared memory must be unlinked"
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    assert "engine stopped; shared memory" in served.log()
