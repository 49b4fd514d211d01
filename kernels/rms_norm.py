"""RMSNorm in fp32, with an optional residual add in front, as one launch.

Every transformer layer of Moshi normalises its input twice (RMSNorm, eps 1e-8, computed in
fp32 and returned in the model dtype, as Kyutai's `rms_norm_f32`), and the second norm reads
the sum of the layer input and the attention output. In torch that is ~9 elementwise and
reduction kernels per norm plus one for the add; here it is one program per row:

    x, residual:  [..., dim]   any row layout with unit-stride rows (e.g. a column slice)
    alpha:        [dim] values ([1, 1, dim] as in the checkpoint), any float dtype
    total = x + residual              rounded to x's dtype, as torch's bf16 add does
    normed = total * (alpha * rsqrt(eps + mean(total^2)))   in fp32, rounded to x's dtype

The rounding of `total` before the norm and the order of the products follow the torch
reference, so bf16 outputs agree with it except for the rare value within one unit in the
last place (the fp32 sum of squares is reduced in another order, rsqrt is the hardware's).

Predicted before measuring (H200, bf16, CUDA graph): ~2.5 us per launch at 1 and 128 slots
(a 4096-wide row is 8 KB; 128 rows 1 MB, far below what a launch costs), against ~9 launches
of ~2.5 us for the torch ops; the temporal stage at 1 slot loses ~19 launches per layer with the
gate and the residual GEMM below (2544 -> ~1930 kernels, 9.45 -> ~7.9 ms).

Measured on one H200 (torch 2.11, triton 3.6; `python bench/kernels_layer.py --slots 1,128`,
bench/results/kernels_layer.json), bf16, dim 4096, per call inside a CUDA graph: rms_norm
1.84 us at 1 slot and 2.67 us at 128 (torch's 9 ops: 14.5 and 26.7 us); add_rms_norm 2.75
and 2.84 us (torch's 10 ops: 20.6 and 28.8 us). With the gate kernel and the residual GEMM,
the temporal stage (bench/engine_stages.py, bench/results/engine_stages_layer_kernels.json)
went from 2544 to 1928 kernels and 9.45 to 7.87 ms at 1 slot, 33.0 to 31.7 ms at 128 slots
(the same tree with `fused` off, in the same run: 9.78 -> 7.89 ms, 33.7 -> 31.3 ms).
"""

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor

from kernels.dependent_launch import dependent, wait_for_inputs

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def rms_norm_reference(x: Tensor, alpha: Tensor, eps: float) -> Tensor:
    """Kyutai's `rms_norm_f32`: the norm in fp32, returned in x's dtype."""
    x_f32 = x.float()
    var = eps + torch.mean(x_f32**2, dim=-1, keepdim=True)
    return (x_f32 * (alpha.to(var) * torch.rsqrt(var))).to(x.dtype)


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _rms_norm_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    x_ptr,
    residual_ptr,
    alpha_ptr,
    total_ptr,
    normed_ptr,
    stride_x_row,
    stride_residual_row,
    dim,
    eps,
    block: tl.constexpr,
    has_residual: tl.constexpr,
    pdl: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, block)
    inside = cols < dim
    # the gain is a weight (never written in a tick): loaded before the wait
    alpha = tl.load(alpha_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    wait_for_inputs(pdl)
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=inside, other=0.0)
    if has_residual:
        residual = tl.load(residual_ptr + row * stride_residual_row + cols, mask=inside, other=0.0)
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(x.dtype)
        tl.store(total_ptr + row * dim + cols, x, mask=inside)
    x_f32 = x.to(tl.float32)
    var = eps + tl.sum(x_f32 * x_f32, axis=0) / dim
    normed = x_f32 * (alpha * tl.rsqrt(var))
    tl.store(normed_ptr + row * dim + cols, normed.to(x.dtype), mask=inside)


def _rows(x: Tensor, dim: int) -> Tensor:
    """[..., dim] as [rows, dim] without a copy: rows must be unit-stride and evenly spaced."""
    assert x.shape[-1] == dim, (x.shape, dim)
    assert x.stride(-1) == 1, f"rows must be unit-stride, strides {x.stride()}"
    return x.view(-1, dim)


def _launch(x: Tensor, residual: Tensor | None, alpha: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    dim = x.shape[-1]
    assert x.dtype in FLOAT_DTYPES, x.dtype
    assert alpha.numel() == dim, (alpha.shape, dim)
    assert alpha.is_contiguous(), "alpha must be contiguous"
    assert alpha.device == x.device, "tensors on one device"
    rows = _rows(x, dim)
    normed = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    total = normed
    residual_rows = rows
    if residual is not None:
        assert residual.shape == x.shape, (residual.shape, x.shape)
        assert residual.dtype == x.dtype, (residual.dtype, x.dtype)
        assert residual.device == x.device, "tensors on one device"
        residual_rows = _rows(residual, dim)
        total = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    block = triton.next_power_of_2(dim)
    pdl = dependent(x, "rms_norm")
    _rms_norm_kernel[(rows.shape[0],)](
        rows,
        residual_rows,
        alpha,
        total,
        normed,
        rows.stride(0),
        residual_rows.stride(0),
        dim,
        eps,
        block=block,
        has_residual=residual is not None,
        # 16-byte loads of bf16 at dim 4096 with 8 warps; fewer warps for narrow rows
        num_warps=max(1, min(16, block // 512)),
        pdl=pdl,
        launch_pdl=pdl,
    )
    return total, normed


def rms_norm(x: Tensor, alpha: Tensor, eps: float) -> Tensor:
    """x: [..., dim] -> RMSNorm(x) in x's dtype (module docstring), one launch."""
    return _launch(x, None, alpha, eps)[1]


def add_rms_norm(x: Tensor, residual: Tensor, alpha: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """x, residual: [..., dim] -> (x + residual, RMSNorm(x + residual)), both in x's dtype,
    one launch."""
    return _launch(x, residual, alpha, eps)
