"""A SEANet causal convolution for every slot in one launch: the ELU in front of it, the
window over the previous frame's tail, the bias and the residual add behind it, and the
update of that tail.

    x:         [slots, c_in, frames]          fp32, any strides (time-major or time-last)
    weight:    [c_out, c_in, taps]            fp32, any strides
    state:     [slots, 2, history, c_in]      fp32, each slot's contiguous: the tail, twice
    phase:     int32 [1]                      the half this frame reads (StatePool flips it)
    residual:  [slots, c_out, frames / step]  as out (optional)
    out:       [slots, c_out, frames / step]  fp32, x's layout

    window = state[:, phase] ++ act(x) along time      act = ELU (alpha 1) or identity
    out[s, o, t] = bias[o] + sum_{c, j} weight[o, c, j] * window[s, t * step + j * dilation, c]
                   (+ residual[s, o, t])
    state[:, 1 - phase] = window[:, frames:]           the last `history` rows

with history = (taps - 1) * dilation + 1 - step. The tail is written into the other half, not
in place: every program reads the tail of the slots it covers and another program writing it
could not know when they are done. The next frame reads that half after the flip (one launch
per codec direction and tick, seanet.StatePool.flip). Torch runs the same convolution as up to
five launches (ELU, concatenation, state copy, convolution, residual add: seanet.py's
StreamingConv1d and ResnetBlock), each a pass over the activations.

The product is an implicit GEMM: rows are (slot, output frame) pairs, a slot's frames padded
to a power of two below BLOCK_M (so a tile holds whole slots and a weight tile serves all of
them) or to a multiple of it; columns are output channels; the reduction walks the taps and
blocks of input channels, each tap's input tile gathered from the state or x row by row.
On the tensor cores in TF32 where `tf32` (the codec follows torch.backends.cudnn.allow_tf32:
this replaces cuDNN's convolutions), else in full fp32.
"""

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor
from torch.nn import functional

from kernels.dependent_launch import dependent, wait_for_inputs

# the program, read at each launch so that a bench can sweep it
BLOCK_M = 64  # (slot, output frame) rows of a tile
MAX_BLOCK_O = 64  # output channels of a tile (fewer when c_out is smaller, at least 16)
MAX_BLOCK_C = 32  # input channels per reduction step (likewise)
NUM_WARPS = 4
NUM_STAGES = 2
# below this many row tiles, 16 output channels a tile and up to WIDE_BLOCK_C input channels a
# step (see the launcher)
SMALL_GRID = 8
WIDE_BLOCK_C = 128


def history_frames(taps: int, step: int, dilation: int) -> int:
    """Input frames of the previous call a causal convolution's windows reach back to."""
    return (taps - 1) * dilation + 1 - step


