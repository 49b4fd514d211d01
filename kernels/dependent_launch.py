"""Programmatic dependent launch (PDL) for Cadence's Triton kernels.

On Hopper a kernel launched with PDL may start while the kernel before it in the stream is
still running: its programs are placed and run up to `wait_for_inputs`, which blocks until
the previous kernel has finished and its writes are visible, then lets the next kernel start
the same way. A tick at one call is ~1,100 kernels of a few microseconds each, so the launch,
the first loads and the last programs of each kernel are a large share of the tick; with PDL
they overlap the kernel before. It also takes effect inside a captured CUDA graph: the graph
executor's 1-call step ran 7.36 ms with it and 7.97 without (one H200, bench/results/
engine_gpu.json and engine_gpu_no_pdl.json; the graph's edges themselves were not inspected).

The rules every kernel here follows, so that any order of PDL and ordinary kernels is safe:

- before `wait_for_inputs` a program reads only what no kernel of the tick writes (weights,
  norm gains, RoPE frequencies) and writes nothing;
- every program calls `wait_for_inputs` (a program that skipped it could finish, and let
  the next kernel start, before the previous kernel's writes are visible).

A kernel takes `pdl: tl.constexpr` and its launcher passes `pdl=on, launch_pdl=on` with
`on = dependent(tensor, kernel)`: True for CUDA tensors on compute capability 9.0 or newer while
ENABLED; False on the CPU and in Triton's interpreter, where the waits compile away.
"""

import functools

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor

# Read at every launch (and so once per captured graph): benches switch it off to compare;
# set it before a graph is captured.
ENABLED = True
# Kernels (their module's name) that launch without PDL even while ENABLED; read likewise.
# The temporal transformer's kernels sit between cuBLAS GEMMs (ring attention after RoPE +
# append, the others each right after a GEMM), as does the LM's input embedding. There PDL
# gained nothing (likely because cuBLAS's kernels do not let a dependent start early; not
# checked) and at 128 calls the stages ran slower with it. One H200, `python3
# bench/engine_stages.py --slots 1,128 --per-op [--pdl both | --pdl-skip ...]`,
# bench/results/engine_stages_pdl*.json: the four stages summed 33.78 ms without PDL, 33.36
# with it everywhere, 32.78 with these skipped; at 1 call 7.56, 6.98 and 7.06, the last two
# apart by about the run-to-run spread.
SKIPPED = frozenset({"rms_norm", "kv_append", "gated_silu", "ring_attention", "embed_sum"})
# Up to this many rows (the launch's tensor's first dimension: slots) SKIPPED does not apply:
# every kernel takes PDL. One H200, alternated in one process (`python3 bench/engine_stages.py
# --slots 1,128 --ab skip`, bench/results/engine_stages_ab_902ed82.json), ms with SKIPPED
# against PDL everywhere: 1 slot temporal 4.32 / 4.25 against 4.11 / 4.09 (the other stages
# within 0.06 either way); 128 slots temporal 26.50 / 26.59 against 26.77 / 26.53, depformer
# 1.93 / 2.05 against 2.12 / 1.96. So one slot only.
ALL_UP_TO = 1


@functools.cache
def _supported(device_index: int) -> bool:
    major, _ = torch.cuda.get_device_capability(device_index)
    return major >= 9


def dependent(x: Tensor, kernel: str) -> bool:
    """Whether `kernel` (its module's name), working on x (its first dimension the slots),
    launches with PDL."""
    if not (ENABLED and x.is_cuda):
        return False
    if kernel in SKIPPED and x.shape[0] > ALL_UP_TO:
        return False
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return _supported(index)


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def wait_for_inputs(pdl: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
    """Block until the previous kernel's writes are visible, then let the next kernel start."""
    if pdl:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
