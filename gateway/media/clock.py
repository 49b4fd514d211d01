"""The gateway's media clock: pump instants on the engine's tick grid.

The engine releases tick k at t0 + k * period (published in the ring header). Every call's
receive path is pumped `per_tick` times per tick, the last pump `lead_s` before the release,
when the finished frame goes to the ring; the send path reads the engine's output at every
pump. All instants are absolute, on the monotonic clock that asyncio's loop also uses.
"""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class PumpGrid:
    t0_s: float  # release of tick 0, monotonic seconds
    period_s: float  # tick period
    per_tick: int  # pumps per tick
    lead_s: float  # the frame-completing pump runs this long before the release

    def __post_init__(self) -> None:
        if self.per_tick < 1 or not 0 <= self.lead_s < self.period_s / self.per_tick * 2:
            raise ValueError(f"invalid pump grid {self}")

    @property
    def step_s(self) -> float:
        return self.period_s / self.per_tick

    def index_at(self, now_s: float) -> int:
        """Index of the last pump instant at or before now (instant i at origin + i * step)."""
        return math.floor((now_s - self._origin) / self.step_s + 1e-9)

    def instant(self, index: int) -> float:
        return self._origin + index * self.step_s

    def completes_frame(self, index: int) -> bool:
        return index % self.per_tick == 0

    def release(self, index: int) -> float | None:
        """Release of the tick that takes the frame pump `index` completes; None if it completes
        none."""
        return self.instant(index) + self.lead_s if self.completes_frame(index) else None

    def frames_between(self, start: int, stop: int) -> int:
        """How many of the pump instants start, ..., stop - 1 complete a frame."""
        return max(0, (stop - 1) // self.per_tick - (start - 1) // self.per_tick)

    @property
    def _origin(self) -> float:
        return self.t0_s - self.lead_s
