"""The engine's pure parts and one real tick over a real ring and control socket."""

import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.clock import TickClock, sleep_until
from engine.config import EngineConfig
from engine.control import ControlServer, ask, ask_once
from engine.engine import REHEARSAL_NS, Engine
from engine.executors import Executor, build_executor
from engine.executors.eager import EagerExecutor
from engine.frames import UplinkGather
from engine.main import run_engine
from engine.metrics import EngineMetrics
from engine.models import ModelOptions
from engine.models.base import Mask, Model, PcmBatch, StepOutput
from engine.models.echo import EchoModel
from engine.ring import DownlinkReader, EngineState, RingSpec, SharedRing, UplinkWriter
from engine.slots import AdmissionRefused, SlotTable
from gateway.deadline import ENGINE_COUNTERS, PathTiming, deadline_record

PERIOD_NS = 80_000_000
N = 1920


def test_slot_table_admits_until_full_and_ignores_stale_closes() -> None:
    table = SlotTable(2)
    a = table.open("a", owner=1)
    b = table.open("b", owner=2)
    with pytest.raises(AdmissionRefused) as refused:
        table.open("c", owner=1)
    assert refused.value.reason == "full"
    assert a.generation != b.generation
    assert not table.close(a.slot, a.generation + 100, owner=1), "a stale generation is ignored"
    assert not table.close(a.slot, a.generation, owner=2), "another connection's call is kept"
    assert table.close(a.slot, a.generation, owner=1)
    c = table.open("c", owner=1)
    assert c.slot == a.slot
    assert c.generation > b.generation, "generations never repeat"
    snap = table.snapshot()
    assert list(snap.live) == [True, True]
    assert snap.reset.sum() == 2, "both rows were opened since the last snapshot"
    assert not table.snapshot().reset.any(), "a reset is reported once"
    assert [i.call_id for i in table.close_owner(1)] == ["c"]
    table.draining = True
    with pytest.raises(AdmissionRefused, match="draining"):
        table.open("d", owner=3)


@pytest.mark.parametrize("spin_ns", [0, 1_000_000, 50_000_000])
def test_sleep_until_never_returns_before_the_instant(spin_ns: int) -> None:
    """Sleeping all the way, spinning the last 1 ms, and spinning all of it (the spin
    longer than the wait)."""
    for _ in range(5):
        instant = time.monotonic_ns() + 3_000_000
        sleep_until(instant, spin_ns)
        assert time.monotonic_ns() >= instant


def test_tick_clock_skips_ticks_that_can_no_longer_be_met() -> None:
    clock = TickClock(t0_ns=1_000, period_ns=PERIOD_NS)
    assert clock.next_tick(-1, now_ns=0) == (0, 0)
    assert clock.next_tick(4, now_ns=clock.release_ns(5) + 1) == (5, 0)
    late = clock.deadline_ns(7) + 10
    assert clock.next_tick(4, now_ns=late) == (8, 3)


def test_echo_model_delays_one_tick_and_honours_masks() -> None:
    model = EchoModel(3)
    ones = np.ones((3, N), np.float32)
    live = np.array([True, True, False])
    none = np.zeros(3, np.bool_)
    out = model.step(ones * 0.5, none, live)
    assert not out.pcm.any(), "nothing is heard before one tick has passed"
    out = model.step(ones * 0.25, np.array([False, True, False]), live)
    assert np.allclose(out.pcm[0], 0.5)
    assert not out.pcm[1].any(), "a reset row never plays the previous caller's audio"
    assert not out.pcm[2].any(), "inactive rows are silent"
    with pytest.raises(ValueError, match="pcm_in"):
        model.step(np.ones((2, N), np.float32), none, live)


