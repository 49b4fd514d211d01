"""The tick's host work on audio frames: gathering the uplink, scattering the downlink.

Both keep per-slot state (the frame numbers consumed and published) and their working buffers,
allocated once at the slot count. Each can also rehearse: run the same code on a twin of its
state, changing nothing a call sees, so that the first real run after the engine slept
between ticks finds the code and data in the CPU's caches. Measured on the H200 machine's host
(a KVM guest; `python3 bench/tick_host.py`, bench/results/tick_host_h200.json) and on the
development machine (tick_host_cpu_rehearsed.json): see bench/tick_host.py's modes.
"""

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from engine.ring import SharedRing
from engine.slots import Snapshot

PCM_SCALE = np.float32(1.0 / 32768.0)


@dataclass(frozen=True)
class Uplink:
    """What one gather found, per slot: a frame taken, a live call's frame missing
    (underrun: counted once media has started), frames skipped over (overrun)."""

    got: NDArray[np.bool_]
    underrun: NDArray[np.bool_]
    skipped: NDArray[np.uint64]


class UplinkGather:
    def __init__(self, slots: int, samples: int, rehearsable: bool = True) -> None:
        self.last = np.zeros(slots, np.uint64)  # frame number consumed per slot
        self.started = np.zeros(slots, np.bool_)  # a frame arrived for this call
        self.i16 = np.zeros((slots, samples), np.int16)
        self.pcm = np.zeros((slots, samples), np.float32)  # the step's input
        self._twin = UplinkGather(slots, samples, False) if rehearsable else None

    def reset(self, rows: NDArray[np.bool_]) -> None:
        self.last[rows] = 0
        self.started[rows] = False

    def take(self, ring: SharedRing, snap: Snapshot) -> Uplink:
        """Copy each live slot's newest unread frame into `pcm` (silence where none)."""
        taken = ring.gather_uplink(snap.generations, self.last, self.i16)
        got = snap.live & (taken > 0)
        skipped = np.where(got & (self.last > 0), taken - self.last - 1, 0)
        self.last[got] = taken[got]
        self.started |= got
        underrun = snap.live & self.started & ~got
        # in float32 (exact: the scale is a power of two); int16 times a Python float would
        # compute in float64 first, 2.8x slower (0.34 against 0.12 ms at 300 calls)
        np.multiply(self.i16, PCM_SCALE, out=self.pcm, dtype=np.float32)
        self.pcm[~got] = 0.0
        return Uplink(got, underrun, skipped)

    def rehearse(self, ring: SharedRing, snap: Snapshot) -> None:
        """`take` on a twin holding a copy of this state: reads the ring, consumes nothing."""
        twin = self._twin
        assert twin is not None, "a twin does not rehearse"
        np.copyto(twin.last, self.last)
        np.copyto(twin.started, self.started)
        twin.reset(snap.reset)
        twin.take(ring, snap)


class DownlinkScatter:
    def __init__(self, slots: int, samples: int, rehearsable: bool = True) -> None:
        self.frame = np.zeros(slots, np.uint64)  # frame number published per slot
        self.i16 = np.zeros((slots, samples), np.int16)
        self._twin = DownlinkScatter(slots, samples, False) if rehearsable else None
        # what the twin publishes: silence
        self._silence = np.zeros((slots, samples), np.float32) if rehearsable else None

    def reset(self, rows: NDArray[np.bool_]) -> None:
        self.frame[rows] = 0

    def publish(
        self,
        ring: SharedRing,
        rows: NDArray[np.intp],
        generations: NDArray[np.uint64],
        pcm: NDArray[np.float32],
        tokens: NDArray[Any],
    ) -> None:
        """One downlink frame per listed slot: pcm clipped (in place) and made int16, stamped
        with the call's generation and the next frame number."""
        stamps = self._stamped(rows, generations, pcm)
        ring.scatter_downlink(rows, stamps, self.i16[rows], tokens[rows])

    def rehearse(self, rows: NDArray[np.intp], generations: NDArray[np.uint64]) -> None:
        """`publish` of silence on a twin, but for the ring's writes."""
        twin, silence = self._twin, self._silence
        assert twin is not None, "a twin does not rehearse"
        assert silence is not None
        np.copyto(twin.frame, self.frame)
        twin._stamped(rows, generations, silence)

    def _stamped(
        self, rows: NDArray[np.intp], generations: NDArray[np.uint64], pcm: NDArray[np.float32]
    ) -> NDArray[np.uint64]:
        self.frame[rows] += 1
        stamps: NDArray[np.uint64] = (generations[rows] << np.uint64(32)) | self.frame[rows]
        np.clip(pcm, -1.0, 32767.0 / 32768.0, out=pcm)
        np.multiply(pcm, 32768.0, out=self.i16, casting="unsafe")
        return stamps
