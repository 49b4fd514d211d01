"""The doorbell holds its stream until the host rings (the graph executor's armed step); its
way back tells the host the stream got that far."""

import threading
import time

import pytest

pytest.importorskip("torch")

import torch

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

from kernels.doorbell import signal_host, wait_for_bell

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_a_bell_the_gpu_cannot_read_is_refused() -> None:
    with pytest.raises(AssertionError, match="pinned"):
        wait_for_bell(torch.zeros(1, dtype=torch.int64), 1)
    if torch.cuda.is_available():
        with pytest.raises(AssertionError, match="host memory"):
            wait_for_bell(torch.zeros(1, dtype=torch.int64, device="cuda"), 1)


def test_a_flag_the_gpu_cannot_write_is_refused() -> None:
    with pytest.raises(AssertionError, match="pinned"):
        signal_host(torch.zeros(1, dtype=torch.int64), 1)
    if torch.cuda.is_available():
        with pytest.raises(AssertionError, match="host memory"):
            signal_host(torch.zeros(1, dtype=torch.int64, device="cuda"), 1)


@gpu
@needs_cuda
def test_the_stream_waits_for_the_ring_and_only_for_it() -> None:
    bell = torch.zeros(1, dtype=torch.int64).pin_memory()
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    after = torch.zeros(1, device="cuda")
    # the add's kernel loaded before any bell is armed: a first launch behind an unrung bell
    # can block the host in CUDA's lazy loading, before it rings (kernels/doorbell.py). This
    # test hung so once, in a worker whose earlier tests had not added floats on the GPU
    # (bench/results/gpu_tests_kernels_7e0393b_doorbell_hang.log: the host at the add).
    after.add_(0.0)
    torch.cuda.synchronize()
    for value in (1, 2, 17, 32):  # values that Triton would otherwise specialise on
        with torch.cuda.stream(stream):
            wait_for_bell(bell, value)
            after.add_(1.0)
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record()
        time.sleep(0.05)
        assert not done.query(), "the stream ran past an unrung bell"  # type: ignore[no-untyped-call]
        ring = threading.Timer(0.05, lambda v=value: bell.numpy().__setitem__(0, v))
        ring.start()
        done.synchronize()
        ring.join()
    assert float(after.item()) == 4.0
    with torch.cuda.stream(stream):  # a bell already past the value: no wait at all
        wait_for_bell(bell, 3)
    stream.synchronize()


@gpu
@needs_cuda
def test_the_flag_changes_once_the_work_before_it_is_done() -> None:
    bell = torch.zeros(1, dtype=torch.int64).pin_memory()
    flag = torch.zeros(1, dtype=torch.int64).pin_memory()
    out = torch.zeros(1, dtype=torch.int64).pin_memory()
    value = torch.full((1,), 7, dtype=torch.int64, device="cuda")
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    signal_host(flag, 0)  # loaded before a bell is armed (see the test above)
    out.copy_(value, non_blocking=True)
    torch.cuda.synchronize()
    out.zero_()
    previous = 0
    for adds, number in enumerate((1, 2, 17), start=1):
        with torch.cuda.stream(stream):
            wait_for_bell(bell, number)
            value.add_(1)
            out.copy_(value, non_blocking=True)  # a copy out, as the graph executor's
            signal_host(flag, number)
        time.sleep(0.02)
        assert int(flag.numpy()[0]) == previous, "the flag ran past an unrung bell"
        bell.numpy()[0] = number
        deadline = time.monotonic() + 5.0
        while flag.numpy()[0] != number:
            assert time.monotonic() < deadline, "the flag never changed"
        # the copy queued before the flag has landed once the flag says so
        assert int(out.numpy()[0]) == 7 + adds
        previous = number
    stream.synchronize()