def test_an_engine_refuses_a_tick_that_is_not_its_models_frame(tmp_path: Path) -> None:
    """A tick takes and gives 80 ms of audio per call: ticking every 40 ms would play it at
    double speed, padded with silence."""
    name = f"cadence-test-tick-{time.monotonic_ns()}"
    config = EngineConfig(tmp_path / "engine.sock", name, slots=1, tick_period_s=0.04)
    with pytest.raises(ValueError, match="frame, 80 ms, not 40 ms"):
        run_engine(config)
    assert not Path(f"/dev/shm/{name}").exists(), "refused before the segment was created"


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[Engine, ControlServer, Path]]:
    spec = RingSpec(4, N, 24000, 0, 4, PERIOD_NS)
    ring = SharedRing.create(f"cadence-test-engine-{time.monotonic_ns()}", spec)
    table = SlotTable(4)
    engine = Engine(build_executor("eager", EchoModel(4)), ring, table, EngineMetrics(), PERIOD_NS)
    engine.clock = TickClock(time.monotonic_ns(), PERIOD_NS)
    path = tmp_path / "engine.sock"
    control = ControlServer(path, table, {"ring": ring.name}, engine.status, engine)
    control.start()
    yield engine, control, path
    control.stop()
    ring.close()


def _open_call(
    sock: socket.socket, engine: Engine, call_id: str
) -> tuple[int, int, UplinkWriter, DownlinkReader]:
    """Open a call over the control socket: its slot, generation and both ends of its rings."""
    opened = ask(sock, {"op": "open", "call_id": call_id})
    assert opened["ok"] is True, opened
    slot, gen = int(opened["slot"]), int(opened["generation"])
    return slot, gen, UplinkWriter(engine.ring, slot, gen), DownlinkReader(engine.ring, slot, gen)


def test_a_frame_comes_back_one_tick_later_with_counters(
    rig: tuple[Engine, ControlServer, Path],
) -> None:
    engine, _, path = rig
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(path))
        slot, gen, writer, reader = _open_call(sock, engine, "x")
        frame = (np.arange(N) % 100).astype(np.int16)
        assert writer.write(frame)
        engine.tick(0)
        assert writer.write(frame * 2)
        engine.tick(1)
        got = reader.read()
        assert [f.frame for f in got] == [1, 2]
        assert not got[0].pcm.any()
        np.testing.assert_array_equal(got[1].pcm, frame)
        engine.tick(2)  # no frame written: an underrun, fed as silence
        status = ask(sock, {"op": "status"})
        calls = status["calls"]
        assert isinstance(calls, list)
        (call,) = calls
        assert call["ticks"] == 3
        assert call["underruns"] == 1
        assert call["misses"] == 0
        engine.clock = TickClock(time.monotonic_ns() - 3 * PERIOD_NS, PERIOD_NS)  # tick 3 is due
        engine.stall_next_tick_s = PERIOD_NS / 1e9
        assert engine.tick(3).missed
        status = ask(sock, {"op": "status"})
        assert status["calls"][0]["misses"] == 1
        assert ask(sock, {"op": "close", "slot": slot, "generation": gen}) == {
            "ok": True,
            "closed": True,
        }
        assert ask(sock, {"op": "frobnicate"})["reason"] == "bad_request"


class Bookkeeping(EagerExecutor):
    """An eager executor that runs the engine's `meanwhile` inside its step (as the graph
    executor does, between the ring and the sync) or never (`runs` False), recording it."""

    def __init__(self, model: Model, runs: bool) -> None:
        super().__init__(model)
        self.runs = runs
        self.events: list[str] = []

    def run(
        self,
        pcm_in: PcmBatch,
        reset: Mask,
        active: Mask,
        meanwhile: Callable[[], None] | None = None,
        ahead_of_outputs: Callable[[], None] | None = None,
    ) -> StepOutput:
        if self.runs and meanwhile is not None:
            meanwhile()
            self.events.append("meanwhile")
        self.events.append("step")
        return self.model.step(pcm_in, reset, active)


@pytest.mark.parametrize("runs", [True, False])
def test_the_host_bookkeeping_of_a_tick_runs_once_in_its_step_or_after_it(
    rig: tuple[Engine, ControlServer, Path], runs: bool
) -> None:
    """The frames' accounting and stamping (engine/frames.py) run as the executor's
    `meanwhile`, or after the step where an executor did not run it: the frames and counters
    come out the same either way."""
    engine, _, path = rig
    executor = Bookkeeping(EchoModel(4), runs)
    engine.executor = executor
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(path))
        _, _, writer, reader = _open_call(sock, engine, "x")
        frame = (np.arange(N) % 100).astype(np.int16)
        assert writer.write(frame)
        engine.tick(0)
        assert writer.write(frame * 2)
        assert writer.write(frame * 3)  # two frames in one tick: the older one is skipped
        engine.tick(1)
        engine.tick(2)  # no frame: an underrun
        got = reader.read()
        assert [f.frame for f in got] == [1, 2, 3]
        np.testing.assert_array_equal(got[1].pcm, frame)
        np.testing.assert_array_equal(got[2].pcm, frame * 3)
        (call,) = ask(sock, {"op": "status"})["calls"]
        assert (call["ticks"], call["underruns"], call["overruns"]) == (3, 1, 1)
    assert executor.events == (["meanwhile", "step"] if runs else ["step"]) * 3


class InputsSeen(EchoModel):
    """The echo model, recording each step's input buffer and what it held."""

    def __init__(self, slots: int) -> None:
        super().__init__(slots)
        self.buffers: list[PcmBatch] = []
        self.seen: list[PcmBatch] = []

    def step(self, pcm_in: PcmBatch, reset: Mask, active: Mask) -> StepOutput:
        self.buffers.append(pcm_in)
        self.seen.append(pcm_in.copy())
        return super().step(pcm_in, reset, active)


def test_the_gather_writes_the_step_input_into_the_executors_buffer(
    rig: tuple[Engine, ControlServer, Path],
) -> None:
    """Engine.tick's gather takes the uplink frames straight into the executor's input_pcm
    (the graph executor's pinned staging, which its run then copies no further), and a
    rehearsal leaves it alone."""
    ring, table = rig[0].ring, SlotTable(4)
    model = InputsSeen(4)
    executor = build_executor("eager", model)
    engine = Engine(executor, ring, table, EngineMetrics(), PERIOD_NS)
    engine.clock = TickClock(time.monotonic_ns(), PERIOD_NS)
    assert engine.uplink.pcm is executor.input_pcm()
    admission = table.open("x", 0)
    engine.opened("x", admission)
    writer = UplinkWriter(ring, admission.slot, admission.generation)
    frame = (np.arange(N) % 100 - 50).astype(np.int16)
    assert writer.write(frame)
    engine.tick(0)
    assert writer.write(frame * 2)
    engine.rehearse()  # reads the new frame into its twin only
    np.testing.assert_array_equal(executor.input_pcm()[admission.slot], frame / 32768.0)
    engine.tick(1)
    assert [buffer is executor.input_pcm() for buffer in model.buffers] == [True, True]
    np.testing.assert_array_equal(model.seen[0][admission.slot], frame / 32768.0)
    np.testing.assert_array_equal(model.seen[1][admission.slot], frame * 2 / 32768.0)
    assert not np.delete(model.seen[1], admission.slot, axis=0).any(), "other rows silent"


def test_an_uplink_buffer_of_the_wrong_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="float32"):
        UplinkGather(2, N, pcm=np.zeros((2, N), np.float64))
    with pytest.raises(ValueError, match=r"\(2, 1920\)"):
        UplinkGather(2, N, pcm=np.zeros((3, N), np.float32))


def test_the_rehearsal_ahead_of_a_steps_outputs_publishes_nothing(
    rig: tuple[Engine, ControlServer, Path],
) -> None:
    """DownlinkScatter.rehearse_publish, what the graph executor runs just before a step's
    outputs land: after a tick staged its frames, nothing reaches the ring and the next
    tick's frame numbers are unchanged."""
    engine, _, path = rig
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(path))
        _, _, writer, reader = _open_call(sock, engine, "x")
        frame = (np.arange(N) % 100).astype(np.int16)
        assert writer.write(frame)
        engine.tick(0)
        assert [f.frame for f in reader.read()] == [1]
        numbers = engine.downlink.frame.copy()
        engine.downlink.rehearse_publish()
        assert reader.read() == []
        np.testing.assert_array_equal(engine.downlink.frame, numbers)
        engine.tick(1)
        got = reader.read()
        assert [f.frame for f in got] == [2]
        np.testing.assert_array_equal(got[0].pcm, frame)


def test_rehearsals_before_ticks_consume_nothing_and_publish_nothing(
    rig: tuple[Engine, ControlServer, Path],
) -> None:
    engine, _, path = rig
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(path))
        slot, _, writer, reader = _open_call(sock, engine, "x")
        frame = (np.arange(N) % 100).astype(np.int16)
        engine.rehearse()  # the call's reset is still pending after this
        assert engine.table.snapshot(consume=False).reset[slot]
        assert writer.write(frame)
        engine.rehearse()
        engine.rehearse()
        assert reader.read() == []
        engine.tick(0)
        engine.rehearse()
        assert writer.write(frame * 2)
        engine.rehearse()
        engine.tick(1)
        got = reader.read()
        assert [f.frame for f in got] == [1, 2]
        np.testing.assert_array_equal(got[1].pcm, frame)
        (call,) = ask(sock, {"op": "status"})["calls"]
        assert (call["ticks"], call["underruns"], call["overruns"]) == (2, 0, 0)


def test_the_wait_for_a_release_rehearses_ahead_and_never_returns_early(
    rig: tuple[Engine, ControlServer, Path],
) -> None:
    engine, _, _ = rig
    engine.clock = TickClock(time.monotonic_ns() + 20_000_000, PERIOD_NS)
    rehearsals: list[int] = []  # when each rehearsal began
    took: list[int] = []  # and how long it took
    real = engine.rehearse

    def counted() -> None:
        rehearsals.append(time.monotonic_ns())
        real()
        took.append(time.monotonic_ns() - rehearsals[-1])

    engine.rehearse = counted  # type: ignore[method-assign]
    engine.rehearsal_lead_ns = 5_000_000
    engine.wait_for_release(0)
    assert time.monotonic_ns() >= engine.clock.release_ns(0)
    (rehearsed_ns,) = rehearsals
    assert rehearsed_ns >= engine.clock.release_ns(0) - 5_000_000
    # the lead follows the rehearsal's own time (twice over), never below REHEARSAL_NS
    lead = engine.rehearsal_lead_ns
    assert max(REHEARSAL_NS, 2 * took[0]) <= lead <= max(REHEARSAL_NS, 2 * took[0] + 5_000_000)
    engine.clock = TickClock(time.monotonic_ns() - PERIOD_NS + REHEARSAL_NS // 2, PERIOD_NS)
    engine.wait_for_release(1)  # half the shortest lead away: too close to rehearse
    assert time.monotonic_ns() >= engine.clock.release_ns(1)
    assert len(rehearsals) == 1


def test_one_stalled_rehearsal_does_not_stop_the_rehearsals_after_it(
    rig: tuple[Engine, ControlServer, Path],
) -> None:
    """A rehearsal stalled for 30 ms (a GC pause, a preemption) would, at twice its time,
    put the lead past what a busy tick leaves of the period; no tick would rehearse again.
    The lead is capped at an eighth of the period, and halves on each tick that cannot
    rehearse."""
    engine, _, _ = rig
    real = engine.rehearse
    rehearsals: list[int] = []

    def stalled_once() -> None:
        rehearsals.append(time.monotonic_ns())
        if len(rehearsals) == 1:
            time.sleep(0.03)
        real()

    engine.rehearse = stalled_once  # type: ignore[method-assign]
    engine.clock = TickClock(time.monotonic_ns() + 40_000_000, PERIOD_NS)
    engine.wait_for_release(0)
    assert engine.rehearsal_lead_ns == PERIOD_NS // 8, "capped, not 2 x 30 ms"
    engine.rehearsal_lead_ns = 60_000_000  # as an uncapped lead would be
    for tick in range(1, 6):  # each released 20 ms from now: a busy tick's idle time
        engine.clock = TickClock(time.monotonic_ns() + 20_000_000 - tick * PERIOD_NS, PERIOD_NS)
        engine.wait_for_release(tick)
    # 60 -> 30 -> 15 ms skipped; then rehearsed from 15 ms ahead, and on
    assert len(rehearsals) == 1 + 3


def test_ticks_skipped_while_a_call_is_live_are_in_its_miss_ratio_denominator(
    rig: tuple[Engine, ControlServer, Path],
) -> None:
    """A step that overruns by several periods makes the clock skip the ticks it can no longer
    meet: each is a miss of every live call, and a deadline the call had, though no frame was
    served. Counted as misses only, a slow engine's miss ratio read above 1."""
    engine, _, path = rig
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(path))
        opened = ask(sock, {"op": "open", "call_id": "slow"})
        slot = int(opened["slot"])
        engine.stall_next_tick_s = 0.5  # tick 0 publishes ~6 periods late: ticks 1-5 skipped
        stop = threading.Event()
        runner = threading.Thread(target=engine.run, args=(stop,))
        runner.start()
        try:
            deadline = time.monotonic() + 10
            while engine.ticks_run < 3:
                assert time.monotonic() < deadline, "the engine stopped ticking"
                time.sleep(0.005)
        finally:
            stop.set()
            runner.join()
        (call,) = ask(sock, {"op": "status"})["calls"]
    row = engine.ring.control[slot]
    counters = {key: int(row[key]) for key in ENGINE_COUNTERS}
    timing = PathTiming(tick_s=0.08, pump_lead_s=0.015)
    block = deadline_record(counters, np.zeros(0), 0.04, 0, 0.0, timing)  # the call's record
    assert 0.0 < block["miss_ratio"] <= 1.0, block
    assert counters["skipped"] >= 5, counters
    assert counters["misses"] >= 1 + counters["skipped"], "tick 0 was late and the rest skipped"
    assert counters["misses"] <= counters["ticks"] + counters["skipped"], counters
    assert block["skipped"] == call["skipped"] == counters["skipped"]
    sample = engine.metrics.registry.get_sample_value
    served = sample("cadence_engine_call_ticks_total") or 0.0
    skipped = sample("cadence_engine_call_skipped_ticks_total") or 0.0
    missed = sample("cadence_engine_call_deadline_misses_total") or 0.0
    assert skipped == counters["skipped"]
    assert 0 < missed <= served + skipped
    # engine-wide the same: ticks never run count in the denominator, the status says how many
    assert engine.ticks_skipped == counters["skipped"]
    assert sample("cadence_engine_skipped_ticks_total") == engine.ticks_skipped
    assert engine.ticks_missed <= engine.ticks_run + engine.ticks_skipped
    status = engine.status()
    assert status["misses"] <= status["ticks"] + status["skipped"]
    assert status["skipped"] == engine.ticks_skipped


class StopsDuringWarmUp:
    """An executor whose `at`-th step is when SIGTERM arrives (engine/main.py sets the event);
    it records the engine's calls in order."""

    def __init__(self, inner: Executor, stop: threading.Event, at: int) -> None:
        self.inner, self.stop, self.at, self.steps = inner, stop, at, 0
        self.calls: list[str] = []

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def model(self) -> Model:
        return self.inner.model

    @property
    def kernels_per_tick(self) -> int | None:
        return self.inner.kernels_per_tick

    def run(
        self,
        pcm_in: PcmBatch,
        reset: Mask,
        active: Mask,
        meanwhile: Callable[[], None] | None = None,
        ahead_of_outputs: Callable[[], None] | None = None,
    ) -> StepOutput:
        self.steps += 1
        self.calls.append("run")
        if self.steps == self.at:
            self.stop.set()
        return self.inner.run(pcm_in, reset, active, meanwhile, ahead_of_outputs)

    def input_pcm(self) -> PcmBatch:
        return self.inner.input_pcm()

    def rehearse(self, pcm_in: PcmBatch, reset: Mask, active: Mask) -> None:
        self.inner.rehearse(pcm_in, reset, active)

    def arm(self) -> None:
        self.calls.append("arm")

    def close(self) -> None:
        self.calls.append("close")


