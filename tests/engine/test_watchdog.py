"""A hung step ends the engine (exit 70, ring unlinked); a step that finishes never does."""

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import engine.engine as engine_module
from cadence.supervise import wait_ready
from engine.clock import TickClock
from engine.control import ask_once
from engine.engine import Engine, TickReport
from engine.executors.eager import EagerExecutor
from engine.metrics import EngineMetrics
from engine.models.base import Mask, PcmBatch, StepOutput
from engine.models.echo import EchoModel
from engine.ring import RingSpec, SharedRing
from engine.slots import SlotTable
from engine.watchdog import EXIT_HUNG, StepWatchdog

PERIOD_NS = 80_000_000


def test_fires_once_when_a_step_outlives_the_limit() -> None:
    fired: list[float] = []
    done = threading.Event()

    def on_hang() -> None:
        fired.append(time.monotonic())
        done.set()

    watchdog = StepWatchdog(0.2, on_hang)
    watchdog.start()
    try:
        started = time.monotonic()
        with watchdog.watching("tick 7"):
            assert done.wait(2.0)
        assert fired[0] - started >= 0.2
    finally:
        watchdog.stop()
    assert len(fired) == 1


def test_quiet_while_steps_finish_in_time() -> None:
    fired = threading.Event()
    watchdog = StepWatchdog(0.2, fired.set)
    watchdog.start()
    try:
        for tick in range(20):  # 20 steps of 30 ms: 0.6 s in all, none over the limit
            with watchdog.watching(f"tick {tick}"):
                time.sleep(0.03)
        time.sleep(0.3)  # idle between steps is not a hang either
    finally:
        watchdog.stop()
    assert not fired.is_set()


def test_a_watched_block_has_its_own_limit_and_name(capfd: pytest.CaptureFixture[str]) -> None:
    fired = threading.Event()
    watchdog = StepWatchdog(30.0, fired.set)
    watchdog.start()
    try:
        with watchdog.watching("warm-up step 0", limit_s=0.2):
            assert fired.wait(2.0), "the block's 0.2 s, not the step's 30 s"
    finally:
        watchdog.stop()
    assert "warm-up step 0 has been stepping for over 0.2 s" in capfd.readouterr().err


class BlockingExecutor(EagerExecutor):
    """An executor whose first step ("run": the warm-up's) or second close ("close": the one
    at the stop, after the warm-up's) waits until released: a hung GPU program."""

    name = "blocking"

    def __init__(self, model: EchoModel, blocks: str) -> None:
        super().__init__(model)
        self.blocks = blocks
        self.release = threading.Event()
        self.closes = 0

    def run(
        self,
        pcm_in: PcmBatch,
        reset: Mask,
        active: Mask,
        meanwhile: Callable[[], None] | None = None,
        ahead_of_outputs: Callable[[], None] | None = None,
    ) -> StepOutput:
        if self.blocks == "run":
            self.release.wait()
        return super().run(pcm_in, reset, active, meanwhile, ahead_of_outputs)

    def close(self) -> None:
        self.closes += 1
        if self.blocks == "close" and self.closes == 2:
            self.release.wait()


@pytest.mark.parametrize("blocks", ["run", "close"])
def test_a_hung_warm_up_step_or_armed_step_run_out_is_caught(
    monkeypatch: pytest.MonkeyPatch, blocks: str
) -> None:
    """The warm-up (under WARM_UP_LIMIT_S) and the close of the armed step are watched like
    ticks: a device that never finishes them ends the engine instead of freezing it."""
    monkeypatch.setattr(engine_module, "WARM_UP_LIMIT_S", 0.3)
    fired = threading.Event()
    watchdog = StepWatchdog(0.1, fired.set)
    watchdog.start()
    ring = SharedRing.create(
        f"cadence-test-warm-{time.monotonic_ns()}", RingSpec(2, 1920, 24000, 0, 4, PERIOD_NS)
    )
    executor = BlockingExecutor(EchoModel(2), blocks)
    engine = Engine(executor, ring, SlotTable(2), EngineMetrics(), PERIOD_NS, watchdog)
    stop = threading.Event()
    if blocks == "close":

        def one_tick(tick: int) -> TickReport:  # then the stop: the armed step is run out
            stop.set()
            return TickReport(tick, 0, 0.0, False)

        engine.tick = one_tick  # type: ignore[method-assign]
    runner = threading.Thread(target=engine.run, args=(stop,))
    try:
        started = time.monotonic()
        runner.start()
        assert fired.wait(3.0)
        waited = time.monotonic() - started
        assert executor.closes == (2 if blocks == "close" else 0)
        if blocks == "run":  # the warm-up's own limit, not the step's 0.1 s
            assert waited >= 0.3, waited
    finally:
        executor.release.set()
        stop.set()
        runner.join(5.0)
        watchdog.stop()
        ring.close()


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        StepWatchdog(0.0, lambda: None)


class FaultingExecutor(EagerExecutor):
    """An executor whose step fails at once, as a device fault surfaces in torch."""

    name = "faulting"

    def run(
        self,
        pcm_in: PcmBatch,
        reset: Mask,
        active: Mask,
        meanwhile: Callable[[], None] | None = None,
        ahead_of_outputs: Callable[[], None] | None = None,
    ) -> StepOutput:
        raise RuntimeError("device fault")

    def arm(self) -> None:
        raise AssertionError("never armed: no step ever completed")

    def close(self) -> None:
        raise AssertionError("never closed: the engine ends on the step's error")


def test_a_step_that_raises_is_over_not_hung() -> None:
    """The error ends the engine through its own exit path; the watchdog must not also fire
    (exit 70, "hung") while that path runs."""
    fired = threading.Event()
    watchdog = StepWatchdog(0.2, fired.set)
    watchdog.start()
    ring = SharedRing.create(
        f"cadence-test-fault-{time.monotonic_ns()}", RingSpec(2, 1920, 24000, 0, 4, PERIOD_NS)
    )
    try:
        engine = Engine(
            FaultingExecutor(EchoModel(2)), ring, SlotTable(2), EngineMetrics(), PERIOD_NS, watchdog
        )
        engine.clock = TickClock(time.monotonic_ns(), PERIOD_NS)
        with pytest.raises(RuntimeError, match="device fault"):
            engine.tick(0)
        time.sleep(0.5)  # over twice the limit
    finally:
        watchdog.stop()
        ring.close()
    assert not fired.is_set()


def test_hung_engine_exits_and_unlinks_its_ring(tmp_path: Path) -> None:
    control = tmp_path / "engine.sock"
    ring = f"cadence-test-hang-{time.monotonic_ns()}"
    engine = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cadence",
            "engine",
            f"--control={control}",
            f"--ring={ring}",
            "--model=echo",
            "--slots=2",
            "--metrics-port=0",
            "--test-hooks",
            "--watchdog-s=1",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_ready(engine, control, 30.0)
        assert Path(f"/dev/shm/{ring}").exists()
        assert ask_once(control, {"op": "stall", "seconds": 5})["ok"]
        stalled = time.monotonic()
        code = engine.wait(10)
        assert code == EXIT_HUNG
        assert 1.0 <= time.monotonic() - stalled < 4.0  # the limit, not the 5 s stall
        assert not Path(f"/dev/shm/{ring}").exists()
        assert engine.stderr is not None
        assert "hung" in engine.stderr.read()
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()
