"""Weights into L2 ahead of the GEMM that reads them, from a side stream.

At one call the temporal layer's four GEMMs stream their weights from HBM at ~4.7 TB/s once
under way, but each costs ~7 us more than its bytes at that rate (qkv 100.7 MB in 28.2 us,
gate/up 184.5 MB in 46.1 us: one H200, bench/results/tick_kernels_1_c4f227d.json), the
start and the end of a launch in which HBM is not kept busy, 128 times a tick. Here a small
kernel, forked onto a side stream just before the work that precedes a GEMM (a norm, the
attention), issues bulk L2 prefetches (`cp.async.bulk.prefetch.L2`, sm_90) for the first
`nbytes` of the GEMM's weight, so that those bytes are on their way while the GEMM's inputs
are made and are read from L2 when it starts. Nothing is written; the side stream joins the
current one at `join` (the end of the step, so that a captured graph has no unjoined work).

    prefetch_ahead(weight, nbytes)   fork, then prefetch weight's first nbytes (0: nothing)
    join(device)                     the current stream waits for the side stream's work

CUDA only (inline PTX: not in Triton's interpreter).
"""

import functools

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor

PROGRAMS = 16  # one warp each; a lane prefetches one chunk of CHUNK bytes at a time
CHUNK = 64 << 10


@triton.jit(do_not_specialize=["nbytes"])  # type: ignore[untyped-decorator,unused-ignore]
def _prefetch_kernel(base_ptr, nbytes, chunk: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
    lanes = tl.arange(0, 32)
    stride = tl.num_programs(0) * 32 * chunk
    for start in range(tl.program_id(0) * 32 * chunk, nbytes, stride):
        offset = start + lanes.to(tl.int64) * chunk
        size = tl.minimum(nbytes - offset, chunk)  # a multiple of 16: nbytes is
        size = tl.where(offset < nbytes, size, 0).to(tl.int32)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2;"
            " mov.u32 $0, 0; }",
            "=r,l,r",
            [base_ptr + offset, size],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )


@functools.cache
def _side_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)  # type: ignore[no-untyped-call]


def prefetch_ahead(weight: Tensor, nbytes: int) -> None:
    """On the device's side stream, once the current stream's work so far is done, prefetch
    the first `nbytes` of weight (rounded down to 16 bytes, at most all of it) into L2;
    nothing at all (any device) when that is 0."""
    nbytes = min(nbytes, weight.numel() * weight.element_size()) // 16 * 16
    if nbytes <= 0:
        return
    assert weight.is_cuda, "L2 prefetch is for CUDA tensors"
    assert weight.is_contiguous(), "the weight must be contiguous"
    main = torch.cuda.current_stream(weight.device)
    side = _side_stream(weight.device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        # a byte pointer: offsets below are in bytes
        _prefetch_kernel[(PROGRAMS,)](weight.view(-1).view(torch.uint8), nbytes, CHUNK, num_warps=1)


def join(device: torch.device) -> None:
    """The current stream waits for everything queued on the device's side stream."""
    torch.cuda.current_stream(device).wait_stream(_side_stream(device))
