"""Residual vector quantisation steps of Mimi's RVQ, one kernel each (fp32).

Eager, each codebook costs ~12 launches on CUDA (`torch.cdist` builds padded copies of both
operands, multiplies, clamps and takes a square root; then argmin, embedding, subtract), and
decoding ~2 per codebook. Here the distances up to a per-row constant come from one GEMM
with the codebook norms in its epilogue (`torch.addmm(norms, residual, codebook.T,
alpha=-2)`: |c|^2 - 2 r.c orders the codewords as |r - c| does), and one kernel finishes the
step:

- `assign_nearest`: per row, the first index of the smallest score (torch's argmin rule) is
  stored into its column of the codes, and the chosen codeword is subtracted from the row's
  residual in place.

      scores:   fp32 [rows, bins]   codebook: fp32 [bins, dim]   residual: fp32 [rows, dim]
      codes:    int64 [rows, codebooks] (column `index` written)

- `codebook_sum`: per row, the sum of the codewords a run of its codes picks, added in
  codebook order (as the eager decode adds them), so it is bit-identical to the eager sum.

      codes: int64 [rows, columns], codebooks: fp32 [K, bins, dim] -> fp32 [rows, dim]

The distance differs from cdist's in rounding only (cdist adds |r|^2 before a clamp and a
square root, which can merge near ties); tests/kernels/test_mimi_codec.py measures how often
codes differ. Launchers assert shapes and dtypes and never read device values on the host.
"""

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor
from torch.nn import functional

from kernels.dependent_launch import dependent, wait_for_inputs


def assign_nearest_reference(
    scores: Tensor, codebook: Tensor, residual: Tensor, codes: Tensor, index: int
) -> None:
    chosen = scores.argmin(dim=-1)
    codes[:, index] = chosen
    residual -= functional.embedding(chosen, codebook)


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _assign_nearest_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    scores_ptr,
    codebook_ptr,
    residual_ptr,
    codes_ptr,
    bins,
    dim,
    codebooks,
    index,
    block_bins: tl.constexpr,
    block_dim: tl.constexpr,
    pdl: tl.constexpr,
):
    wait_for_inputs(pdl)
    row = tl.program_id(0).to(tl.int64)
    bin_ids = tl.arange(0, block_bins)
    scores = tl.load(scores_ptr + row * bins + bin_ids, mask=bin_ids < bins, other=float("inf"))
    chosen = tl.argmin(scores, axis=0, tie_break_left=True)
    tl.store(codes_ptr + row * codebooks + index, chosen.to(tl.int64))
    cols = tl.arange(0, block_dim)
    inside = cols < dim
    codeword = tl.load(codebook_ptr + chosen.to(tl.int64) * dim + cols, mask=inside, other=0.0)
    residual = tl.load(residual_ptr + row * dim + cols, mask=inside, other=0.0)
    tl.store(residual_ptr + row * dim + cols, residual - codeword, mask=inside)


def assign_nearest(
    scores: Tensor, codebook: Tensor, residual: Tensor, codes: Tensor, index: int
) -> None:
    """codes[:, index] = argmin of scores per row; residual -= the chosen codewords."""
    rows, bins = scores.shape
    dim = codebook.shape[1]
    assert codebook.shape == (bins, dim), (codebook.shape, scores.shape)
    assert residual.shape == (rows, dim), (residual.shape, rows, dim)
    assert codes.dim() == 2, codes.shape
    assert codes.shape[0] == rows, (codes.shape, rows)
    assert 0 <= index < codes.shape[1], (index, codes.shape)
    assert codes.dtype == torch.int64, codes.dtype
    assert codes.is_contiguous(), codes.stride()
    for tensor in (scores, codebook, residual):
        assert tensor.dtype == torch.float32, tensor.dtype
        assert tensor.is_contiguous(), "scores, codebook and residual must be contiguous"
        assert tensor.device == codes.device, "tensors on one device"
    pdl = dependent(codes, "mimi_rvq")
    _assign_nearest_kernel[(rows,)](
        scores,
        codebook,
        residual,
        codes,
        bins,
        dim,
        codes.shape[1],
        index,
        block_bins=triton.next_power_of_2(bins),
        block_dim=triton.next_power_of_2(dim),
        num_warps=8,
        pdl=pdl,
        launch_pdl=pdl,
    )


def codebook_sum_reference(codes: Tensor, first: int, codebooks: Tensor) -> Tensor:
    total = functional.embedding(codes[:, first], codebooks[0])
    for k in range(1, codebooks.shape[0]):
        total = total + functional.embedding(codes[:, first + k], codebooks[k])
    return total


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _codebook_sum_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    codes_ptr,
    codebooks_ptr,
    out_ptr,
    bins,
    dim,
    columns,
    first,
    codebooks: tl.constexpr,
    block_dim: tl.constexpr,
    pdl: tl.constexpr,
):
    wait_for_inputs(pdl)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, block_dim)
    inside = cols < dim
    total = tl.zeros((block_dim,), tl.float32)
    for k in tl.static_range(codebooks):
        code = tl.load(codes_ptr + row * columns + first + k)
        entry = (k * bins + code) * dim
        total += tl.load(codebooks_ptr + entry + cols, mask=inside, other=0.0)
    tl.store(out_ptr + row * dim + cols, total, mask=inside)


def codebook_sum(codes: Tensor, first: int, codebooks: Tensor) -> Tensor:
    """codes: int64 [rows, columns] in [0, bins); codebooks: fp32 [K, bins, dim] picked by
    columns first..first+K-1 -> fp32 [rows, dim]."""
    rows, columns = codes.shape
    count, bins, dim = codebooks.shape
    assert 0 <= first <= columns - count, (first, codebooks.shape, codes.shape)
    assert codes.dtype == torch.int64, codes.dtype
    assert codes.is_contiguous(), codes.stride()
    assert codebooks.dtype == torch.float32, codebooks.dtype
    assert codebooks.is_contiguous(), codebooks.stride()
    assert codes.device == codebooks.device, "tensors on one device"
    out = torch.empty(rows, dim, device=codes.device, dtype=torch.float32)
    pdl = dependent(codes, "mimi_rvq")
    _codebook_sum_kernel[(rows,)](
        codes,
        codebooks,
        out,
        bins,
        dim,
        columns,
        first,
        codebooks=count,
        block_dim=triton.next_power_of_2(dim),
        num_warps=2,
        pdl=pdl,
        launch_pdl=pdl,
    )
    return out
