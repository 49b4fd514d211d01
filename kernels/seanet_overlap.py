"""A streaming transposed convolution's overlap-add in one launch: this frame's taps, the
share the last frame owed it, the bias, and the share this frame owes the next.

Mimi's transposed convolutions have kernel 2 * stride (engine/models/moshi/mimi/seanet.py,
StreamingConvTranspose1d): each input frame t gives 2 * stride taps per channel, the first
stride of them land on output frames t * stride + r, the second stride on the next input
frame's. Time-major (channels last), as the codec keeps its activations on CUDA:

    taps:     [slots, T, 2 * stride, C]      the GEMM's output (x @ weight), or, channel-wise
              (groups = C), x[s, t, c] * weight[c, j] computed here from
    x:        [slots, T, C]  and  weight: [C, 2 * stride] (its memory order)
    partial:  [slots, stride, C]             what the last frame owed this one
    out[s, t * stride + r, c] = (owed + taps[s, t, r, c]) + bias[c]
              owed = taps[s, t - 1, stride + r, c], or partial[s, r, c] at t = 0
    partial <- taps[s, T - 1, stride:, c]

The sums are rounded as the torch ops round them (the concatenation of the owed shares, an
in-place add of the taps, then of the bias; the channel-wise product rounded before the add:
the launch keeps the compiler from contracting it into a fused multiply-add), so the output
is the torch ops' (engine/models/moshi/mimi/seanet.py's overlap_add) bit for bit. In torch
ops those are a concatenation, two adds and a copy of the new partial (and the channel-wise
product): four launches of a few KiB at one call, ~2 us each in the captured tick (torch's
elementwise kernels' advance there, bench/results/tick_kernels_1_9a47cab.json). A program
writes BLOCK_ROWS output frames of BLOCK_C channels; the programs of row block 0 also read
the old partial (for t = 0) and, after every thread has read it, write the new one, so each
slot and channel block's partial is read and written by one program only.

Served on CUDA with the other glue kernels (MimiCodec.use_glue_kernels; the engine's
ModelOptions, off with --no-mimi-glue-kernels): on an H100 they took 51 us off the 1-call
step's p50, three pairs alternated on the 80 ms clock (docs/gpu-log.md, 2026-12-07); compiled
tests pass there.
"""

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor

from kernels.dependent_launch import dependent, wait_for_inputs
from kernels.seanet_window import rows_of_channels

BLOCK_ROWS = 64  # output frames a program (at least the largest stride, 8 in Mimi)
BLOCK_C = 64  # channels a program


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _tap(  # type: ignore[no-untyped-def,unused-ignore]
    taps_rows,
    x_rows,
    weight_ptr,
    frame,
    tap,
    cols,
    inside,
    channels,
    stride,
    channelwise: tl.constexpr,
):
    """taps[frame, tap, cols] of one slot, [rows, block_c]: loaded, or x * weight."""
    if channelwise:
        x = tl.load(x_rows + frame[:, None] * channels + cols[None, :], mask=inside, other=0.0)
        w = tl.load(weight_ptr + cols[None, :] * (2 * stride) + tap[:, None], mask=inside,
                    other=0.0)  # fmt: skip
        return x * w
    at = (frame[:, None] * (2 * stride) + tap[:, None]) * channels + cols[None, :]
    return tl.load(taps_rows + at, mask=inside, other=0.0)


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _overlap_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    taps_ptr,
    x_ptr,
    weight_ptr,
    partial_ptr,
    bias_ptr,
    out_ptr,
    frames,
    stride,
    channels,
    stride_x,
    stride_partial,
    channelwise: tl.constexpr,
    has_bias: tl.constexpr,
    block_rows: tl.constexpr,
    block_c: tl.constexpr,
    block_s: tl.constexpr,
    pdl: tl.constexpr,
):
    wait_for_inputs(pdl)
    slot = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * block_rows + tl.arange(0, block_rows)  # output frames
    cols = tl.program_id(2) * block_c + tl.arange(0, block_c)
    cols_in = cols < channels
    inside = (rows < frames * stride)[:, None] & cols_in[None, :]
    frame = rows // stride
    phase = rows % stride
    taps_rows = taps_ptr + slot * frames * 2 * stride * channels
    x_rows = x_ptr + slot * stride_x
    partial_rows = partial_ptr + slot * stride_partial
    now = _tap(taps_rows, x_rows, weight_ptr, frame, phase, cols, inside, channels, stride,
               channelwise)  # fmt: skip
    later = inside & (frame > 0)[:, None]
    owed = _tap(taps_rows, x_rows, weight_ptr, frame - 1, stride + phase, cols, later,
                channels, stride, channelwise)  # fmt: skip
    if tl.program_id(1) == 0:
        first = inside & (frame == 0)[:, None]
        kept = tl.load(partial_rows + phase[:, None] * channels + cols[None, :], mask=first,
                       other=0.0)  # fmt: skip
        owed = tl.where(first, kept, owed)
    out = owed + now
    if has_bias:
        out += tl.load(bias_ptr + cols, mask=cols_in, other=0.0)[None, :]
    out_rows = out_ptr + slot * frames * stride * channels
    tl.store(out_rows + rows[:, None] * channels + cols[None, :], out, mask=inside)
    if tl.program_id(1) == 0:
        # every thread has read the old partial before any overwrites it
        tl.debug_barrier()
        share = tl.arange(0, block_s)
        tail = (share < stride)[:, None] & cols_in[None, :]
        last = tl.zeros([block_s], tl.int32) + frames - 1
        new = _tap(taps_rows, x_rows, weight_ptr, last, stride + share, cols, tail, channels,
                   stride, channelwise)  # fmt: skip
        tl.store(partial_rows + share[:, None] * channels + cols[None, :], new, mask=tail)


def _check_partial(partial: Tensor, slots: int, stride: int, channels: int) -> None:
    assert partial.shape == (slots, stride, channels), (tuple(partial.shape), stride, channels)
    rows_of_channels(partial, "partial")
    assert partial.dtype == torch.float32, partial.dtype


def _launch(
    taps: Tensor | None,
    x: Tensor | None,
    weight: Tensor | None,
    partial: Tensor,
    bias: Tensor | None,
    frames: int,
    stride: int,
) -> Tensor:
    slots, _, channels = partial.shape
    first = taps if taps is not None else x
    assert first is not None
    assert stride <= BLOCK_ROWS, f"stride {stride} over a program's {BLOCK_ROWS} frames"
    assert first.device == partial.device, "tensors on one device"
    if bias is not None:
        assert bias.shape == (channels,), tuple(bias.shape)
        assert bias.dtype == torch.float32, bias.dtype
    out = torch.empty(slots, frames * stride, channels, device=partial.device)
    grid = (slots, triton.cdiv(frames * stride, BLOCK_ROWS), triton.cdiv(channels, BLOCK_C))
    pdl = dependent(first, "seanet_overlap")
    _overlap_kernel[grid](
        taps if taps is not None else out,  # unused channel-wise
        x if x is not None else out,  # unused with taps
        weight if weight is not None else out,
        partial,
        bias if bias is not None else out,
        out,
        frames,
        stride,
        channels,
        x.stride(0) if x is not None else 0,
        partial.stride(0),
        channelwise=taps is None,
        has_bias=bias is not None,
        block_rows=BLOCK_ROWS,
        block_c=BLOCK_C,
        block_s=triton.next_power_of_2(stride),
        pdl=pdl,
        launch_pdl=pdl,
        enable_fp_fusion=False,  # the channel-wise product rounded, as torch's
        num_warps=4,
    )
    return out


def overlap_add(taps: Tensor, partial: Tensor, bias: Tensor | None) -> Tensor:
    """taps: fp32 [slots, T, 2 * stride, C] contiguous; partial: fp32 [slots, stride, C],
    unit-stride rows of channels (a view of a wider per-slot buffer is fine), replaced ->
    out fp32 [slots, T * stride, C] (module docstring)."""
    slots, frames, kernel, channels = taps.shape
    assert taps.is_contiguous(), f"taps strides {taps.stride()}"
    assert taps.dtype == torch.float32, taps.dtype
    assert kernel % 2 == 0, f"{kernel} taps: twice the stride"
    _check_partial(partial, slots, kernel // 2, channels)
    return _launch(taps, None, None, partial, bias, frames, kernel // 2)


def channelwise_overlap_add(
    x: Tensor, weight: Tensor, partial: Tensor, bias: Tensor | None
) -> Tensor:
    """The channel-wise transposed convolution (groups = C) whole: x fp32 [slots, T, C],
    unit-stride rows; weight fp32 [C, 2 * stride] contiguous; partial as overlap_add's ->
    out fp32 [slots, T * stride, C], its taps x[s, t, c] * weight[c, j]."""
    slots, frames, channels = x.shape
    rows_of_channels(x, "x")
    assert x.dtype == weight.dtype == torch.float32, (x.dtype, weight.dtype)
    assert weight.is_contiguous(), f"weight strides {weight.stride()}"
    assert weight.shape[0] == channels, tuple(weight.shape)
    kernel = weight.shape[1]
    assert kernel % 2 == 0, f"{kernel} taps: twice the stride"
    _check_partial(partial, slots, kernel // 2, channels)
    return _launch(None, x, weight, partial, bias, frames, kernel // 2)
