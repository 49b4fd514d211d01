"""A hung step ends the engine (exit 70, ring unlinked); a step that finishes never does."""

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cadence.supervise import engine_status
from engine.control import ask_once
from engine.watchdog import EXIT_HUNG, StepWatchdog


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
        watchdog.step_started(7)
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
            watchdog.step_started(tick)
            time.sleep(0.03)
            watchdog.step_finished()
        time.sleep(0.3)  # idle between steps is not a hang either
    finally:
        watchdog.stop()
    assert not fired.is_set()


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        StepWatchdog(0.0, lambda: None)


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
        deadline = time.monotonic() + 30
        while (engine_status(control) or {}).get("state") != "ready":
            assert engine.poll() is None, engine.stderr.read() if engine.stderr else ""
            assert time.monotonic() < deadline, "engine not ready"
            time.sleep(0.1)
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
