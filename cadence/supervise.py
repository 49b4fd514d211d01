"""`cadence serve`: one engine and one gateway as child processes, started and stopped in order.

The engine starts first and must answer `status` as ready before the gateway starts. On
Ctrl-C or SIGTERM the gateway stops first (it ends its calls and releases their slots), then
the engine (it unlinks its shared memory); a stop before the engine is ready ends serve
there, with the same status 0. A child that dies is restarted: meanwhile the gateway keeps
serving, reports the engine down (/healthz 503, new calls 503 engine_unavailable) and
re-attaches to the new engine by itself; a restarted engine that is not ready within the
ready timeout is stopped (SIGTERM, SIGKILL after NOT_READY_GRACE_S) and restarted, and
MAX_NOT_READY of them in a row (no engine ready in between), those that exited by themselves
before they were ready counted too, stop serve with status 1, as a first engine never ready
does. A child that dies more than MAX_RESTARTS times within
RESTART_WINDOW_S stops serve with a non-zero status. Children are told by the kernel to stop
if serve itself is killed, so no process is left behind.
"""

import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from engine.control import ask_once
from engine.ring import unlink_segment
from engine.watchdog import EXIT_HUNG

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
STOP_TIMEOUT_S = 10.0
KILL_WAIT_S = 5.0  # after SIGKILL: a process stuck in the kernel (a GPU driver) may not exit
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
NOT_READY_GRACE_S = 3.0  # SIGTERM to SIGKILL for a restarted engine never ready
MAX_NOT_READY = 3  # restarted engines in a row never ready (killed, or exited): serve gives up


def die_with_parent() -> None:
    """In a child, before exec: the kernel sends it SIGTERM when its parent dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    os.setpgrp()  # the terminal's Ctrl-C reaches serve only; serve stops children in order


def engine_status(control: Path, timeout_s: float = 1.0) -> dict[str, Any] | None:
    """The engine's status reply, or None while its control socket does not answer."""
    try:
        return ask_once(control, {"op": "status"}, timeout_s)
    except (OSError, ValueError):  # ControlError is an OSError; a torn reply a ValueError
        return None


