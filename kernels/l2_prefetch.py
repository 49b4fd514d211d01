"""A launch's own ring reads sent towards L2 before its programmatic-dependent-launch wait.

At one call the ring attention kernels are latency-bound: the temporal layer's reads its
24.6 MB of K+V a layer at ~2.4 TB/s (kernels/ring_attention.py), Mimi's its 1 MB in ~5 us
(kernels/mimi_transformer.py). Under PDL (kernels/dependent_launch.py) their programs are
placed while the kernel before them (RoPE + the ring append, or the qkv projection) still
runs, and wait there for its writes. Before that wait each program now asks for the ring
entries it will read (one contiguous run of K and one of V per program) with bulk L2
prefetches (`cp.async.bulk.prefetch.L2`, sm_90): HBM starts on them while the kernel before
finishes, and the loop after the wait reads them from L2.

A prefetch is a hint: it writes nothing, nothing waits for it, and a dropped or mistaken one
only costs the read it would have saved. So the range may come from a value read before the
wait (a slot's position, which the tick's reset can change): the kernel reads it again after
the wait for everything it computes, and the results are the same bit for bit either way.

A kernel takes `prefetch: tl.constexpr` and calls `prefetch_range` under it; its launcher
passes `prefetch=prefetching(tensor)`: CUDA tensors on compute capability 9.0 or newer while
ENABLED. Off CUDA (Triton's interpreter) the calls compile away.
"""

import functools

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor

# Read at every launch (and so once per captured graph): benches switch it off to compare;
# set it before a graph is captured.
ENABLED = True


@functools.cache
def _supported(device_index: int) -> bool:
    major, _ = torch.cuda.get_device_capability(device_index)
    return major >= 9


def prefetching(x: Tensor) -> bool:
    """Whether a launch working on x sends its reads towards L2 first."""
    if not (ENABLED and x.is_cuda):
        return False
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return _supported(index)


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def prefetch_range(start_ptr, count, on: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
    """`count` contiguous elements from start_ptr towards L2 (none when count <= 0), in 32
    parts, one per thread of the program's first warp. The start must be 16-byte
    aligned and the run a whole number of 16-byte units (ring entries of 64 bytes or more
    are)."""
    if on:
        item: tl.constexpr = start_ptr.dtype.element_ty.primitive_bitwidth // 8
        lanes = tl.arange(0, 32)
        nbytes = count * item
        part = tl.cdiv(tl.cdiv(nbytes, 32), 16) * 16
        offset = lanes.to(tl.int64) * part
        size = tl.minimum(tl.maximum(nbytes - offset, 0), part).to(tl.int32)
        address = start_ptr.to(tl.pointer_type(tl.uint8)) + offset
        # a [32] tensor is replicated over the warps: only the first warp's threads issue
        tl.inline_asm_elementwise(
            "{ .reg .pred p, q; .reg .u32 t; mov.u32 t, %tid.x; setp.lt.u32 q, t, 32;"
            " setp.gt.s32 p, $2, 0; and.pred p, p, q;"
            " @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r",
            [address, size],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )
