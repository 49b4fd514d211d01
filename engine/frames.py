"""The tick's host work on audio frames: gathering the uplink, scattering the downlink.

Both keep per-slot state (the frame numbers consumed and published) and their working buffers,
allocated once at the slot count. Each is cut in two, around the step: what the step needs
before it starts, or what must follow its outputs, runs in the tick's critical path; the rest
runs while the device steps (Engine.tick gives it to the executor as `meanwhile`). The gather
takes the frames (`take`) before the step and accounts for them (`account`: frame numbers,
underruns, overruns) during it; the scatter numbers and stamps the downlink frames
(`stage`) during the step and publishes the audio and tokens (`publish`) after it. At one
call on the H200 machine's host these host pieces cost 5-60 us each, each numpy call a few
us there, cold after the idle wait (bench/results/tick_host_split_*.json).

Each can also rehearse: run the same code on a twin of its state, changing nothing a call
sees, so that the first real run after the engine slept between ticks finds the code and data
in the CPU's caches. Measured on the H200 machine's host
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
class Taken:
    """What one gather took, per slot: the frame number (0: none) and whether a live call's
    frame was taken."""

    frames: NDArray[np.uint64]
    got: NDArray[np.bool_]


@dataclass(frozen=True)
class Uplink:
    """What one gather found, per slot: a frame taken, a live call's frame missing
    (underrun: counted once media has started), frames skipped over (overrun)."""

    got: NDArray[np.bool_]
    underrun: NDArray[np.bool_]
    skipped: NDArray[np.uint64]


class UplinkGather:
    def __init__(
        self,
        slots: int,
        samples: int,
        rehearsable: bool = True,
        pcm: NDArray[np.float32] | None = None,
    ) -> None:
        """`pcm`: where `take` writes the step's input (float32 [slots, samples]: the
        executor's input_pcm, so that its step copies nothing more), else a buffer of its
        own. The rehearsal's twin always has its own."""
        self.last = np.zeros(slots, np.uint64)  # frame number consumed per slot
        self.started = np.zeros(slots, np.bool_)  # a frame arrived for this call
        self.i16 = np.zeros((slots, samples), np.int16)
        if pcm is None:
            pcm = np.zeros((slots, samples), np.float32)
        if pcm.shape != (slots, samples) or pcm.dtype != np.float32:
            raise ValueError(f"pcm must be float32 {(slots, samples)}, got {pcm.dtype} {pcm.shape}")
        self.pcm = pcm  # the step's input
        self._twin = UplinkGather(slots, samples, False) if rehearsable else None

    def reset(self, rows: NDArray[np.bool_]) -> None:
        self.last[rows] = 0
        self.started[rows] = False

    def take(self, ring: SharedRing, snap: Snapshot) -> Taken:
        """Copy each live slot's newest unread frame into `pcm` (silence where none). The
        frames count as consumed once `account`ed."""
        frames = ring.gather_uplink(snap.generations, self.last, self.i16)
        got = snap.live & (frames > 0)
        # in float32 (exact: the scale is a power of two); int16 times a Python float would
        # compute in float64 first, 2.8x slower (0.34 against 0.12 ms at 300 calls)
        np.multiply(self.i16, PCM_SCALE, out=self.pcm, dtype=np.float32)
        self.pcm[~got] = 0.0
        return Taken(frames, got)

    def account(self, snap: Snapshot, taken: Taken) -> Uplink:
        """The frames of `take` consumed: the per-slot frame numbers moved on, underruns and
        overruns found."""
        got = taken.got
        skipped = np.where(got & (self.last > 0), taken.frames - self.last - 1, 0)
        self.last[got] = taken.frames[got]
        self.started |= got
        underrun = snap.live & self.started & ~got
        return Uplink(got, underrun, skipped)

    def rehearse(self, ring: SharedRing, snap: Snapshot) -> None:
        """`take` and `account` on a twin holding a copy of this state: reads the ring,
        consumes nothing."""
        twin = self._twin
        assert twin is not None, "a twin does not rehearse"
        np.copyto(twin.last, self.last)
        np.copyto(twin.started, self.started)
        twin.reset(snap.reset)
        twin.account(snap, twin.take(ring, snap))


class DownlinkScatter:
    def __init__(self, slots: int, samples: int, rehearsable: bool = True) -> None:
        self.frame = np.zeros(slots, np.uint64)  # frame number published per slot
        self.i16 = np.zeros((slots, samples), np.int16)
        self._twin = DownlinkScatter(slots, samples, False) if rehearsable else None
        # what the twin publishes: silence
        self._silence = np.zeros((slots, samples), np.float32) if rehearsable else None
        # the staged frames (stage): their slots, stamps and ring columns
        self._rows: NDArray[np.intp] = np.zeros(0, np.intp)
        self._stamps: NDArray[np.uint64] = np.zeros(0, np.uint64)
        self._cols: NDArray[np.intp] = np.zeros(0, np.intp)

    def reset(self, rows: NDArray[np.bool_]) -> None:
        self.frame[rows] = 0

    def stage(
        self, ring: SharedRing, rows: NDArray[np.intp], generations: NDArray[np.uint64]
    ) -> None:
        """Number the next downlink frame of each listed slot and stamp it with the call's
        generation, for the next `publish`."""
        self.frame[rows] += 1
        frames = self.frame[rows]
        self._rows = rows
        self._stamps = (generations[rows] << np.uint64(32)) | frames
        self._cols = ring.downlink_columns(frames)

    def publish(self, ring: SharedRing, pcm: NDArray[np.float32], tokens: NDArray[Any]) -> None:
        """The staged frames: pcm (every slot's) clipped in place and made int16, written
        with the tokens to the ring."""
        rows = self._rows
        self._converted(pcm)
        ring.scatter_downlink(rows, self._cols, self._stamps, self.i16[rows], tokens[rows])

    def rehearse(
        self, ring: SharedRing, rows: NDArray[np.intp], generations: NDArray[np.uint64]
    ) -> None:
        """`stage` and `publish` of silence on a twin, but for the ring's writes."""
        twin, silence = self._twin, self._silence
        assert twin is not None, "a twin does not rehearse"
        assert silence is not None
        np.copyto(twin.frame, self.frame)
        twin.stage(ring, rows, generations)
        twin._converted(silence)

    def rehearse_publish(self) -> None:
        """`publish`'s conversion and indexing of the staged rows on a twin, silence for the
        audio: run just before the outputs land (Engine.tick's ahead_of_outputs)."""
        twin, silence = self._twin, self._silence
        assert twin is not None, "a twin does not rehearse"
        assert silence is not None
        twin._converted(silence)
        _ = twin.i16[self._rows]  # the indexing rehearsed, its copy dropped

    def _converted(self, pcm: NDArray[np.float32]) -> None:
        np.clip(pcm, -1.0, 32767.0 / 32768.0, out=pcm)
        np.multiply(pcm, 32768.0, out=self.i16, casting="unsafe")
