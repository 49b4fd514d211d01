"""The supervisor: clean-up of a dead engine's shared memory, stopping before and after ready."""

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from multiprocessing import shared_memory

import pytest

from cadence import supervise
from cadence.supervise import Supervisor
from engine.ring import unlink_segment

Segment = shared_memory.SharedMemory


class RacedSegment(Segment):
    """A segment that someone else (the dead engine's resource tracker) unlinks first."""

    def unlink(self) -> None:
        Segment.unlink(self)  # the other process wins the race
        Segment.unlink(self)  # ours then finds nothing


def test_a_segment_removed_meanwhile_is_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"cadence-test-race-{time.monotonic_ns()}"
    owner = Segment(name=name, create=True, size=64)
    owner.close()
    monkeypatch.setattr(shared_memory, "SharedMemory", RacedSegment)  # what unlink_segment opens
    unlink_segment(name)  # raised FileNotFoundError and ended `serve` before
    with pytest.raises(FileNotFoundError):
        Segment(name=name)


def test_a_segment_already_gone_is_not_an_error() -> None:
    unlink_segment(f"cadence-test-absent-{time.monotonic_ns()}")


@pytest.mark.parametrize("ready", [False, True])
def test_ctrl_c_stops_serve_with_one_status_before_and_after_the_engine_is_ready(
    ready: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Ctrl-C while the engine still warms up is a stop like any other: serve says so in one
    line and exits 0, as after ready (it exited 1, silently), without starting the gateway."""
    spawned: list[str] = []

    def spawn(
        supervisor: Supervisor, role: str, args: list[str], secrets: dict[str, str] | None = None
    ) -> "subprocess.Popen[bytes]":
        spawned.append(role)
        if role == ("gateway" if ready else "engine"):  # serve's handlers are installed by now
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    monkeypatch.setattr(Supervisor, "_spawn", spawn)
    # an engine that never answers stays in warm-up; one that answers ready lets serve go on
    monkeypatch.setattr(
        supervise, "engine_status", lambda control: {"state": "ready"} if ready else None
    )
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        with caplog.at_level("INFO", logger="cadence.supervise"):
            code = Supervisor([], [], {}, ready_timeout_s=30).run()
    finally:
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
    assert code == 0
    assert spawned == (["engine", "gateway"] if ready else ["engine"])
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    if ready:
        assert lines == ["stopping"]
    else:
        assert lines == ["stopped during the engine's warm-up, before it was ready"]


def test_a_restarted_engine_that_never_gets_ready_is_killed_and_restarted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The first engine must be ready within --ready-timeout or serve gives up; a restarted
    one had no deadline at all: one stuck in its warm-up left serve up with no engine."""
    engines: list[subprocess.Popen[bytes]] = []

    def spawn(
        supervisor: Supervisor, role: str, args: list[str], secrets: dict[str, str] | None = None
    ) -> "subprocess.Popen[bytes]":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        if role == "gateway":  # the first engine is up: now it dies
            threading.Timer(0.2, engines[0].kill).start()
        elif len(engines) == 2:  # a third engine: the second was given up on
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        if role == "engine":
            engines.append(child)
        return child

    monkeypatch.setattr(Supervisor, "_spawn", spawn)
    # only the first engine ever answers ready
    monkeypatch.setattr(
        supervise,
        "engine_status",
        lambda control, **_: {"state": "ready"} if len(engines) == 1 else None,
    )
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    backstop = threading.Timer(10, os.kill, (os.getpid(), signal.SIGINT))  # serve never gives up
    backstop.start()
    try:
        with caplog.at_level("INFO", logger="cadence.supervise"):
            code = Supervisor([], [], {}, ready_timeout_s=0.5).run()
    finally:
        backstop.cancel()
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
    assert code == 0
    assert len(engines) == 3, "the stuck second engine was replaced"
    assert engines[1].returncode == -signal.SIGKILL
    assert "restarted engine was not ready within 0.5 s: killing it" in caplog.messages
