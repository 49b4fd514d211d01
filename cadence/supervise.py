"""`cadence serve`: one engine and one gateway as child processes, started and stopped in order.

The engine starts first and must answer `status` as ready before the gateway starts. On
Ctrl-C or SIGTERM the gateway stops first (it ends its calls and releases their slots), then
the engine (it unlinks its shared memory); a stop before the engine is ready ends serve
there, with the same status 0. A child that dies is restarted: meanwhile the gateway keeps
serving, reports the engine down (/healthz 503, new calls 503 engine_unavailable) and
re-attaches to the new engine by itself; a restarted engine that is not ready within the
ready timeout is killed and restarted. A child that dies more than MAX_RESTARTS times within
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
from typing import Any

from engine.control import ask_once
from engine.ring import unlink_segment

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
STOP_TIMEOUT_S = 10.0
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0


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


def stop_child(child: "subprocess.Popen[Any]", timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout_s`."""
    if child.poll() is not None:
        return
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(timeout_s)
    except subprocess.TimeoutExpired:
        log.error("child %d did not stop in %.0f s: killing it", child.pid, timeout_s)
        child.kill()
        child.wait()


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
            if self.engine.poll() is not None:
                log.error("engine exited with status %d", self.engine.returncode)
                unlink_segment(self.ring_name)
                if not self._may_restart():
                    return 1
                self.engine = self._start_engine()
                ready_by = time.monotonic() + self._ready_timeout_s
            elif ready_by is not None:
                ready_by = self._check_restarted_engine(self.engine, ready_by)
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
    ) -> float | None:
        """None once the restarted engine is ready; past `ready_by` it is killed (the next
        poll restarts it, counted like any other death), as the first start would give up."""
        status = engine_status(self.control, timeout_s=0.2)
        if status is not None and status.get("state") == "ready":
            log.info("engine ready again")
            return None
        if time.monotonic() > ready_by:
            log.error(
                "restarted engine was not ready within %g s: killing it", self._ready_timeout_s
            )
            engine.kill()
            engine.wait()
        return ready_by

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
