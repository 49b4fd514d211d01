"""The slot table: which call owns which row of the batch, under which generation.

The engine is the only owner of the table. The control thread opens and closes calls; the
tick thread takes one consistent snapshot per tick. A slot opened since the last snapshot is
reported once in the snapshot's reset mask, so the model clears that row before using it.
Generations come from one counter that starts at 1 and never repeats while the engine lives,
so a stale (slot, generation) pair can never match a later call.
"""

import threading
import time
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray


class AdmissionRefused(Exception):
    """open() could not place the call; `reason` is a bounded label: full, draining or
    starting (the engine is still warming up)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Admission:
    slot: int
    generation: int


@dataclass(frozen=True)
class SlotInfo:
    slot: int
    generation: int
    call_id: str
    owner: int
    opened_monotonic_s: float


@dataclass(frozen=True)
class Snapshot:
    live: NDArray[np.bool_]  # [S] a call holds the row
    reset: NDArray[np.bool_]  # [S] the row starts a new call this tick
    generations: NDArray[np.uint64]  # [S] live generation, 0 for free rows
    # False only where `reset` is all False: the tick then skips the resets without a look
    any_reset: bool = True


class SlotTable:
    def __init__(self, slots: int, accepting: bool = True) -> None:
        if slots < 1:
            raise ValueError("an engine needs at least one slot")
        self.capacity = slots
        self._lock = threading.Lock()
        self._calls: dict[int, SlotInfo] = {}
        self._pending_reset = np.zeros(slots, np.bool_)
        self._resets = False  # a reset may be pending (cleared only by a consuming snapshot)
        # each row's live generation (0: free), kept with _calls, so a snapshot is two copies
        self._generations = np.zeros(slots, np.uint64)
        self._next_generation = 1
        self.draining = False
        self.accepting = accepting  # an engine opens it once it ticks: earlier calls would wait

    def open(self, call_id: str, owner: int) -> Admission:
        with self._lock:
            if self.draining:
                raise AdmissionRefused("draining")
            if not self.accepting:
                raise AdmissionRefused("starting")
            free = next((s for s in range(self.capacity) if s not in self._calls), None)
            if free is None:
                raise AdmissionRefused("full")
            generation = self._next_generation
            self._next_generation += 1
            self._calls[free] = SlotInfo(free, generation, call_id, owner, time.monotonic())
            self._generations[free] = generation
            self._pending_reset[free] = True
            self._resets = True
            return Admission(free, generation)

    def close(self, slot: int, generation: int, owner: int) -> bool:
        """Free the slot if it still belongs to `generation`, opened by `owner`; a stale
        close, or one from another connection, is ignored."""
        with self._lock:
            info = self._calls.get(slot)
            if info is None or info.generation != generation or info.owner != owner:
                return False
            del self._calls[slot]
            self._generations[slot] = 0
            self._pending_reset[slot] = False
            return True

    def close_owner(self, owner: int) -> list[SlotInfo]:
        """Free every slot opened by one control connection (its gateway went away)."""
        with self._lock:
            gone = [info for info in self._calls.values() if info.owner == owner]
            for info in gone:
                del self._calls[info.slot]
                self._generations[info.slot] = 0
                self._pending_reset[info.slot] = False
            return gone

    def snapshot(self, consume: bool = True) -> Snapshot:
        """The live rows now; the resets reported are consumed (reported once) unless
        `consume` is False (a look that changes nothing: the engine's rehearsal)."""
        with self._lock:
            generations = self._generations.copy()
            reset = self._pending_reset.copy()
            any_reset = self._resets
            if consume and any_reset:
                self._pending_reset[:] = False
                self._resets = False
        # generations start at 1: a row is live exactly where it has one
        return Snapshot(generations != 0, reset, generations, any_reset)

    def live_mask(self) -> NDArray[np.bool_]:
        with self._lock:
            live = np.zeros(self.capacity, np.bool_)
            live[list(self._calls)] = True
            return live

    def calls(self) -> list[SlotInfo]:
        with self._lock:
            return sorted(self._calls.values(), key=lambda info: info.slot)

    @property
    def live_count(self) -> int:
        with self._lock:
            return len(self._calls)
