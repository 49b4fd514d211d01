"""The shared-memory segment between one engine and its gateways.

Standard library and numpy only: the gateway imports this module, and it must not pull in
torch. One segment per engine, created by the engine and attached by every gateway.

Layout (all little-endian, every region 64-byte aligned, S = slots, D = ring depth,
N = frame samples, K = tokens per step):

    offset 0     header (128 bytes)
                 magic "CADRING1" | layout version u32 | slots u32 | frame samples u32 |
                 sample rate u32 | tokens u32 | depth u32 | tick period ns u64 |
                 tick 0 monotonic ns u64 | heartbeat tick u64 | heartbeat monotonic ns u64 |
                 engine state u32 | engine pid u32
    control      S x 64 bytes, one block per slot:
                 state u32 | generation u32 | ticks u64 | misses u64 | underruns u64 |
                 overruns u64 | uplink frames u64 | downlink frames u64 | skipped u64
                 (ticks: run while the call was live; skipped: ticks the engine skipped
                 while it was live, each also a miss, so misses <= ticks + skipped)
    uplink       stamps u64 [S, D], then pcm int16 [S, D, N]        gateway -> engine
    downlink     stamps u64 [S, D], tokens int32 [S, D, K], pcm int16 [S, D, N]
                                                                    engine -> gateway

Each ring entry is guarded by its stamp, `generation << 32 | frame number` (frame numbers
start at 1 for every call, entry = frame number % D). A writer zeroes the stamp, fills the
payload, then publishes the stamp; a reader reads the stamp, copies, and reads the stamp again,
accepting the copy only if both equal the stamp it expected. Putting the generation in the
stamp means a frame written for an earlier call in a reused slot is never accepted for the next
one, and a writer checks the slot's generation before writing, so a stale writer stops.

The rings are single-producer/single-consumer: each side keeps its own cursor in process
memory; nothing is locked and nothing is allocated per frame beyond the copies the caller owns.
Ordering relies on stores becoming visible in program order (x86-64 TSO), which holds for the
machines Cadence targets.
"""

import contextlib
import os
import sys
from dataclasses import dataclass
from enum import IntEnum
from multiprocessing import resource_tracker, shared_memory
from typing import Self

import numpy as np
from numpy.typing import NDArray

MAGIC = b"CADRING1"
LAYOUT_VERSION = 1
HEADER_BYTES = 128
CONTROL_BYTES = 64
ALIGN = 64

HEADER_DTYPE = np.dtype(
    [
        ("magic", "S8"),
        ("version", "<u4"),
        ("slots", "<u4"),
        ("frame_samples", "<u4"),
        ("sample_rate", "<u4"),
        ("tokens", "<u4"),
        ("depth", "<u4"),
        ("tick_period_ns", "<u8"),
        ("t0_ns", "<u8"),
        ("heartbeat_tick", "<u8"),
        ("heartbeat_ns", "<u8"),
        ("engine_state", "<u4"),
        ("engine_pid", "<u4"),
    ]
)
CONTROL_DTYPE = np.dtype(
    {
        "names": [
            "state",
            "generation",
            "ticks",
            "misses",
            "underruns",
            "overruns",
            "uplink_frames",
            "downlink_frames",
            "skipped",
        ],
        "formats": ["<u4", "<u4", "<u8", "<u8", "<u8", "<u8", "<u8", "<u8", "<u8"],
        "offsets": [0, 4, 8, 16, 24, 32, 40, 48, 56],
        "itemsize": CONTROL_BYTES,
    }
)
assert HEADER_DTYPE.itemsize <= HEADER_BYTES


class EngineState(IntEnum):
    STARTING = 0
    READY = 1
    DRAINING = 2
    STOPPED = 3


class SlotState(IntEnum):
    FREE = 0
    LIVE = 1


class RingError(RuntimeError):
    """The segment is missing, foreign, or of another layout version."""


def stamp(generation: int, frame: int) -> int:
    return (generation << 32) | (frame & 0xFFFFFFFF)


