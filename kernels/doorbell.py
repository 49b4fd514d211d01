"""A doorbell: a one-program kernel that holds its stream until the host rings; and its way
back, a one-program kernel that tells the host its stream got that far (signal_host).

The graph executor queues each tick's step between ticks, behind this kernel, which polls an
int64 in pinned host memory until it reaches the tick's number. At the tick the host writes
the uplink into pinned buffers, then the bell; the step was submitted long before, so the
GPU starts it within microseconds. Submitting the ~1,000 kernels of a 1-call step at the tick
instead cost ~0.4 ms after the host had slept (the GPU ran them faster than the host queued
them): one H200, `python3 bench/tick_idle.py --modes back_to_back,sleep,presubmit,...`,
bench/results/tick_idle_presubmit.json.

While it polls, the program holds one multiprocessor, and its stream cannot run anything
else: work that must precede the step goes on another stream (see GraphExecutor).

A hazard of CUDA's lazy module loading (the default since CUDA 12.2): the first launch of a
kernel the process has not run yet loads it, and that load can wait for the GPU's running
kernels, the polling one too, so a host that launches such a kernel after arming and before
ringing blocks there and never rings. Whatever the host launches while a bell is unrung must
have run once before: the graph executor's step ran in its warm-up and capture, and the
engine's one launch between ticks, the benchmarks' age hook, runs once when the engine is
built (Engine.__init__). tests/kernels/test_doorbell.py once hung so (its add not yet loaded
in that worker).
"""

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor

__all__ = ["signal_host", "wait_for_bell"]


# `value` grows by one a tick: unspecialized, or every 16th tick would compile anew
@triton.jit(do_not_specialize=["value"])  # type: ignore[untyped-decorator,unused-ignore]
def _wait_kernel(bell_ptr, value):  # type: ignore[no-untyped-def,unused-ignore]
    while tl.load(bell_ptr, volatile=True) < value:
        pass


def wait_for_bell(bell: Tensor, value: int) -> None:
    """Queue on the current stream a wait until bell (int64 [1], pinned host memory) holds
    at least `value`."""
    assert bell.device.type == "cpu", "the bell lives in host memory"
    assert bell.is_pinned(), "the bell must be pinned: the GPU reads it over the bus"
    assert bell.dtype == torch.int64, bell.dtype
    assert bell.numel() == 1, bell.shape
    _wait_kernel[(1,)](bell, value, num_warps=1)


@triton.jit(do_not_specialize=["value"])  # type: ignore[untyped-decorator,unused-ignore]
def _signal_kernel(flag_ptr, value):  # type: ignore[no-untyped-def,unused-ignore]
    tl.store(flag_ptr, value)


def signal_host(flag: Tensor, value: int) -> None:
    """Queue on the current stream a store of `value` into flag (int64 [1], pinned host
    memory), once the stream's work before it is done: the bell's way back. A host spinning
    on the word sees a step's end sooner than a CUDA event's synchronize does (one H200: a
    doorbell-armed tiny step rung and seen in 19.6 us by the word, 48-55 by the event, 41
    by polling the event; `python3 bench/doorbell_trip.py`,
    bench/results/doorbell_trip_a7191e6.json). The copies queued before it have landed when
    the word changes: their DMA completes before the kernel starts."""
    assert flag.device.type == "cpu", "the flag lives in host memory"
    assert flag.is_pinned(), "the flag must be pinned: the GPU writes it over the bus"
    assert flag.dtype == torch.int64, flag.dtype
    assert flag.numel() == 1, flag.shape
    _signal_kernel[(1,)](flag, value, num_warps=1)
