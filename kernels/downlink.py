"""The downlink published by the GPU: a step's audio and tokens written straight into the
engine's shared-memory ring (engine/ring.py), which the graph executor registers with CUDA.

On the host the scatter clipped and converted every slot's pcm, then wrote each frame, its
tokens and its stamp into the ring: at the H200 machine's host 0.04-0.06 ms of the 1-call
tick after the step, ~1 ms at 300 calls (bench/results/bench_engine_*_4ba5051.json, the
scatter phase). Here one launch at the end of the step does it. The host still decides what
goes where: while the step runs it numbers and stamps the frames (engine/frames.py's
DownlinkScatter.stage), zeroes the stamps of the entries they go to (a writer's first move,
engine/ring.py), and writes the rows, entries and stamps into pinned staging, then the
staged word; the kernel waits for that word, then each program publishes one frame:

    staged:    int64 [1]  pinned: the step's number, once the staging below is written
    count:     int64 [1]  pinned: frames to publish (the first `count` staging rows)
    rows, cols, stamps:   int64 [slots] pinned: slot, ring entry, stamp of each frame
    pcm:       float32 [slots, N]  the step's audio, clipped to [-1, 32767/32768] and scaled
                                   by 32768, truncated to int16 (the host's conversion)
    tokens:    int32 [slots, K]
    ring_pcm:  int16 [S, D, N], ring_tokens: int32 [S, D, K], ring_stamps: int64 [S, D]

A program writes its frame's samples and tokens, synchronises its threads, fences at system
scope (the gateway reads the ring from the CPU) and then stores the stamp: a reader that sees
the stamp sees the payload (engine/ring.py's protocol). Off CUDA (Triton's interpreter, the
CPU tests) the fence compiles away.
"""

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor

__all__ = ["publish_frames"]


@triton.jit(do_not_specialize=["value"])  # type: ignore[untyped-decorator,unused-ignore]
def _publish_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    staged_ptr,
    count_ptr,
    rows_ptr,
    cols_ptr,
    stamps_ptr,
    pcm_ptr,
    tokens_ptr,
    ring_pcm_ptr,
    ring_tokens_ptr,
    ring_stamps_ptr,
    value,
    depth,
    samples: tl.constexpr,
    tokens: tl.constexpr,
    block_samples: tl.constexpr,
    block_tokens: tl.constexpr,
    fence: tl.constexpr,
):
    while tl.load(staged_ptr, volatile=True) < value:
        pass
    frame = tl.program_id(0)
    if frame < tl.load(count_ptr, volatile=True):
        row = tl.load(rows_ptr + frame, volatile=True)
        entry = row * depth + tl.load(cols_ptr + frame, volatile=True)
        at = tl.arange(0, block_samples)
        inside = at < samples
        pcm = tl.load(pcm_ptr + row * samples + at, mask=inside, other=0.0)
        pcm = tl.minimum(tl.maximum(pcm, -1.0), 32767.0 / 32768.0) * 32768.0
        tl.store(ring_pcm_ptr + entry * samples + at, pcm.to(tl.int16), mask=inside)
        which = tl.arange(0, block_tokens)
        given = which < tokens
        token = tl.load(tokens_ptr + row * tokens + which, mask=given)
        tl.store(ring_tokens_ptr + entry * tokens + which, token, mask=given)
        tl.debug_barrier()  # every thread's payload stores before the stamp
        if fence:
            tl.inline_asm_elementwise(
                "fence.sc.sys; mov.u32 $0, $1;",
                "=r,r",
                [frame],
                dtype=tl.int32,
                is_pure=False,
                pack=1,
            )
        tl.store(ring_stamps_ptr + entry, tl.load(stamps_ptr + frame, volatile=True))


def publish_frames(
    staging: tuple[Tensor, Tensor, Tensor, Tensor, Tensor],
    value: int,
    pcm: Tensor,
    tokens: Tensor,
    ring: tuple[Tensor, Tensor, Tensor],
) -> None:
    """Queue on the current stream the publication of the staged frames (module docstring)
    once `staging`'s word (staged, count, rows, cols, stamps) holds at least `value`; `ring`
    is (pcm, tokens, stamps), the downlink's views in registered host memory (or, off CUDA,
    any CPU tensors)."""
    staged, count, rows, cols, stamps = staging
    ring_pcm, ring_tokens, ring_stamps = ring
    slots, samples = pcm.shape
    depth = ring_stamps.shape[1]
    assert pcm.dtype == torch.float32, pcm.dtype
    assert tokens.dtype == torch.int32, tokens.dtype
    assert pcm.is_contiguous(), f"pcm must be contiguous, strides {pcm.stride()}"
    assert tokens.is_contiguous(), f"tokens must be contiguous, strides {tokens.stride()}"
    assert tokens.shape[0] == slots, (tokens.shape, pcm.shape)
    assert ring_pcm.shape == (slots, depth, samples), (ring_pcm.shape, pcm.shape)
    assert ring_tokens.shape == (slots, depth, tokens.shape[1]), (ring_tokens.shape, tokens.shape)
    assert ring_pcm.dtype == torch.int16, ring_pcm.dtype
    assert ring_tokens.dtype == torch.int32, ring_tokens.dtype
    assert ring_stamps.dtype == torch.int64, ring_stamps.dtype
    for word in (staged, count):
        assert word.dtype == torch.int64, word.dtype
        assert word.numel() == 1, word.shape
    for column in (rows, cols, stamps):
        assert column.dtype == torch.int64, column.dtype
        assert column.shape == (slots,), column.shape
    _publish_kernel[(slots,)](
        staged,
        count,
        rows,
        cols,
        stamps,
        pcm,
        tokens,
        ring_pcm,
        ring_tokens,
        ring_stamps,
        value,
        depth,
        samples=samples,
        tokens=tokens.shape[1],
        block_samples=triton.next_power_of_2(samples),
        block_tokens=triton.next_power_of_2(tokens.shape[1]),
        fence=pcm.is_cuda,
        num_warps=4,
    )