def streaming_conv_reference(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    tail: Tensor,
    *,
    step: int,
    dilation: int,
    elu: bool,
    residual: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(out, next tail) in torch ops; tail: [slots, c_in, history] (the activated inputs)."""
    window = torch.cat([tail, functional.elu(x) if elu else x], dim=-1)
    out = functional.conv1d(window, weight, bias, step, dilation=dilation)
    if residual is not None:
        out = residual + out
    return out, window[..., window.shape[-1] - tail.shape[-1] :]


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _elu(x):  # type: ignore[no-untyped-def,unused-ignore]
    """ELU with expm1 made accurate near 0 (u - 1 alone loses the low bits): (u - 1) x / log u,
    u = exp(x), as torch's expm1 is accurate there."""
    u = tl.exp(x)
    exact = (u == 1.0) | (u - 1.0 == -1.0)  # where u - 1 is x itself, or -1
    em1 = (u - 1.0) * x / tl.log(tl.where(exact, 0.5, u))
    em1 = tl.where(u == 1.0, x, tl.where(u - 1.0 == -1.0, -1.0, em1))
    return tl.where(x > 0.0, x, em1)


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _write_tails(  # type: ignore[no-untyped-def,unused-ignore]
    x_ptr,
    state_ptr,
    phase,
    slots,
    c_in,
    frames_in,
    history,
    rows_per_slot,
    stride_state_slot,
    stride_x_slot,
    stride_x_channel,
    stride_x_frame,
    elu: tl.constexpr,
    block_m: tl.constexpr,
    block_c: tl.constexpr,
    block_h: tl.constexpr,
):
    """The next tail of the slots whose first row is in this program's tile, into the half
    the frame did not read: window rows frames_in .. frames_in + history."""
    first = tl.program_id(0) * block_m
    owner = (first + rows_per_slot - 1) // rows_per_slot
    end = tl.minimum((first + block_m + rows_per_slot - 1) // rows_per_slot, slots)
    half = history * c_in
    kept_rows = tl.arange(0, block_h)
    position = frames_in + kept_rows
    kept_ok = kept_rows < history
    in_tail = position < history  # a frame shorter than the tail keeps part of the old one
    for owned in range(owner, end):
        base = state_ptr + owned * stride_state_slot
        for c0 in range(0, c_in, block_c):
            channels = c0 + tl.arange(0, block_c)
            channel_ok = channels < c_in
            a = tl.load(
                x_ptr
                + owned * stride_x_slot
                + (position - history)[:, None] * stride_x_frame
                + channels[None, :] * stride_x_channel,
                mask=(kept_ok & ~in_tail)[:, None] & channel_ok[None, :],
                other=0.0,
            )
            if elu:
                a = _elu(a)
            kept = tl.load(
                base + phase * half + position[:, None] * c_in + channels[None, :],
                mask=(kept_ok & in_tail)[:, None] & channel_ok[None, :],
                other=0.0,
            )
            tl.store(
                base + (1 - phase) * half + kept_rows[:, None] * c_in + channels[None, :],
                tl.where(in_tail[:, None], kept, a),
                mask=kept_ok[:, None] & channel_ok[None, :],
            )


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _streaming_conv_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    x_ptr,
    weight_ptr,
    bias_ptr,
    state_ptr,
    phase_ptr,
    residual_ptr,
    out_ptr,
    slots,
    c_in,
    c_out,
    frames_in,
    frames_out,
    history,
    rows_per_slot,
    stride_state_slot,
    stride_x_slot,
    stride_x_channel,
    stride_x_frame,
    stride_w_out,
    stride_w_in,
    stride_w_tap,
    stride_out_slot,
    stride_out_channel,
    stride_out_frame,
    taps: tl.constexpr,
    step: tl.constexpr,
    dilation: tl.constexpr,
    elu: tl.constexpr,
    has_bias: tl.constexpr,
    has_residual: tl.constexpr,
    has_state: tl.constexpr,
    block_m: tl.constexpr,
    block_o: tl.constexpr,
    block_c: tl.constexpr,
    block_h: tl.constexpr,
    precision: tl.constexpr,
    pdl: tl.constexpr,
):
    wait_for_inputs(pdl)
    rows = tl.program_id(0) * block_m + tl.arange(0, block_m)
    slot = rows // rows_per_slot
    frame = rows % rows_per_slot
    row_ok = (slot < slots) & (frame < frames_out)
    outs = tl.program_id(1) * block_o + tl.arange(0, block_o)
    out_ok = outs < c_out
    x_rows = x_ptr + slot.to(tl.int64) * stride_x_slot
    half = history * c_in
    if has_state:
        phase = tl.load(phase_ptr)
        state_rows = state_ptr + slot.to(tl.int64) * stride_state_slot + phase * half
    acc = tl.zeros((block_m, block_o), tl.float32)
    for tap in tl.static_range(taps):
        position = frame * step + tap * dilation  # window row: the tail, then x
        in_tail = position < history
        for c0 in range(0, c_in, block_c):
            channels = c0 + tl.arange(0, block_c)
            channel_ok = channels < c_in
            from_x = (row_ok & (position >= history))[:, None] & channel_ok[None, :]
            a = tl.load(
                x_rows[:, None]
                + (position - history)[:, None] * stride_x_frame
                + channels[None, :] * stride_x_channel,
                mask=from_x,
                other=0.0,
            )
            if elu:
                a = _elu(a)
            if has_state:
                from_tail = (row_ok & in_tail)[:, None] & channel_ok[None, :]
                kept = tl.load(
                    state_rows[:, None] + position[:, None] * c_in + channels[None, :],
                    mask=from_tail,
                    other=0.0,
                )
                a = tl.where(in_tail[:, None], kept, a)
            w = tl.load(
                weight_ptr
                + outs[None, :] * stride_w_out
                + channels[:, None] * stride_w_in
                + tap * stride_w_tap,
                mask=channel_ok[:, None] & out_ok[None, :],
                other=0.0,
            )
            acc += tl.dot(a, w, input_precision=precision)
    if has_bias:
        acc += tl.load(bias_ptr + outs, mask=out_ok, other=0.0)[None, :]
    out_offsets = (
        slot.to(tl.int64)[:, None] * stride_out_slot
        + outs[None, :] * stride_out_channel
        + frame[:, None] * stride_out_frame
    )
    inside = row_ok[:, None] & out_ok[None, :]
    if has_residual:
        acc += tl.load(residual_ptr + out_offsets, mask=inside, other=0.0)
    tl.store(out_ptr + out_offsets, acc, mask=inside)
    if has_state:  # noqa: SIM102 (a compile-time branch around a run-time one)
        if tl.program_id(1) == 0:
            _write_tails(
                x_ptr,
                state_ptr,
                phase,
                slots,
                c_in,
                frames_in,
                history,
                rows_per_slot,
                stride_state_slot,
                stride_x_slot,
                stride_x_channel,
                stride_x_frame,
                elu,
                block_m,
                block_c,
                block_h,
            )


def _block(size: int, largest: int) -> int:
    return max(16, min(largest, triton.next_power_of_2(size)))


def streaming_conv(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    state: Tensor | None,
    phase: Tensor | None,
    *,
    step: int,
    dilation: int,
    elu: bool,
    residual: Tensor | None = None,
    time_major: bool = False,
    tf32: bool = False,
) -> Tensor:
    """One frame of a causal convolution for all slots (module docstring); `state` and
    `phase` are None for a convolution without history (taps 1, step 1); `time_major`
    lays the output out [slots, frames, c_out] in memory under its [slots, c_out, frames]
    shape, as seanet.py's channels-last codec keeps its activations."""
    slots, c_in, frames = x.shape
    c_out, weight_in, taps = weight.shape
    history = history_frames(taps, step, dilation)
    assert x.dtype == weight.dtype == torch.float32, (x.dtype, weight.dtype)
    assert weight_in == c_in, f"weight {tuple(weight.shape)} for {c_in} input channels"
    assert history >= 0, f"taps {taps}, step {step}, dilation {dilation}: no causal window"
    assert frames % step == 0, f"{frames} frames do not divide by the step {step}"
    frames_out = frames // step
    if history > 0:
        assert state is not None, "a convolution with history needs its state"
        assert phase is not None, "a convolution with history needs the phase"
        assert state.shape == (slots, 2, history, c_in), (state.shape, x.shape, history)
        assert state.stride()[1:] == (history * c_in, c_in, 1), "a slot's state: contiguous"
        assert state.dtype == torch.float32, state.dtype
        assert phase.shape == (1,), phase.shape
        assert phase.dtype == torch.int32, phase.dtype
    if bias is not None:
        assert bias.shape == (c_out,), bias.shape
        assert bias.is_contiguous(), "the bias must be contiguous"
    if time_major:
        out = torch.empty(slots, frames_out, c_out, device=x.device).transpose(1, 2)
    else:
        out = torch.empty(slots, c_out, frames_out, device=x.device)
    if residual is not None:
        assert residual.shape == out.shape, (residual.shape, out.shape)
        assert residual.stride() == out.stride(), "the residual must be laid out as the output"
    block_m = BLOCK_M
    if frames_out < block_m:
        rows_per_slot = triton.next_power_of_2(frames_out)
    else:
        rows_per_slot = triton.cdiv(frames_out, block_m) * block_m
    row_blocks = triton.cdiv(slots * rows_per_slot, block_m)
    block_o, block_c = _block(c_out, MAX_BLOCK_O), _block(c_in, MAX_BLOCK_C)
    if row_blocks < SMALL_GRID:
        # few rows (a frame of few samples, few slots): the weight is most of what is read,
        # so narrow output tiles spread it over more programs, and wide channel steps give
        # each load more bytes
        block_o, block_c = 16, _block(c_in, WIDE_BLOCK_C)
    grid = (row_blocks, triton.cdiv(c_out, block_o))
    pdl = dependent(x, "streaming_conv")
    dummy = out  # never read: the pointer of an absent operand
    _streaming_conv_kernel[grid](
        x,
        weight,
        dummy if bias is None else bias,
        dummy if state is None or history == 0 else state,
        dummy if phase is None or history == 0 else phase,
        dummy if residual is None else residual,
        out,
        slots,
        c_in,
        c_out,
        frames,
        frames_out,
        history,
        rows_per_slot,
        0 if state is None else state.stride(0),
        *x.stride(),
        *weight.stride(),
        *out.stride(),
        taps=taps,
        step=step,
        dilation=dilation,
        elu=elu,
        has_bias=bias is not None,
        has_residual=residual is not None,
        has_state=history > 0,
        block_m=block_m,
        block_o=block_o,
        block_c=block_c,
        block_h=triton.next_power_of_2(max(history, 1)),
        precision="tf32" if tf32 and x.is_cuda else "ieee",
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
        pdl=pdl,
        launch_pdl=pdl,
    )
    return out
