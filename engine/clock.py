"""The tick clock: absolute deadlines on the monotonic clock.

Tick k is released at t0 + k * period and is due (its outputs published) by its deadline,
t0 + (k + 1) * period. Sleeps are always towards an absolute time, never a relative interval,
so lateness in one tick never shifts the ones after it. A tick that could not even start
before its deadline is skipped, not run late: the clock reports how many were skipped.
"""

import time
from collections import deque
from collections.abc import Callable
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


# The last stretch before a release is spun, not slept: a sleep on Linux wakes late by its
# timer slack (50 us by default) and the core's wake-up, 0.10 ms at the median and 0.23 at p95
# on a 2-core development machine, against 0.3 us spinning the last 0.3 ms (`python3
# bench/tick_wake.py`, bench/results/tick_wake_cpu.json). The spin costs 0.4% of one core at
# the 80 ms period; the engine's own wait spins longer, from its rehearsal of the tick's host
# work to the release (engine/engine.py's REHEARSAL_NS: 0.3% of a core or more).
SPIN_NS = 300_000


def sleep_until(deadline_ns: int, spin_ns: int = SPIN_NS) -> None:
    """Wait until the monotonic clock reaches deadline_ns: sleep to `spin_ns` before it, then
    spin (0: sleep all the way, waking ~0.1 ms late)."""
    while (remaining := deadline_ns - spin_ns - time.monotonic_ns()) > 0:
        time.sleep(remaining / 1e9)
    while time.monotonic_ns() < deadline_ns:
        pass


# Anticipation.run: the work starts at least this long before the wait's expected end
LEAD_NS = 150_000
KEPT_WAITS = 16  # the recent waits the expected end is the shortest of
POLL_S = 0.0002  # how often the wait's end is looked for while the work's moment comes


class Anticipation:
    """Host work run just before a recurring wait ends (a rehearsal of what follows it, warming
    the code that then runs: on one start of the H200 machine a piece of numpy work took ~20
    us run within 0.1 ms of its last run, ~45 us 1 ms later and ~110 us 6 ms later, on
    another ~10, ~18 and ~31 us, 8 us back to back; `python3 bench/tick_gap.py`,
    bench/results/tick_gap_h200_first.json and tick_gap_h200.json).

    The wait is expected to last the shortest of the last KEPT_WAITS (`waited`); the work
    starts `least_lead_ns` (LEAD_NS) before that, or twice its own last time if longer.
    Until then `finished` is polled: a wait that ends sooner skips the work (it would hold
    back what follows), so the expectation follows waits that shorten as well as those that
    grow."""

    def __init__(self, least_lead_ns: int = LEAD_NS) -> None:
        self._waits_ns: deque[int] = deque(maxlen=KEPT_WAITS)
        self.least_lead_ns = least_lead_ns
        self.lead_ns = least_lead_ns

    def run(self, began_ns: int, work: Callable[[], None], finished: Callable[[], bool]) -> bool:
        """Wait for the work's moment in the wait that began at `began_ns` (sleeping between
        polls of `finished`, spinning the last SPIN_NS), then run it; False, not run, where
        the wait finished first or no wait has been seen yet."""
        if not self._waits_ns:
            return False
        start_ns = began_ns + min(self._waits_ns) - self.lead_ns
        while (now_ns := time.monotonic_ns()) < start_ns:
            if finished():
                return False
            if start_ns - now_ns > SPIN_NS:
                time.sleep(POLL_S)
        if finished():
            return False
        work()
        self.lead_ns = max(self.least_lead_ns, 2 * (time.monotonic_ns() - start_ns))
        return True

    def waited(self, began_ns: int) -> None:
        """The wait that began at `began_ns` ended now."""
        self._waits_ns.append(time.monotonic_ns() - began_ns)