@pytest.mark.parametrize("at", [1, 3])
def test_a_stop_during_warm_up_ends_the_engine_without_it_ever_being_ready(
    rig: tuple[Engine, ControlServer, Path],
    at: int,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGTERM while the model warms up (its first or its last warm-up step): the engine
    stops there, never marks its ring READY nor admits a call (it used to announce ready, and
    only then stop), and says so in one line."""
    ring = rig[0].ring
    stop = threading.Event()
    executor = StopsDuringWarmUp(build_executor("eager", EchoModel(4)), stop, at)
    table = SlotTable(4, accepting=False)  # as engine/main.py builds it
    engine = Engine(executor, ring, table, EngineMetrics(), PERIOD_NS)
    states = []
    set_state = ring.set_engine_state

    def record_state(state: EngineState) -> None:
        states.append(state)
        set_state(state)

    monkeypatch.setattr(ring, "set_engine_state", record_state)
    with caplog.at_level("INFO", logger="engine.engine"):
        engine.run(stop)  # returns: a stop that the tick loop missed would tick forever
    assert executor.steps == at, "no warm-up step after the stop"
    assert EngineState.READY not in states
    assert ring.engine_state() is EngineState.STARTING
    assert not table.accepting
    assert engine.ticks_run == 0
    lines = [r.getMessage() for r in caplog.records]
    assert [line for line in lines if "warm-up" in line] == [
        "engine stopped during warm-up, before it was ready"
    ]
    assert not any("ready:" in line for line in lines), lines
    assert executor.calls == ["run"] * at  # warm-up steps are not armed ahead


def test_each_tick_arms_the_next_step_and_a_stop_closes_the_executor(
    rig: tuple[Engine, ControlServer, Path],
) -> None:
    """The engine arms its executor after every tick, once the tick's outputs are out, and
    closes it when the loop ends: a graph executor's armed step is run out, not left
    waiting on the device."""
    stop = threading.Event()
    ticks = 3
    # the stop comes in the last tick's step: that tick still arms, then the loop closes
    executor = StopsDuringWarmUp(build_executor("eager", EchoModel(4)), stop, 3 + ticks)
    engine = Engine(executor, rig[0].ring, SlotTable(4), EngineMetrics(), PERIOD_NS)
    engine.run(stop)
    assert engine.ticks_run == ticks
    # the warm-up arms once and closes (loading what arming needs) before the first tick
    warm_up = ["run"] * 3 + ["arm", "close"]
    assert executor.calls == warm_up + ["run", "arm"] * ticks + ["close"]


class FailsAtStep(StopsDuringWarmUp):
    """The `at`-th step raises, as a device fault surfaces in torch."""

    def run(
        self,
        pcm_in: PcmBatch,
        reset: Mask,
        active: Mask,
        meanwhile: Callable[[], None] | None = None,
        ahead_of_outputs: Callable[[], None] | None = None,
    ) -> StepOutput:
        if self.steps + 1 == self.at:
            self.calls.append("run")
            raise RuntimeError("device fault")
        return super().run(pcm_in, reset, active, meanwhile, ahead_of_outputs)


def test_an_error_in_the_loop_still_closes_the_executor(
    rig: tuple[Engine, ControlServer, Path],
) -> None:
    """A tick whose step raises leaves no armed step queued: the loop closes the executor on
    its way out, and the step's error is the one that surfaces."""
    executor = FailsAtStep(build_executor("eager", EchoModel(4)), threading.Event(), 3 + 2)
    engine = Engine(executor, rig[0].ring, SlotTable(4), EngineMetrics(), PERIOD_NS)
    with pytest.raises(RuntimeError, match="device fault"):
        engine.run(threading.Event())
    assert executor.calls == ["run"] * 3 + ["arm", "close"] + ["run", "arm", "run", "close"]


def _patched_engine(
    script: str, tmp_path: Path, stderr: int
) -> tuple["subprocess.Popen[str]", Path, str]:
    """`cadence engine` (2 slots) run by `script`, which patches it first; its control socket
    and ring name."""
    control = tmp_path / "engine.sock"
    ring = f"cadence-test-engine-{time.monotonic_ns()}"
    argv = ["engine", f"--control={control}", f"--ring={ring}", "--slots=2", "--metrics-port=0"]
    engine = subprocess.Popen(
        [sys.executable, "-c", script, *argv],
        cwd=Path(__file__).resolve().parents[2],
        stderr=stderr,
        text=True,
    )
    return engine, control, ring


# `cadence engine` whose model load takes 60 s: it says so on stderr first, then sleeps
SLOW_LOAD = (
    "import sys, time\n"
    "import engine.main\n"
    "from cadence.cli import main\n"
    "def slow_load(*args, **kwargs):\n"
    "    print('test: loading the model', file=sys.stderr, flush=True)\n"
    "    time.sleep(60)\n"
    "    raise AssertionError('the stop did not end the load')\n"
    "engine.main.build_model = slow_load\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_while_the_model_loads_ends_the_engine_cleanly(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """SIGTERM or Ctrl-C while the model still loads (before the engine installed its signal
    handlers it used to): SIGTERM killed it without a word, SIGINT printed a KeyboardInterrupt
    traceback and exited 1. Now, as a stop during warm-up: one line, status 0 (a normal
    stop's), no shared-memory segment and no control socket left."""
    engine, control, ring = _patched_engine(SLOW_LOAD, tmp_path, subprocess.PIPE)
    lines: list[str] = []
    loading = threading.Event()

    def read() -> None:
        assert engine.stderr is not None
        for line in engine.stderr:
            lines.append(line.rstrip("\n"))
            if "test: loading the model" in line:
                loading.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert loading.wait(30), lines
        engine.send_signal(signum)
        code = engine.wait(10)
        reader.join(5)
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()
    assert code == 0, lines
    assert not any("Traceback" in line for line in lines), lines
    said = [line.split(": ", 1)[-1] for line in lines if " engine.main: " in line]
    assert said == [
        f"engine got {signum.name}: stopping",
        "engine stopped while loading its model, before it was ready",
    ]
    assert not Path("/dev/shm", ring).exists()
    assert not control.exists()


# `cadence engine` whose last armed step takes 3 s to run out after the loop ends
SLOW_RUN_OUT = (
    "import sys, time\n"
    "import engine.engine\n"
    "from cadence.cli import main\n"
    "close = engine.engine.Engine._close_executor\n"
    "def slow_close(self):\n"
    "    time.sleep(3)\n"
    "    close(self)\n"
    "engine.engine.Engine._close_executor = slow_close\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def test_a_stopping_engine_refuses_calls_from_the_signal_on(tmp_path: Path) -> None:
    """A call opened between SIGTERM and the control socket's close (the last tick and the
    armed step running out) used to be admitted, then cut with the engine: it is refused as
    `draining`, which a gateway answers with 503 and Retry-After."""
    engine, control, ring = _patched_engine(SLOW_RUN_OUT, tmp_path, subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # ready: the socket is up and opens are accepted
            with contextlib.suppress(OSError):
                if ask_once(control, {"op": "open", "call_id": "early"})["ok"]:
                    break
            time.sleep(0.05)
        else:
            raise AssertionError("the engine never admitted a call")
        engine.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # the signal handled; the run-out lasts 3 s
        assert ask_once(control, {"op": "open", "call_id": "late"}) == {
            "ok": False,
            "reason": "draining",
        }
        assert engine.wait(10) == 0
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()
    assert not Path("/dev/shm", ring).exists()


def test_a_reused_slot_starts_its_counters_from_zero(
    rig: tuple[Engine, ControlServer, Path],
) -> None:
    engine, _, path = rig
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(path))
        slot, gen, writer, _ = _open_call(sock, engine, "first")
        for tick in range(3):
            assert writer.write(np.zeros(N, np.int16))
            engine.tick(tick)
        engine.tick(3)  # an underrun
        assert ask(sock, {"op": "close", "slot": slot, "generation": gen})["closed"] is True
        second = ask(sock, {"op": "open", "call_id": "second"})
        assert second["slot"] == slot
        counters = engine.ring.control[slot]
        fields = [
            "ticks",
            "skipped",
            "downlink_frames",
            "uplink_frames",
            "underruns",
            "misses",
            "overruns",
        ]
        # zero from the moment it is open: the gateway may read its record before a tick
        assert [int(counters[f]) for f in fields] == [0, 0, 0, 0, 0, 0, 0]
        engine.tick(4)
        assert [int(counters[f]) for f in fields] == [1, 0, 1, 0, 0, 0, 0]


def test_a_gateway_that_goes_away_frees_its_slots(
    rig: tuple[Engine, ControlServer, Path],
) -> None:
    engine, _, path = rig
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(str(path))
    for i in range(4):
        assert ask(sock, {"op": "open", "call_id": str(i)})["ok"] is True
    assert ask(sock, {"op": "open", "call_id": "5"}) == {"ok": False, "reason": "full"}
    sock.close()
    deadline = time.monotonic() + 5
    while engine.table.live_count:
        assert time.monotonic() < deadline, "slots of a closed connection were not freed"
        time.sleep(0.01)
    assert (engine.ring.control["generation"] == 0).all()


@pytest.mark.parametrize(
    "line",
    [
        b'{"op": "close", "slot": 1e400, "generation": 1}',  # OverflowError in int()
        b"[" * 20_000 + b"]" * 20_000,  # RecursionError in the JSON parser
        b'{"op": "open"}',
        b"\xff\xfe not json",
        b'"just a string"',
        # call ids go into metric exemplars (at most 128 characters) and logs
        b'{"op": "open", "call_id": "' + b"x" * 65 + b'"}',
        b'{"op": "open", "call_id": "\\ud800"}',  # a lone surrogate: no UTF-8 for a scrape
        b'{"op": "open", "call_id": "two words"}',
        b'{"op": "open", "call_id": 7}',
    ],
)
def test_a_malformed_request_is_answered_and_the_socket_keeps_admitting(
    rig: tuple[Engine, ControlServer, Path], line: bytes
) -> None:
    _, _, path = rig
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(path))
        sock.settimeout(5.0)
        sock.sendall(line + b"\n")
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = sock.recv(65536)
            assert chunk, "the control socket closed on a malformed request"
            reply += chunk
        assert json.loads(reply)["reason"] == "bad_request"
        assert ask(sock, {"op": "open", "call_id": "after"})["ok"] is True


def test_a_failed_accept_leaves_the_socket_admitting_once_descriptors_free_up(
    rig: tuple[Engine, ControlServer, Path],
) -> None:
    _, _, path = rig
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[socket.socket] = []
    waiting = socket.socket(socket.AF_UNIX)
    waiting.settimeout(5.0)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
        with contextlib.suppress(OSError):  # EMFILE: the process has no descriptor left
            while True:
                held.append(socket.socket(socket.AF_UNIX))
        waiting.connect(str(path))  # in the backlog; the engine's accept() fails with EMFILE
        time.sleep(0.3)
    finally:
        for sock in held:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    with waiting:
        assert ask(waiting, {"op": "open", "call_id": "waited"})["ok"] is True
    assert ask_once(path, {"op": "status"})["ok"] is True


def test_an_engine_that_is_not_ticking_yet_refuses_calls() -> None:
    table = SlotTable(2, accepting=False)
    with pytest.raises(AdmissionRefused) as refused:
        table.open("early", owner=1)
    assert refused.value.reason == "starting"
    table.accepting = True
    assert table.open("on time", owner=1).slot == 0


def test_a_peer_that_does_not_read_delays_only_itself(
    rig: tuple[Engine, ControlServer, Path],
) -> None:
    _, _, path = rig
    requests = 4000  # ~1 MB of status replies: far more than a Unix socket buffers
    with socket.socket(socket.AF_UNIX) as slow, socket.socket(socket.AF_UNIX) as other:
        slow.connect(str(path))
        other.connect(str(path))
        slow.sendall(b'{"op": "status"}\n' * requests)  # and read nothing yet
        time.sleep(0.3)  # the server has answered into a full socket by now
        other.settimeout(1.0)
        t0 = time.monotonic()
        assert ask(other, {"op": "open", "call_id": "prompt"})["ok"] is True
        assert time.monotonic() - t0 < 0.5
        slow.settimeout(10.0)
        data = b""
        while data.count(b"\n") < requests:
            chunk = slow.recv(1 << 20)
            assert chunk, "the slow peer was disconnected"
            data += chunk
        replies = [json.loads(line) for line in data.splitlines()]
        assert len(replies) == requests
        assert all(reply["ok"] is True for reply in replies)


def test_model_options_refuse_what_the_model_cannot_honour() -> None:
    with pytest.raises(ValueError, match="--kv-dtype fp8 is for --model moshi"):
        ModelOptions(kv_dtype="fp8").check("echo")
    with pytest.raises(ValueError, match="unknown KV dtype"):
        ModelOptions(kv_dtype="int4", random_weights=0).check("moshi")
    ModelOptions(kv_dtype="fp8", random_weights=0).check("moshi")  # accepted
    # a Moshi option without --model moshi would serve the echo model: refused, by its flags
    with pytest.raises(ValueError, match=r"^--checkpoint, --device are for --model moshi"):
        ModelOptions(checkpoint=Path("ckpt"), device="cuda").check("echo")
    with pytest.raises(ValueError, match=r"^--random-weights is for --model moshi"):
        ModelOptions(random_weights=0).check("echo")
    ModelOptions(cpu_threads=2, mimi_glue_kernels=False).check("echo")  # harmless: accepted
