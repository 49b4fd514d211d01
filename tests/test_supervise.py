"""The supervisor's clean-up of a dead engine's shared memory."""

import time
from multiprocessing import shared_memory

import pytest

from engine.ring import unlink_segment

Segment = shared_memory.SharedMemory


class RacedSegment(Segment):
    """A segment that someone else (the dead engine's resource tracker) unlinks first."""

    def unlink(self) -> None:
        Segment.unlink(self)  # the other process wins the race
        Segment.unlink(self)  # ours then finds nothing


def test_a_segment_removed_meanwhile_is_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"cadence-test-race-{time.monotonic_ns()}"
    owner = Segment(name=name, create=True, size=64)
    owner.close()
    monkeypatch.setattr(shared_memory, "SharedMemory", RacedSegment)  # what unlink_segment opens
    unlink_segment(name)  # raised FileNotFoundError and ended `serve` before
    with pytest.raises(FileNotFoundError):
        Segment(name=name)


def test_a_segment_already_gone_is_not_an_error() -> None:
    unlink_segment(f"cadence-test-absent-{time.monotonic_ns()}")
