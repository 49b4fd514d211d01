"""How the GPU benches time things: CUDA-graph replays, kernel counts, the machine they ran on.

    replay_ms(fn, replays, repeats)  ms per replay of a graph holding `repeats` calls of fn
    summary(times)                   {"median_ms", "p99_ms"}
    kernel_names(fn) / count_kernels(fn)  kernels one eager call of fn launches (torch profiler)
    ranked(kernels, top)             (name, launches, summed us) of profiled kernels, costliest 1st
    machine()                        GPU, multiprocessors and versions, for each result's JSON

fn is warmed up on a side stream first (Triton compiles, cuBLAS picks, allocations settle)
and the graph is replayed a few times before the timed replays; each replay is timed alone
with CUDA events, so what is timed is the device's work, not Python's.
"""

import platform
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

WARMUP_CALLS = 3
WARMUP_REPLAYS = 3


def replay_ms(fn: Callable[[], object], replays: int = 50, repeats: int = 1) -> list[float]:
    """Capture `repeats` calls of fn in one CUDA graph; ms of each of `replays` replays."""
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_CALLS):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            fn()
    for _ in range(WARMUP_REPLAYS):
        graph.replay()
    times = []
    for _ in range(replays):
        begin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call,unused-ignore]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call,unused-ignore]
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    del graph
    return times


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median_ms": round(statistics.median(ordered), 4),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 4),
    }


def kernel_names(fn: Callable[[], object]) -> Counter[str]:
    """How many times one eager call of fn launches each kernel (torch profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return Counter(e.name for e in prof.events() if e.device_type.name == "CUDA")


def count_kernels(fn: Callable[[], object]) -> int:
    return sum(kernel_names(fn).values())


def ranked(kernels: Iterable[tuple[str, float]], top: int) -> list[tuple[str, int, float]]:
    """(name, launches, summed us) of the `top` costliest names among (name, us) kernels."""
    totals: dict[str, tuple[int, float]] = {}
    for name, us in kernels:
        launches, total = totals.get(name, (0, 0.0))
        totals[name] = (launches + 1, total + us)
    order = sorted(totals.items(), key=lambda item: -item[1][1])[:top]
    return [(name, launches, total) for name, (launches, total) in order]


def frontier_advances(kernels: Sequence[tuple[float, float]]) -> list[float]:
    """For kernels (start, end), in order of start, how far each moves the latest end seen
    so far: its share of the span from the first start to the last end (the shares sum to
    that span). Under programmatic dependent launch a kernel starts before the one before it
    ends and its own duration includes that wait; its advance is what it adds to the chain."""
    advances = []
    frontier = kernels[0][0] if kernels else 0.0
    for _, end in kernels:
        advances.append(max(0.0, end - frontier))
        frontier = max(frontier, end)
    return advances


def machine() -> dict[str, Any]:
    found: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "multiprocessors": torch.cuda.get_device_properties(0).multi_processor_count,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    try:
        import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]

        found["triton"] = triton.__version__
    except ImportError:
        pass
    return found