@dataclass(frozen=True)
class RingSpec:
    slots: int
    frame_samples: int  # per frame, at sample_rate
    sample_rate: int  # Hz
    tokens: int  # int32 tokens per downlink frame
    depth: int  # frames per ring and direction
    tick_period_ns: int

    def __post_init__(self) -> None:
        if self.slots < 1 or self.frame_samples < 1 or self.depth < 2 or self.tokens < 0:
            raise ValueError(f"invalid ring spec {self}")


def _attach_untracked(name: str) -> shared_memory.SharedMemory:
    """Attach without handing the segment to this process's resource tracker.

    Before Python 3.13 every attach registers the segment, and the tracker unlinks it when the
    attaching process exits: a gateway that stops would delete the engine's segment.
    """
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, create=False, track=False)
    shm = shared_memory.SharedMemory(name=name, create=False)
    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    return shm


def _remove_if_abandoned(name: str) -> None:
    """Unlink segment `name` if it is a Cadence ring whose engine process is gone."""
    shm = _attach_untracked(name)
    try:
        header: NDArray[np.void] | None = None
        if shm.size >= HEADER_BYTES:
            header = np.ndarray((), HEADER_DTYPE, shm.buf, 0).copy()
        if header is None or bytes(header["magic"]) != MAGIC:
            raise ValueError(f"shared-memory segment {name!r} exists and is not a Cadence ring")
        pid = int(header["engine_pid"])
        if _alive(pid):
            raise ValueError(f"shared-memory segment {name!r} is in use by engine pid {pid}")
    finally:
        shm.close()
    unlink_segment(name)


def unlink_segment(name: str) -> None:
    """Remove the shared memory of an engine that died without unlinking it. The dead engine's
    multiprocessing resource tracker may remove it at the same moment: gone is what we want."""
    try:
        segment = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return
    segment.close()
    with contextlib.suppress(FileNotFoundError):
        segment.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class _Offsets:
    control: int
    up_stamps: int
    up_pcm: int
    down_stamps: int
    down_tokens: int
    down_pcm: int
    total: int

    @classmethod
    def of(cls, spec: RingSpec) -> "_Offsets":
        s, d, n, k = spec.slots, spec.depth, spec.frame_samples, spec.tokens
        control = HEADER_BYTES
        up_stamps = _aligned(control + s * CONTROL_BYTES)
        up_pcm = _aligned(up_stamps + s * d * 8)
        down_stamps = _aligned(up_pcm + s * d * n * 2)
        down_tokens = _aligned(down_stamps + s * d * 8)
        down_pcm = _aligned(down_tokens + s * d * k * 4)
        total = _aligned(down_pcm + s * d * n * 2)
        return cls(control, up_stamps, up_pcm, down_stamps, down_tokens, down_pcm, total)


