"""The shared-memory ring across two real processes."""

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from multiprocessing import shared_memory
from multiprocessing.synchronize import Event
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from engine.ring import (
    DownlinkReader,
    RingError,
    RingSpec,
    SharedRing,
    UplinkWriter,
    stamp,
)

SPEC = RingSpec(
    slots=4, frame_samples=1920, sample_rate=24000, tokens=3, depth=4, tick_period_ns=80_000_000
)
CTX = mp.get_context("spawn")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def ring(request: pytest.FixtureRequest) -> Iterator[SharedRing]:
    ring = SharedRing.create(f"cadence-test-{request.node.name[:20]}-{time.monotonic_ns()}", SPEC)
    yield ring
    ring.close()


def _frame(value: int) -> NDArray[np.int16]:
    return np.full(SPEC.frame_samples, value, np.int16)


def _writer(name: str, slot: int, generation: int, value: int, frames: int, done: Event) -> None:
    """Another process: write `frames` frames as fast as it can, every sample of frame f
    equal to `value + f % 1000`, so a copy torn between two frames shows."""
    ring = SharedRing.attach(name)
    writer = UplinkWriter(ring, slot, generation)
    written = 0
    while written < frames and writer.write(_frame(value + (written + 1) % 1000)):
        written += 1
    done.set()
    ring.close()


def _set_live(ring: SharedRing, slot: int, generation: int) -> None:
    ring.control[slot]["generation"] = generation


def test_attach_reads_the_layout_and_rejects_foreign_segments(ring: SharedRing) -> None:
    other = SharedRing.attach(ring.name)
    assert other.spec == SPEC
    other.close()
    with pytest.raises(RingError, match="no shared-memory segment"):
        SharedRing.attach("cadence-no-such-segment")


def test_a_segment_left_by_a_killed_engine_is_replaced_and_a_live_ones_is_refused() -> None:
    name = f"cadence-test-left-{time.monotonic_ns()}"
    killed = (  # an engine SIGKILLed with its resource tracker: nothing unlinks its segment
        "import os, signal\n"
        "from multiprocessing import resource_tracker\n"
        "from engine.ring import RingSpec, SharedRing\n"
        f"ring = SharedRing.create({name!r}, RingSpec(2, 1920, 24000, 3, 4, 80_000_000))\n"
        "resource_tracker.unregister(ring._shm._name, 'shared_memory')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    engine = subprocess.run([sys.executable, "-c", killed], cwd=ROOT, check=False)
    assert engine.returncode == -signal.SIGKILL
    assert Path("/dev/shm", name).exists(), "the dead engine's segment was left behind"
    ring = SharedRing.create(name, SPEC)  # the next engine under the same name starts
    try:
        assert ring.spec == SPEC
        with pytest.raises(ValueError, match=f"in use by engine pid {os.getpid()}"):
            SharedRing.create(name, SPEC)
    finally:
        ring.close()


def test_a_foreign_segment_of_the_same_name_is_refused_not_removed() -> None:
    name = f"cadence-test-foreign-{time.monotonic_ns()}"
    foreign = shared_memory.SharedMemory(name=name, create=True, size=4096)
    try:
        with pytest.raises(ValueError, match="is not a Cadence ring"):
            SharedRing.create(name, SPEC)
        assert Path("/dev/shm", name).exists()
    finally:
        foreign.close()
        foreign.unlink()


def test_frames_cross_processes_whole_and_never_torn(ring: SharedRing) -> None:
    _set_live(ring, 1, 5)
    done = CTX.Event()
    child = CTX.Process(target=_writer, args=(ring.name, 1, 5, 1234, 20000, done))
    child.start()
    generations = np.zeros(SPEC.slots, np.uint64)
    generations[1] = 5
    last = np.zeros(SPEC.slots, np.uint64)
    out = np.zeros((SPEC.slots, SPEC.frame_samples), np.int16)
    taken = 0
    while not done.is_set() or taken == 0:
        got = ring.gather_uplink(generations, last, out)
        if got[1]:
            assert got[1] > last[1], "frames are taken newest-first, never older"
            last[1] = got[1]
            want = 1234 + int(got[1]) % 1000
            assert (out[1] == want).all(), "a frame is copied whole, from the frame it claims"
            taken += 1
    child.join(10)
    assert child.exitcode == 0
    assert taken > 0
    assert got[0] == got[2] == got[3] == 0, "other slots saw nothing"


def test_a_reused_slot_never_plays_the_old_writers_frames(ring: SharedRing) -> None:
    """The old call's writer keeps writing after its slot went to a new generation."""
    _set_live(ring, 2, 7)
    old_done = CTX.Event()
    old = CTX.Process(target=_writer, args=(ring.name, 2, 7, 1111, 10**9, old_done))
    old.start()
    generations = np.zeros(SPEC.slots, np.uint64)
    last = np.zeros(SPEC.slots, np.uint64)
    out = np.zeros((SPEC.slots, SPEC.frame_samples), np.int16)
    generations[2] = 7
    deadline = time.monotonic() + 10
    while not ring.gather_uplink(generations, last, out)[2]:
        assert time.monotonic() < deadline, "the old writer never wrote"
    # the engine reassigns the slot while the old writer is mid-stream
    _set_live(ring, 2, 8)
    generations[2] = 8
    last[:] = 0
    new_done = CTX.Event()
    new = CTX.Process(target=_writer, args=(ring.name, 2, 8, 2222, 5000, new_done))
    new.start()
    seen_new = 0
    while not new_done.is_set() or seen_new == 0:
        out[:] = 0
        got = ring.gather_uplink(generations, last, out)
        if got[2]:
            last[2] = got[2]
            want = 2222 + int(got[2]) % 1000
            assert (out[2] == want).all(), "only the new call's audio reaches the new call"
            seen_new += 1
    old.join(10)
    new.join(10)
    assert old_done.is_set(), "the stale writer noticed the new generation and stopped"
    assert old.exitcode == 0
    assert new.exitcode == 0
    assert seen_new > 0


def test_downlink_reader_gets_every_frame_in_order_and_counts_skips(ring: SharedRing) -> None:
    _set_live(ring, 0, 3)
    reader = DownlinkReader(ring, 0, 3)
    rows = np.array([0], np.intp)
    tokens = np.array([[1, 2, 3]], np.int32)

    def publish(frame: int) -> None:
        cols = ring.downlink_columns(np.array([frame], np.uint64))
        stamps = np.array([stamp(3, frame)], np.uint64)
        ring.scatter_downlink(rows, cols, stamps, _frame(frame)[None, :], tokens * frame)

    publish(1)
    publish(2)
    got = reader.read()
    assert [f.frame for f in got] == [1, 2]
    assert (got[1].pcm == 2).all()
    assert list(got[1].tokens) == [2, 4, 6]
    for frame in range(3, 10):  # more than the ring holds before the reader looks again
        publish(frame)
    got = reader.read()
    assert [f.frame for f in got] == [6, 7, 8, 9]
    assert reader.skipped == 3
    # a frame for another generation in the same slot is invisible
    cols = ring.downlink_columns(np.array([10], np.uint64))
    stamps = np.array([stamp(4, 10)], np.uint64)
    ring.scatter_downlink(rows, cols, stamps, _frame(10)[None, :], tokens)
    assert reader.read() == []


def test_uplink_writer_stops_once_the_slot_moves_on(ring: SharedRing) -> None:
    _set_live(ring, 3, 9)
    writer = UplinkWriter(ring, 3, 9)
    assert writer.write(_frame(1))
    _set_live(ring, 3, 10)
    assert not writer.write(_frame(2))
