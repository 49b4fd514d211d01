"""The supervisor: clean-up of a dead engine's shared memory, stopping before and after ready."""

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import types
from collections.abc import Collection
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
    assert engines[1].returncode == -signal.SIGTERM, "asked to stop first"
    assert "restarted engine was not ready within 0.5 s: stopping it" in caplog.messages


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def monotonic(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


class FakeChild:
    """A child process on a fake clock. `obeys` are the signals that end it (SIGKILL ends
    any but a stuck one); a wait that would never return fails the test instead."""

    def __init__(
        self, clock: FakeClock, obeys: set[int], stuck: bool = False, exits_at: float = 1e9
    ) -> None:
        self.clock, self.obeys, self.stuck, self.exits_at = clock, obeys, stuck, exits_at
        self.returncode: int | None = None
        self.pid = 4242
        self.signals: list[int] = []

    def poll(self) -> int | None:
        if self.returncode is None and self.clock.t >= self.exits_at:
            self.returncode = 1  # exits by itself (a crash in its warm-up)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if sig in self.obeys:
            self.returncode = -sig

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
        if not self.stuck:
            self.returncode = -signal.SIGKILL

    def wait(self, timeout: float | None = None) -> int:
        if (
            self.returncode is None
            and timeout is not None
            and self.clock.t + timeout >= self.exits_at
        ):
            self.clock.t = max(self.clock.t, self.exits_at)  # it exits within the wait
        if self.poll() is not None:
            assert self.returncode is not None
            return self.returncode
        if timeout is None:
            raise AssertionError("the supervisor waited for ever on a child that never exits")
        self.clock.t += timeout
        raise subprocess.TimeoutExpired("engine", timeout)


def run_on_fake_clock(
    monkeypatch: pytest.MonkeyPatch,
    ready: set[int],
    obeys: set[int],
    stuck: Collection[int] = (),
    ready_timeout_s: float = 120.0,
    exits_after_s: float = 1e9,
) -> tuple[int, list[FakeChild], FakeClock]:
    """serve with fake children on a fake clock. The engines numbered in `ready` (from 1)
    answer ready once and then crash; the others never answer, and exit by themselves
    (status 1) `exits_after_s` after they start. Engines end on the signals in `obeys` and on
    SIGKILL, those in `stuck` not even on that. A backstop stops serve at 50 engines."""
    clock = FakeClock()
    monkeypatch.setattr(
        supervise, "time", types.SimpleNamespace(monotonic=clock.monotonic, sleep=clock.sleep)
    )
    engines: list[FakeChild] = []

    def spawn(
        supervisor: Supervisor, role: str, args: list[str], secrets: dict[str, str] | None = None
    ) -> FakeChild:
        if role == "gateway":
            return FakeChild(clock, {signal.SIGTERM})
        n = len(engines) + 1
        exits_at = 1e9 if n in ready else clock.t + exits_after_s
        engines.append(FakeChild(clock, obeys, stuck=n in stuck, exits_at=exits_at))
        if len(engines) >= 50:
            supervisor._stop = True
        return engines[-1]

    def status(control: object, timeout_s: float = 1.0) -> dict[str, str] | None:
        if len(engines) not in ready or engines[-1].returncode is not None:
            return None
        engines[-1].returncode = 1  # ready, and crashes right after
        return {"state": "ready"}

    monkeypatch.setattr(Supervisor, "_spawn", spawn)
    monkeypatch.setattr(supervise, "unlink_segment", lambda name: None)
    monkeypatch.setattr(supervise, "engine_status", status)
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    code = Supervisor([], [], {}, ready_timeout_s=ready_timeout_s).run()
    return code, engines, clock


def _assert_gave_up_after_one_ready(caplog: pytest.LogCaptureFixture, why: str) -> None:
    """One restarted engine got ready (the count started again), then serve gave up, saying
    `why` each of the last three never got ready."""
    assert caplog.messages.count("engine ready again") == 1
    assert caplog.messages[-1] == (
        f"3 restarted engines in a row never got ready ({'; '.join([why] * 3)}): giving up"
    )


def test_restarted_engines_never_ready_stop_serve_after_three_in_a_row(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Killed once per --ready-timeout, a restarted engine never ready could not trip the
    5-a-minute restart limit: serve restarted it for ever. Now 3 in a row end serve with 1,
    like a first engine never ready; one ready in between starts the count again."""
    with caplog.at_level("INFO", logger="cadence.supervise"):
        code, engines, clock = run_on_fake_clock(monkeypatch, ready={1, 4}, obeys={signal.SIGTERM})
    # engines 2, 3 never ready, 4 ready (the count starts again), 5, 6, 7 never ready
    assert code == 1
    assert len(engines) == 7
    for n in (2, 3, 5, 6, 7):
        assert engines[n - 1].signals == [signal.SIGTERM], f"engine {n} stopped by SIGTERM"
    assert engines[3].signals == []
    _assert_gave_up_after_one_ready(caplog, "not ready within 120 s")
    assert clock.t == pytest.approx(5 * 120, abs=5), "one ready-timeout per engine never ready"


def test_restarted_engines_that_exit_before_ready_count_toward_the_three_in_a_row(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A restarted engine that crashes in a long warm-up (30 s here, more than the ~12 s
    between exits that 5 restarts a minute allow) never tripped the restart limit: serve
    restarted it for ever. It now counts toward the same 3 in a row as one killed for not
    being ready; a ready engine starts the count again."""
    with caplog.at_level("INFO", logger="cadence.supervise"):
        code, engines, clock = run_on_fake_clock(
            monkeypatch, ready={1, 3}, obeys={signal.SIGTERM}, exits_after_s=30.0
        )
    # engine 2 exits before ready, 3 ready (the count starts again), 4, 5, 6 exit before ready
    assert code == 1
    assert len(engines) == 6
    for n in (2, 4, 5, 6):
        assert engines[n - 1].signals == [], f"engine {n} exited by itself"
        assert engines[n - 1].returncode == 1
    assert caplog.messages.count("engine exited with status 1 before it was ready") == 4
    _assert_gave_up_after_one_ready(caplog, "exited with status 1")
    assert clock.t == pytest.approx(4 * 30, abs=5), "each exit seen at once, no ready timeout"


def test_a_restarted_engine_deaf_to_sigterm_and_stuck_after_sigkill_blocks_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGKILL follows SIGTERM after a short grace, and the wait after SIGKILL is bounded: an
    engine stuck in the GPU driver held serve's loop for ever."""
    with caplog.at_level("INFO", logger="cadence.supervise"):
        code, engines, clock = run_on_fake_clock(
            monkeypatch, ready={1}, obeys=set(), stuck={2}, ready_timeout_s=60.0
        )
    assert code == 1
    assert len(engines) == 4
    for engine in engines[1:]:
        assert engine.signals == [signal.SIGTERM, signal.SIGKILL]
    assert engines[1].returncode is None, "stuck: left behind, serve went on"
    assert engines[2].returncode == engines[3].returncode == -signal.SIGKILL
    grace, kill_wait = supervise.NOT_READY_GRACE_S, supervise.KILL_WAIT_S
    assert 0 < grace <= 5
    assert 0 < kill_wait <= 10
    assert f"child 4242 did not stop in {grace:g} s: killing it" in caplog.messages
    assert f"child 4242 did not exit {kill_wait:g} s after SIGKILL: leaving it" in caplog.messages
    assert clock.t == pytest.approx(3 * (60 + grace) + kill_wait, abs=5)


def test_the_reason_an_engine_never_got_ready_names_a_signal_or_the_watchdog() -> None:
    assert supervise._exit_reason(1) == "exited with status 1"
    assert supervise._exit_reason(-9) == "killed by SIGKILL"
    assert supervise._exit_reason(70) == "hung (status 70: the step watchdog)"