class SharedRing:
    """Views over one segment; the engine creates it, gateways attach to it."""

    def __init__(self, shm: shared_memory.SharedMemory, spec: RingSpec, owner: bool) -> None:
        self._shm = shm
        self._owner = owner
        self.spec = spec
        off = _Offsets.of(spec)
        s, d, n, k = spec.slots, spec.depth, spec.frame_samples, spec.tokens
        buf = shm.buf
        self.header: NDArray[np.void] = np.ndarray((), HEADER_DTYPE, buf, 0)
        self.control: NDArray[np.void] = np.ndarray((s,), CONTROL_DTYPE, buf, off.control)
        self.up_stamps: NDArray[np.uint64] = np.ndarray((s, d), np.uint64, buf, off.up_stamps)
        self.up_pcm: NDArray[np.int16] = np.ndarray((s, d, n), np.int16, buf, off.up_pcm)
        self.down_stamps: NDArray[np.uint64] = np.ndarray((s, d), np.uint64, buf, off.down_stamps)
        self.down_tokens: NDArray[np.int32] = np.ndarray((s, d, k), np.int32, buf, off.down_tokens)
        self.down_pcm: NDArray[np.int16] = np.ndarray((s, d, n), np.int16, buf, off.down_pcm)

    @property
    def name(self) -> str:
        return self._shm.name

    @classmethod
    def create(cls, name: str, spec: RingSpec) -> Self:
        """A new segment; one left behind by an engine that is dead (killed with its resource
        tracker) is removed first, one whose engine lives, or a foreign one, is a ValueError."""
        size = _Offsets.of(spec).total
        try:
            shm = shared_memory.SharedMemory(name=name, create=True, size=size)
        except FileExistsError:
            _remove_if_abandoned(name)
            shm = shared_memory.SharedMemory(name=name, create=True, size=size)
        ring = cls(shm, spec, owner=True)
        np.ndarray((size,), np.uint8, shm.buf)[:] = 0
        h = ring.header
        h["version"] = LAYOUT_VERSION
        h["slots"] = spec.slots
        h["frame_samples"] = spec.frame_samples
        h["sample_rate"] = spec.sample_rate
        h["tokens"] = spec.tokens
        h["depth"] = spec.depth
        h["tick_period_ns"] = spec.tick_period_ns
        h["engine_state"] = EngineState.STARTING
        h["engine_pid"] = os.getpid()
        h["magic"] = MAGIC  # last: an attacher that sees the magic sees a complete header
        return ring

    @classmethod
    def attach(cls, name: str) -> Self:
        try:
            shm = _attach_untracked(name)
        except FileNotFoundError as exc:
            raise RingError(f"no shared-memory segment named {name!r}: is the engine up?") from exc
        if shm.size < HEADER_BYTES:
            shm.close()
            raise RingError(f"segment {name!r} is too small to be a Cadence ring")
        header: NDArray[np.void] = np.ndarray((), HEADER_DTYPE, shm.buf, 0).copy()
        if bytes(header["magic"]) != MAGIC or int(header["version"]) != LAYOUT_VERSION:
            shm.close()
            raise RingError(
                f"segment {name!r} is not a Cadence ring of layout version {LAYOUT_VERSION}"
            )
        spec = RingSpec(
            slots=int(header["slots"]),
            frame_samples=int(header["frame_samples"]),
            sample_rate=int(header["sample_rate"]),
            tokens=int(header["tokens"]),
            depth=int(header["depth"]),
            tick_period_ns=int(header["tick_period_ns"]),
        )
        return cls(shm, spec, owner=False)

    def close(self) -> None:
        """Drop the views, close the mapping, and unlink the segment if this side created it."""
        del self.header, self.control, self.up_stamps, self.up_pcm
        del self.down_stamps, self.down_tokens, self.down_pcm
        self._shm.close()
        if self._owner:
            self._shm.unlink()

    def abandon(self) -> None:
        """A hung engine's last act: say STOPPED in the header and unlink the segment, without
        closing the mapping (the stuck main thread may still hold views into it)."""
        self.header["engine_state"] = EngineState.STOPPED
        if self._owner:
            self._shm.unlink()

    # -- engine-side header ------------------------------------------------------------------

    def set_engine_state(self, state: EngineState) -> None:
        self.header["engine_state"] = state

    def engine_state(self) -> EngineState:
        return EngineState(int(self.header["engine_state"]))

    def set_clock(self, t0_ns: int) -> None:
        self.header["t0_ns"] = t0_ns

    def beat(self, tick: int, now_ns: int) -> None:
        self.header["heartbeat_tick"] = tick
        self.header["heartbeat_ns"] = now_ns

    def heartbeat(self) -> tuple[int, int]:
        """(tick number, monotonic ns) of the engine's last completed tick."""
        return int(self.header["heartbeat_tick"]), int(self.header["heartbeat_ns"])

    def clock(self) -> tuple[int, int]:
        """(tick 0 monotonic ns, tick period ns): tick k is released at t0 + k * period."""
        return int(self.header["t0_ns"]), int(self.header["tick_period_ns"])

    def slot_generation(self, slot: int) -> int:
        return int(self.control[slot]["generation"])

    # -- engine side: bulk gather and scatter over all slots ----------------------------------

    def gather_uplink(
        self, generations: NDArray[np.uint64], last: NDArray[np.uint64], out: NDArray[np.int16]
    ) -> NDArray[np.uint64]:
        """Copy each slot's newest uplink frame newer than `last[slot]` into `out[slot]`.

        generations: u64 [S] the live generation of each slot (entries of others never match)
        last:        u64 [S] frame number each slot last consumed
        out:         int16 [S, N] written only where a frame was taken
        returns      u64 [S] frame number taken per slot, 0 where none (underrun) or torn
        """
        before = self.up_stamps.copy()
        gen = before >> np.uint64(32)
        frame = before & np.uint64(0xFFFFFFFF)
        fresh = (gen == generations[:, None]) & (frame > last[:, None]) & (before != 0)
        newest: NDArray[np.uint64] = np.where(fresh, frame, np.uint64(0)).max(axis=1)
        rows = np.flatnonzero(newest)
        if rows.size == 0:
            return newest
        cols = (newest[rows] % np.uint64(self.spec.depth)).astype(np.intp)
        out[rows] = self.up_pcm[rows, cols]
        after = self.up_stamps[rows, cols]
        torn = after != before[rows, cols]
        newest[rows[torn]] = 0
        return newest

    def downlink_columns(self, frames: NDArray[np.uint64]) -> NDArray[np.intp]:
        """The downlink ring entries that frame numbers `frames` go to."""
        return (frames % np.uint64(self.spec.depth)).astype(np.intp)

    def scatter_downlink(
        self,
        rows: NDArray[np.intp],
        cols: NDArray[np.intp],
        stamps: NDArray[np.uint64],
        pcm: NDArray[np.int16],
        tokens: NDArray[np.int32],
    ) -> None:
        """Publish one downlink frame per listed slot, at its entry `cols` (downlink_columns
        of the stamps' frame numbers): pcm int16 [R, N], tokens int32 [R, K]."""
        self.down_stamps[rows, cols] = 0
        self.down_pcm[rows, cols] = pcm
        self.down_tokens[rows, cols] = tokens
        self.down_stamps[rows, cols] = stamps


