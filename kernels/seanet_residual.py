"""The end of a SEANet residual block in one launch: the ELU, the 1x1 convolution with its
bias, and the skip connection.

A residual block (engine/models/moshi/mimi/seanet.py, ResnetBlock) is x + conv1x1(ELU(
conv_k(ELU(x)))). Its last three ops, an ELU, cuDNN's 1x1 convolution and the add, are three
launches of a few KiB at one call (torch's elementwise kernels advance the captured tick by
~2 us each, bench/results/tick_kernels_1_9a47cab.json), and at hundreds of calls each of
them reads and writes a whole activation. Here, time-major (channels last) as the codec
keeps its activations on CUDA, every row a (slot, frame):

    h:       [slots, T, hidden]   the inner convolution's output
    x:       [slots, T, dim]      the block's input
    weight:  [dim, hidden]        the 1x1 convolution's, bias: [dim]
    out[s, t, n] = x[s, t, n] + (sum_k elu(h[s, t, k]) * weight[n, k] + bias[n])
    and, where the decoder's ELU follows the block (before a transposed convolution), that
    ELU of out too (SeanetStack hands it over): one launch more saved

rounded as the torch ops round (the convolution's output with its bias, then the add), the
products and sums in fp32 on the CUDA cores (`tl.dot`'s "ieee" precision), where cuDNN's
convolution runs in TF32 on CUDA: the output differs from the torch ops by TF32's rounding,
not by more (tests/kernels/test_mimi_glue.py: against fp32 torch ops within 1e-5 in the
interpreter). A program computes BLOCK_M rows (at most the frames, rounded up to a power of
two) by BLOCK_N output channels, over the hidden width BLOCK_K at a time.

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
from kernels.seanet_window import activated, rows_of_channels

MAX_BLOCK_M = 64  # rows (frames) a program
BLOCK_N = 32  # output channels a program
BLOCK_K = 32  # hidden channels an iteration


def residual_conv_reference(
    x: Tensor, h: Tensor, weight: Tensor, bias: Tensor, activate_output: bool = False
) -> Tensor:
    """x [slots, T, dim], h [slots, T, hidden], weight [dim, hidden], bias [dim] -> out
    [slots, T, dim] in torch ops (the codec's: ELU, the 1x1 convolution, the add; the ELU
    after it if `activate_output`)."""
    update = torch.nn.functional.linear(torch.nn.functional.elu(h), weight, bias)
    out = x + update
    return torch.nn.functional.elu(out) if activate_output else out


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _residual_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    x_ptr,
    h_ptr,
    weight_ptr,
    bias_ptr,
    out_ptr,
    frames,
    hidden,
    dim,
    stride_x,
    stride_h,
    compiled: tl.constexpr,
    activate_output: tl.constexpr,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
    pdl: tl.constexpr,
):
    slot = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * block_m + tl.arange(0, block_m)
    cols = tl.program_id(2) * block_n + tl.arange(0, block_n)
    rows_in = rows < frames
    cols_in = cols < dim
    bias = tl.load(bias_ptr + cols, mask=cols_in, other=0.0)  # a weight: before the wait
    wait_for_inputs(pdl)
    h_rows = h_ptr + slot * stride_h
    acc = tl.zeros([block_m, block_n], tl.float32)
    for start in range(0, hidden, block_k):
        ks = start + tl.arange(0, block_k)
        ks_in = ks < hidden
        h = tl.load(h_rows + rows[:, None] * hidden + ks[None, :],
                    mask=rows_in[:, None] & ks_in[None, :], other=0.0)  # fmt: skip
        w = tl.load(weight_ptr + cols[None, :] * hidden + ks[:, None],
                    mask=ks_in[:, None] & cols_in[None, :], other=0.0)  # fmt: skip
        acc = tl.dot(activated(h, True, compiled), w, acc, input_precision="ieee")
    inside = rows_in[:, None] & cols_in[None, :]
    at = rows[:, None] * dim + cols[None, :]
    x = tl.load(x_ptr + slot * stride_x + at, mask=inside, other=0.0)
    out = activated(x + (acc + bias[None, :]), activate_output, compiled)
    tl.store(out_ptr + slot * frames * dim + at, out, mask=inside)


def residual_conv(
    x: Tensor, h: Tensor, weight: Tensor, bias: Tensor, activate_output: bool = False
) -> Tensor:
    """x: fp32 [slots, T, dim], h: fp32 [slots, T, hidden], both rows of unit-stride channels
    (a slot's rows may sit farther apart); weight: fp32 [dim, hidden] contiguous; bias: fp32
    [dim] -> out fp32 [slots, T, dim] contiguous (module docstring), through an ELU if
    `activate_output` (the decoder's ELU after a block, before a transposed convolution)."""
    slots, frames, dim = x.shape
    hidden = h.shape[2]
    assert h.shape[:2] == (slots, frames), (tuple(h.shape), tuple(x.shape))
    assert weight.shape == (dim, hidden), (tuple(weight.shape), dim, hidden)
    assert bias.shape == (dim,), tuple(bias.shape)
    for t in (x, h, weight, bias):
        assert t.dtype == torch.float32, t.dtype
        assert t.device == x.device, "tensors on one device"
    assert weight.is_contiguous(), f"weight strides {weight.stride()}"
    rows_of_channels(x, "x")
    rows_of_channels(h, "h")
    out = torch.empty(slots, frames, dim, device=x.device)
    block_m = min(MAX_BLOCK_M, max(16, triton.next_power_of_2(frames)))
    grid = (slots, triton.cdiv(frames, block_m), triton.cdiv(dim, BLOCK_N))
    pdl = dependent(x, "seanet_residual")
    _residual_kernel[grid](
        x,
        h,
        weight,
        bias,
        out,
        frames,
        hidden,
        dim,
        x.stride(0),
        h.stride(0),
        compiled=x.is_cuda,
        activate_output=activate_output,
        block_m=block_m,
        block_n=BLOCK_N,
        block_k=BLOCK_K,
        pdl=pdl,
        launch_pdl=pdl,
        num_warps=4,
    )
    return out