def wait_ready(
    engine: "subprocess.Popen[Any]",
    control: Path,
    timeout_s: float,
    stopping: Callable[[], bool] = lambda: False,
) -> bool:
    """Until the engine answers `status` as ready; False (logged) if it exits first, the
    timeout passes, or `stopping()` turns true."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stopping():
        if engine.poll() is not None:
            log.error("engine exited with status %d before it was ready", engine.returncode)
            return False
        status = engine_status(control)
        if status is not None and status.get("state") == "ready":
            return True
        time.sleep(0.05)
    if not stopping():
        log.error("engine was not ready within %.0f s", timeout_s)
    return False


def stop_child(
    child: "subprocess.Popen[Any]",
    timeout_s: float = STOP_TIMEOUT_S,
    kill_wait_s: float = KILL_WAIT_S,
) -> bool:
    """SIGTERM, then SIGKILL if it has not exited within `timeout_s`; False (logged) if it
    has not exited `kill_wait_s` after the SIGKILL either (stuck in the kernel): it is left
    behind rather than waited on for ever."""
    if child.poll() is not None:
        return True
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(timeout_s)
        return True
    except subprocess.TimeoutExpired:
        log.error("child %d did not stop in %g s: killing it", child.pid, timeout_s)
    child.kill()
    try:
        child.wait(kill_wait_s)
        return True
    except subprocess.TimeoutExpired:
        log.error("child %d did not exit %g s after SIGKILL: leaving it", child.pid, kill_wait_s)
        return False


class Supervisor:
    def __init__(
        self,
        engine_args: list[str],
        gateway_args: list[str],
        gateway_secrets: dict[str, str],
        ready_timeout_s: float,
    ) -> None:
        self.runtime = Path(tempfile.mkdtemp(prefix="cadence-"))
        self.control = self.runtime / "engine.sock"
        self._engine_starts = 0
        self._engine_args = engine_args
        self._gateway_args = gateway_args
        self._gateway_secrets = gateway_secrets
        self._ready_timeout_s = ready_timeout_s
        self._stop = False
        self.engine: subprocess.Popen[bytes] | None = None
        self.gateway: subprocess.Popen[bytes] | None = None
        self._restarts: list[float] = []
        # why each of the restarted engines in a row never got ready: killed for it, or exited
        # before it (the give-up message says which)
        self._not_ready: list[str] = []

    def _spawn(
        self, role: str, args: list[str], secrets: dict[str, str] | None = None
    ) -> "subprocess.Popen[bytes]":
        cmd = [sys.executable, "-m", "cadence", role, *args]
        log.debug("starting %s: %s", role, " ".join(cmd))
        env = {**os.environ, **secrets} if secrets else None
        return subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop = True

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            return self._run()
        finally:
            self._shutdown()

    @property
    def ring_name(self) -> str:
        """Each engine start gets its own segment: a killed engine cannot unlink its own."""
        return f"cadence-{os.getpid()}-{self._engine_starts}"

    def _start_engine(self) -> "subprocess.Popen[bytes]":
        self._engine_starts += 1
        args = ["--control", str(self.control), "--ring", self.ring_name, *self._engine_args]
        return self._spawn("engine", args)

    def _start_gateway(self) -> "subprocess.Popen[bytes]":
        args = ["--engine-control", str(self.control), *self._gateway_args]
        return self._spawn("gateway", args, self._gateway_secrets)

    def _run(self) -> int:
        self.engine = self._start_engine()
        if not wait_ready(self.engine, self.control, self._ready_timeout_s, lambda: self._stop):
            if self._stop:  # Ctrl-C or SIGTERM while the engine warmed up: a stop, not an error
                log.info("stopped during the engine's warm-up, before it was ready")
                return 0
            return 1
        self.gateway = self._start_gateway()
        ready_by: float | None = None  # a restarted engine's deadline to be ready, until it is
        while not self._stop:
            engine_gone = self.engine.poll() is not None
            if engine_gone and ready_by is not None:
                # a restarted engine that died in its warm-up: one crashing more than ~12 s in
                # never tripped the restart limit, and serve restarted it for ever
                log.error(
                    "engine exited with status %d before it was ready", self.engine.returncode
                )
                self._not_ready.append(_exit_reason(self.engine.returncode))
            elif engine_gone:
                log.error("engine exited with status %d", self.engine.returncode)
            elif ready_by is not None:
                state = self._check_restarted_engine(self.engine, ready_by)
                if state == "ready":
                    ready_by = None
                engine_gone = state == "stopped"
            if engine_gone:
                unlink_segment(self.ring_name)
                if len(self._not_ready) >= MAX_NOT_READY:
                    log.error(
                        "%d restarted engines in a row never got ready (%s): giving up",
                        len(self._not_ready),
                        "; ".join(self._not_ready),
                    )
                    return 1
                if not self._may_restart():
                    return 1
                self.engine = self._start_engine()
                ready_by = time.monotonic() + self._ready_timeout_s
            if self.gateway.poll() is not None:
                log.error("gateway exited with status %d", self.gateway.returncode)
                if not self._may_restart():
                    return 1
                self.gateway = self._start_gateway()
            time.sleep(0.1)
        log.info("stopping")
        return 0

    def _check_restarted_engine(
        self, engine: "subprocess.Popen[bytes]", ready_by: float
    ) -> Literal["ready", "warming", "stopped"]:
        """Past `ready_by` a restarted engine still not ready is stopped (SIGTERM, SIGKILL
        after NOT_READY_GRACE_S, at most KILL_WAIT_S more for it to exit: one stuck in the
        driver is left behind) and counted; the caller restarts it like any other death."""
        status = engine_status(self.control, timeout_s=0.2)
        if status is not None and status.get("state") == "ready":
            log.info("engine ready again")
            self._not_ready = []
            return "ready"
        if time.monotonic() <= ready_by:
            return "warming"
        log.error("restarted engine was not ready within %g s: stopping it", self._ready_timeout_s)
        self._not_ready.append(f"not ready within {self._ready_timeout_s:g} s")
        stop_child(engine, NOT_READY_GRACE_S)
        return "stopped"

    def _may_restart(self) -> bool:
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < RESTART_WINDOW_S] + [now]
        if len(self._restarts) > MAX_RESTARTS:
            log.error("%d restarts within %.0f s: giving up", MAX_RESTARTS, RESTART_WINDOW_S)
            return False
        log.info("restarting it")
        return True

    def _shutdown(self) -> None:
        for child in (self.gateway, self.engine):
            if child is not None:
                stop_child(child)
        shutil.rmtree(self.runtime, ignore_errors=True)


def _exit_reason(returncode: int) -> str:
    """How an engine ended: its status, the signal that killed it, or the watchdog's hang."""
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    if returncode == EXIT_HUNG:
        return f"hung (status {EXIT_HUNG}: the step watchdog)"
    return f"exited with status {returncode}"
