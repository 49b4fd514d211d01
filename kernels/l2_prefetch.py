"""The next launch's weights sent towards L2 by the launch before it.

At one call the depformer is a chain of ~200 dependent launches, each reading 2 to 12 MB of
weights: too little to keep HBM busy for the round trip a load takes, so each launch waits on
HBM latency while the memory system idles (the few-rows kernels stream at 12-35% of HBM,
kernels/fused_linear.py's docstring). Here a launch, before it waits for its own inputs,
spreads bulk L2 prefetches (`cp.async.bulk.prefetch.L2`, sm_90) of the weight the launch
after it will read over its programs; that weight then arrives while this launch runs, and
the next one reads it from L2. Nothing is written and nothing waits on the prefetches: they
are hints, and a dropped one only costs the HBM read it would have saved.

A kernel takes `next_ptr, next_bytes, prefetch: tl.constexpr` and calls `prefetch_share`
once; its launcher passes `**ahead(next_weight, x)`: the weight as bytes, its size and whether
to prefetch (CUDA on compute capability 9.0 or newer while ENABLED, a weight given). Off CUDA
(Triton's interpreter) the call compiles away. The bytes split evenly over the grid (one or
two axes) and the 32 lanes of each program's first warp, each part 16-byte aligned.
"""

import functools

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor

# Read at every launch (and so once per captured graph): benches switch it off to compare;
# set it before a graph is captured.
ENABLED = True
ALIGN = 16  # bytes: the bulk prefetch's address and size granularity


@functools.cache
def _supported(device_index: int) -> bool:
    major, _ = torch.cuda.get_device_capability(device_index)
    return major >= 9


def ahead(weight: Tensor | None, like: Tensor) -> dict[str, Tensor | int | bool]:
    """The kernel arguments that prefetch `weight` (None: nothing) ahead of the launch after
    the one working on `like`: next_ptr (a byte view), next_bytes (whole ALIGN-byte parts)
    and prefetch (on)."""
    off: dict[str, Tensor | int | bool] = {"next_ptr": like, "next_bytes": 0, "prefetch": False}
    if weight is None or not (ENABLED and like.is_cuda):
        return off
    assert weight.is_contiguous(), "a prefetched weight must be contiguous"
    assert weight.device == like.device, "tensors on one device"
    index = like.device.index if like.device.index is not None else torch.cuda.current_device()
    nbytes = weight.numel() * weight.element_size() // ALIGN * ALIGN
    if not (_supported(index) and weight.data_ptr() % ALIGN == 0 and nbytes > 0):
        return off
    return {"next_ptr": weight.view(-1).view(torch.uint8), "next_bytes": nbytes, "prefetch": True}


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def prefetch_share(base_ptr, nbytes, on: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
    """This program's share of the `nbytes` at the byte pointer base_ptr, towards L2."""
    if on:
        lanes = tl.arange(0, 32)
        across = tl.num_programs(0)
        program = tl.program_id(0) + tl.program_id(1) * across  # grids of one or two axes
        units = across * tl.num_programs(1) * 32
        part = tl.cdiv(tl.cdiv(nbytes, units), 16) * 16
        offset = (program * 32 + lanes).to(tl.int64) * part
        size = tl.minimum(tl.maximum(nbytes - offset, 0), part).to(tl.int32)
        # only the first warp's threads issue (a [32] tensor is replicated over the warps)
        tl.inline_asm_elementwise(
            "{ .reg .pred p, q; .reg .u32 t; mov.u32 t, %tid.x; setp.lt.u32 q, t, 32;"
            " setp.gt.s32 p, $2, 0; and.pred p, p, q;"
            " @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r",
            [base_ptr + offset, size],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )
