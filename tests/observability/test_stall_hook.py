"""The induced deadline miss: refused without --test-hooks, a real late tick with it.

A late tick must be counted per call in the shared-memory counters (what the per-call record
reads) and in the metrics, with the call's id as the exemplar on the miss counter.
"""

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.exposition import choose_encoder

from engine.clock import TickClock, sleep_until
from engine.control import ControlServer, ask_once
from engine.control import ask as control_ask
from engine.engine import Engine, TickReport
from engine.executors import build_executor
from engine.metrics import EngineMetrics
from engine.models.echo import EchoModel
from engine.ring import RingSpec, SharedRing
from engine.slots import SlotTable
from gateway.deadline import PathTiming, deadline_record

PERIOD_NS = 80_000_000
N = 1920


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    ring = SharedRing.create(
        f"cadence-test-stall-{time.monotonic_ns()}", RingSpec(2, N, 24000, 0, 4, PERIOD_NS)
    )
    table = SlotTable(2)
    yield Engine(build_executor("eager", EchoModel(2)), ring, table, EngineMetrics(), PERIOD_NS)
    ring.close()


def ask(
    path: Path, request: dict[str, object], sock: socket.socket | None = None
) -> dict[str, object]:
    """One request; on `sock` when given (slots live as long as their connection)."""
    return ask_once(path, request) if sock is None else control_ask(sock, request)


def serve_control(path: Path, engine: Engine, hooks: bool) -> ControlServer:
    control = ControlServer(
        path, engine.table, {}, engine.status, engine, engine if hooks else None
    )
    control.start()
    return control


def run_on_time(engine: Engine, tick: int) -> TickReport:
    sleep_until(engine.clock.release_ns(tick))
    return engine.tick(tick)


def test_stall_is_refused_without_test_hooks(tmp_path: Path, engine: Engine) -> None:
    control = serve_control(tmp_path / "engine.sock", engine, hooks=False)
    try:
        reply = ask(tmp_path / "engine.sock", {"op": "stall", "seconds": 0.2})
    finally:
        control.stop()
    assert reply == {"ok": False, "reason": "test_hooks_disabled"}
    assert engine.stall_next_tick_s == 0.0


def test_stall_bounds_are_checked(tmp_path: Path, engine: Engine) -> None:
    control = serve_control(tmp_path / "engine.sock", engine, hooks=True)
    try:
        for seconds in (0, -1, 11):
            reply = ask(tmp_path / "engine.sock", {"op": "stall", "seconds": seconds})
            assert reply["reason"] == "bad_request", seconds
    finally:
        control.stop()
    assert engine.stall_next_tick_s == 0.0


def test_an_induced_stall_is_a_miss_for_every_live_call_with_its_id(
    tmp_path: Path, engine: Engine
) -> None:
    path = tmp_path / "engine.sock"
    control = serve_control(path, engine, hooks=True)
    try:
        with socket.socket(socket.AF_UNIX) as gateway:
            gateway.connect(str(path))
            opened = ask(path, {"op": "open", "call_id": "call-under-test"}, gateway)
            assert opened["ok"] is True
            engine.clock = TickClock(time.monotonic_ns(), PERIOD_NS)
            assert not run_on_time(engine, 0).missed
            assert ask(path, {"op": "stall", "seconds": 0.1}) == {"ok": True}
            assert run_on_time(engine, 1).missed
            assert not run_on_time(engine, 3).missed, "the stall is spent by the tick it delayed"
    finally:
        control.stop()
    row = engine.ring.control[int(opened["slot"])]  # type: ignore[call-overload]
    assert (int(row["ticks"]), int(row["misses"])) == (3, 1)
    encode, content_type = choose_encoder("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    text = encode(engine.metrics.registry).decode()
    (line,) = [
        x for x in text.splitlines() if x.startswith("cadence_engine_call_deadline_misses_total")
    ]
    assert line.startswith(
        'cadence_engine_call_deadline_misses_total 1.0 # {call_id="call-under-test"}'
    )


def test_the_deadline_block_adds_up_the_server_side_path() -> None:
    timing = PathTiming(tick_s=0.08, pump_lead_s=0.015)
    delays = np.array([0.04, 0.05, 0.06])
    block = deadline_record(
        {"ticks": 200, "misses": 2, "underruns": 1}, delays, 0.1, 3, 0.02, timing
    )
    assert block["miss_ratio"] == 0.01
    assert block["underrun_ratio"] == 0.005
    assert block["jitter_delay_p50_s"] == 0.05
    latency = block["server_latency_estimate"]
    assert latency == {
        "jitter_buffer_s": 0.05,
        "framing_s": 0.095,
        "engine_s": 0.08,
        "send_queue_s": 0.02,
        "total_s": 0.245,
    }
    slow = deadline_record({"ticks": 4, "skipped": 5, "misses": 6}, delays, 0.1, 0, 0.0, timing)
    assert slow["miss_ratio"] == round(6 / 9, 6), "over ticks run plus ticks skipped"
    empty = deadline_record({}, np.zeros(0), 0.1, 0, 0.0, timing)
    assert empty["miss_ratio"] is None, "no frames served yet: no ratio, not 0"
    assert empty["server_latency_estimate"]["jitter_buffer_s"] == 0.1, "the target until packets"


def test_age_is_refused_without_test_hooks_and_for_a_model_without_contexts(
    tmp_path: Path, engine: Engine
) -> None:
    for hooks, reason in ((False, "test_hooks_disabled"), (True, "bad_request")):
        path = tmp_path / f"engine-{hooks}.sock"
        control = serve_control(path, engine, hooks=hooks)
        try:
            assert ask(path, {"op": "age"})["reason"] == reason  # echo has no contexts
        finally:
            control.stop()
    assert not engine.age_next_tick
