"""A streaming convolution's input window in one launch: the kept tail, the frame (through the
ELU in front of the convolution when there is one) and the tail kept for the next frame.

SEANet's causal convolutions (engine/models/moshi/mimi/seanet.py) see, per slot, the last
`history` input samples of the previous frame followed by this frame. In torch ops that is an
ELU, a concatenation and a copy of the new tail: three launches of a few KiB at one call,
~2.5 us each. Here, time-major (channels last) as the codec keeps its activations on CUDA:

    previous: [slots, history, channels]   the kept tail (already through the ELU)
    x:        [slots, frames, channels]    frames >= history
    window:   [slots, history + frames, channels] = [previous | act(x)]
    previous <- act(x)[:, frames - history:]      act: ELU (alpha 1) or the identity

A program writes BLOCK_T x BLOCK_C of the window's frame part; the programs of time block 0
also copy the kept tail into the window and then overwrite it with the new one (each slot and
channel block's tail is read and written by one program only, so no program reads a tail
another has already replaced). Below zero the ELU is expm1(x), as torch's CUDA kernel computes
it (the same bits); in Triton's interpreter, which has no expm1, exp(x) - 1 (~1e-7 apart).
"""

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor
from triton.language.extra import libdevice  # type: ignore[import-not-found,import-untyped,unused-ignore]

from kernels.dependent_launch import dependent, wait_for_inputs

BLOCK_T = 64  # frames a program
BLOCK_C = 64  # channels a program


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def activated(x, activate: tl.constexpr, compiled: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
    """ELU (alpha 1) of x if `activate`, else x; `compiled`: torch's CUDA bits (expm1),
    else the interpreter's exp - 1 (kernels/seanet_residual.py takes it too)."""
    if activate and compiled:
        x = tl.where(x > 0, x, libdevice.expm1(x))  # torch's CUDA ELU: the same bits
    elif activate:
        x = tl.where(x > 0, x, tl.exp(x) - 1.0)  # the interpreter has no expm1
    return x


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _window_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    x_ptr,
    previous_ptr,
    window_ptr,
    frames,
    history,
    channels,
    stride_x,
    stride_previous,
    activate: tl.constexpr,
    compiled: tl.constexpr,
    block_t: tl.constexpr,
    block_c: tl.constexpr,
    block_h: tl.constexpr,
    pdl: tl.constexpr,
):
    wait_for_inputs(pdl)
    slot = tl.program_id(0)
    times = tl.program_id(1) * block_t + tl.arange(0, block_t)
    cols = tl.program_id(2) * block_c + tl.arange(0, block_c)
    cols_in = cols < channels
    width = history + frames
    x_rows = x_ptr + slot.to(tl.int64) * stride_x
    window_rows = window_ptr + slot.to(tl.int64) * width * channels
    inside = (times < frames)[:, None] & cols_in[None, :]
    x = tl.load(x_rows + times[:, None] * channels + cols[None, :], mask=inside, other=0.0)
    x = activated(x, activate, compiled)
    tl.store(window_rows + (history + times)[:, None] * channels + cols[None, :], x, mask=inside)
    if tl.program_id(1) == 0:
        kept = tl.arange(0, block_h)
        tail = (kept < history)[:, None] & cols_in[None, :]
        previous_rows = previous_ptr + slot.to(tl.int64) * stride_previous
        at = kept[:, None] * channels + cols[None, :]
        old = tl.load(previous_rows + at, mask=tail, other=0.0)
        tl.store(window_rows + at, old, mask=tail)
        # every thread has read the old tail before any overwrites it
        tl.debug_barrier()
        new = tl.load(x_rows + (frames - history + kept)[:, None] * channels + cols[None, :],
                      mask=tail, other=0.0)  # fmt: skip
        tl.store(previous_rows + at, activated(new, activate, compiled), mask=tail)


def conv_window_reference(x: Tensor, previous: Tensor, activate: bool) -> Tensor:
    """conv_window in torch ops (the codec's own path, seanet.StreamingConv1d): the window
    [previous | elu(x) or x]; `previous` is replaced by its last `history` frames."""
    ready = torch.nn.functional.elu(x) if activate else x
    window = torch.cat([previous, ready], dim=-1)
    previous.copy_(window[..., -previous.shape[2] :])
    return window


def _time_major(t: Tensor, name: str) -> None:
    _, channels, length = t.shape
    layout = f"{name} must be time-major (channels last), strides {t.stride()}"
    assert channels == 1 or t.stride(1) == 1, layout  # one channel: either layout is
    assert t.stride(2) == channels, layout
    assert t.stride(0) >= length * channels, layout


def rows_of_channels(t: Tensor, name: str) -> None:
    """Assert t [slots, frames, channels] is time-major: rows of unit-stride channels, one
    after the other within a slot (a slot's rows may sit farther apart)."""
    _, frames, channels = t.shape
    layout = f"{name} must be time-major (rows of unit-stride channels), strides {t.stride()}"
    assert channels == 1 or t.stride(2) == 1, layout
    assert frames == 1 or t.stride(1) == channels, layout


def conv_window(x: Tensor, previous: Tensor, activate: bool) -> Tensor:
    """x: [slots, channels, frames] and previous: [slots, channels, history], both time-major
    in memory (module docstring) -> the window [slots, channels, history + frames], time-major;
    `previous` is replaced by the window's last `history` frames. `activate`: the ELU on x."""
    slots, channels, frames = x.shape
    history = previous.shape[2]
    assert previous.shape[:2] == (slots, channels), (tuple(previous.shape), tuple(x.shape))
    assert 1 <= history <= frames, f"history {history} must be within the frame's {frames}"
    assert x.dtype == previous.dtype == torch.float32, (x.dtype, previous.dtype)
    assert x.device == previous.device, "tensors on one device"
    _time_major(x, "x")
    _time_major(previous, "previous")
    window = torch.empty(slots, history + frames, channels, device=x.device, dtype=x.dtype)
    grid = (slots, triton.cdiv(frames, BLOCK_T), triton.cdiv(channels, BLOCK_C))
    pdl = dependent(x, "seanet_window")
    _window_kernel[grid](
        x,
        previous,
        window,
        frames,
        history,
        channels,
        x.stride(0),
        previous.stride(0),
        activate=activate,
        compiled=x.is_cuda,
        block_t=BLOCK_T,
        block_c=BLOCK_C,
        block_h=triton.next_power_of_2(history),
        pdl=pdl,
        launch_pdl=pdl,
        num_warps=4,
    )
    return window.transpose(1, 2)
