"""A hung step ends the engine process, so the supervisor can start a fresh one.

A GPU program that never finishes (a kernel spinning on a flag that is never set, a driver
fault) leaves the engine's main thread blocked in the tick's one host sync, where no Python
exception can reach it: every call freezes, silently. The watchdog is a thread that sees how
long the current step has been running; past `limit_s` it says which step hung, unlinks the
shared-memory ring, and ends the process with EXIT_HUNG. `cadence serve`'s supervisor restarts
a dead engine; gateways see the control socket close and report "engine down", then "back".

The limit is far above any real step (80 ms ticks; a tick that admits many calls with prompt
prefills takes longer, still well under a second): it tells hung from late, and lateness is
what the deadline metrics count. The steps outside the ticks are watched too (`watching`):
the warm-up, under WARM_UP_LIMIT_S (or the step's limit if longer: with the eager executor its
first step JIT-compiles the kernels), and the run-out of an armed step when the engine stops,
under the step's limit. Not watched: building the executor (the graph executor's own warm-up
and capture, where its kernels compile), before the watchdog starts; under `cadence serve`
the supervisor's ready timeout bounds it.
"""

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator

EXIT_HUNG = 70  # EX_SOFTWARE: internal error
WARM_UP_LIMIT_S = 600.0  # the warm-up's limit: eager, its first step JIT-compiles the kernels


class StepWatchdog:
    def __init__(self, limit_s: float, on_hang: Callable[[], None]) -> None:
        if limit_s <= 0:
            raise ValueError(f"the watchdog limit must be positive, got {limit_s}")
        self.limit_s = limit_s
        self._on_hang = on_hang
        self._lock = threading.Lock()
        self._started_s: float | None = None  # monotonic start of the step in flight
        self._what = ""  # and what it is ("tick 12"), with its limit
        self._step_limit_s = limit_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="step-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    @contextlib.contextmanager
    def watching(self, what: str, limit_s: float | None = None) -> Iterator[None]:
        """Watch the block as one step (`what` names it in the hang message: "tick 12"),
        under `limit_s` (None: the step's limit). A block that raises is over, not hung."""
        with self._lock:
            self._started_s = time.monotonic()
            self._what = what
            self._step_limit_s = self.limit_s if limit_s is None else limit_s
        try:
            yield
        finally:
            with self._lock:
                self._started_s = None

    def _watch(self) -> None:
        period = min(0.1, self.limit_s / 4)
        while not self._stop.wait(period):
            with self._lock:
                started, what, limit_s = self._started_s, self._what, self._step_limit_s
            if started is not None and time.monotonic() - started > limit_s:
                # straight to fd 2, not through logging: the stuck main thread may hold a
                # handler's lock (a write blocked on a full stderr pipe, say)
                message = (
                    f"CRITICAL engine: {what} has been stepping for over {limit_s:g} s: "
                    "the step is hung; exiting so the supervisor restarts the engine\n"
                )
                os.write(2, message.encode())
                self._on_hang()
                return


def exit_hung(cleanup: Callable[[], None]) -> None:
    """Run `cleanup` (best effort), then end the process at once with EXIT_HUNG: the main
    thread is stuck and cannot unwind, so no finally-block of it will run."""
    try:
        cleanup()
    finally:
        os._exit(EXIT_HUNG)
