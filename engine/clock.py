"""The tick clock: absolute deadlines on the monotonic clock.

Tick k is released at t0 + k * period and is due (its outputs published) by its deadline,
t0 + (k + 1) * period. Sleeps are always towards an absolute time, never a relative interval,
so lateness in one tick never shifts the ones after it. A tick that could not even start
before its deadline is skipped, not run late: the clock reports how many were skipped.
"""

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class TickClock:
    t0_ns: int
    period_ns: int

    def __post_init__(self) -> None:
        if self.period_ns <= 0:
            raise ValueError("tick period must be positive")

    def release_ns(self, tick: int) -> int:
        return self.t0_ns + tick * self.period_ns

    def deadline_ns(self, tick: int) -> int:
        return self.t0_ns + (tick + 1) * self.period_ns

    def next_tick(self, after: int, now_ns: int) -> tuple[int, int]:
        """The tick to run after tick `after`, and how many ticks were skipped to reach it.

        A tick whose deadline has already passed cannot be met; it is skipped.
        """
        tick = after + 1
        if now_ns >= self.deadline_ns(tick):
            current = (now_ns - self.t0_ns) // self.period_ns
            return current, current - tick
        return tick, 0


def sleep_until(deadline_ns: int) -> None:
    """Sleep until the monotonic clock reaches deadline_ns (kernel timer slack, ~0.1 ms)."""
    while True:
        remaining = deadline_ns - time.monotonic_ns()
        if remaining <= 0:
            return
        time.sleep(remaining / 1e9)