class UplinkWriter:
    """The gateway's producer end of one call's uplink ring."""

    def __init__(self, ring: SharedRing, slot: int, generation: int) -> None:
        self._ring = ring
        self._slot = slot
        self._generation = generation
        self._frame = 0

    def write(self, pcm: NDArray[np.int16]) -> bool:
        """Publish one frame (int16 [N]); False once the slot belongs to another call."""
        ring = self._ring
        if ring.slot_generation(self._slot) != self._generation:
            return False
        self._frame += 1
        col = self._frame % ring.spec.depth
        ring.up_stamps[self._slot, col] = 0
        ring.up_pcm[self._slot, col] = pcm
        ring.up_stamps[self._slot, col] = stamp(self._generation, self._frame)
        return True


@dataclass(frozen=True)
class DownlinkFrame:
    frame: int  # the call's frame number, from 1
    pcm: NDArray[np.int16]  # [N]
    tokens: NDArray[np.int32]  # [K]


class DownlinkReader:
    """The gateway's consumer end of one call's downlink ring: every unread frame, in order."""

    def __init__(self, ring: SharedRing, slot: int, generation: int) -> None:
        self._ring = ring
        self._slot = slot
        self._generation = generation
        self._last = 0
        self.skipped = 0  # frames overwritten before they were read

    def read(self) -> list[DownlinkFrame]:
        ring = self._ring
        depth = ring.spec.depth
        stamps = ring.down_stamps[self._slot].copy()
        numbers = stamps & np.uint64(0xFFFFFFFF)
        unread = (stamps >> np.uint64(32) == self._generation) & (numbers > self._last)
        taken: list[DownlinkFrame] = []
        for f in np.sort(numbers[unread]).tolist():
            col = f % depth
            pcm = ring.down_pcm[self._slot, col].copy()
            tokens = ring.down_tokens[self._slot, col].copy()
            if int(ring.down_stamps[self._slot, col]) != stamp(self._generation, f):
                continue  # overwritten while copying: a newer frame is already there
            if self._last and f > self._last + 1:
                self.skipped += f - self._last - 1
            self._last = f
            taken.append(DownlinkFrame(f, pcm, tokens))
        return taken
