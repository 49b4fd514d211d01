"""Mimi's RVQ kernels against their torch references (interpreted on CPU, compiled on a GPU)."""

import pytest

pytest.importorskip("torch")

import torch

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

from kernels.mimi_rvq import (
    assign_nearest,
    assign_nearest_reference,
    codebook_sum,
    codebook_sum_reference,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize(("bins", "dim"), [(64, 8), (2048, 256), (100, 24)])
def test_assign_nearest_matches_reference(bins: int, dim: int) -> None:
    generator = torch.Generator().manual_seed(bins)
    rows, columns, index = 5, 3, 1
    codebook = torch.randn(bins, dim, generator=generator).to(DEVICE)
    residual = torch.randn(rows, dim, generator=generator).to(DEVICE)
    scores = torch.randn(rows, bins, generator=generator).to(DEVICE)
    scores[0, 7] = scores[0, 3] = scores[0].min() - 1  # a tie: the first index wins
    codes = torch.full((rows, columns), -1, dtype=torch.long, device=DEVICE)
    want_residual, want_codes = residual.clone(), codes.clone()
    assign_nearest_reference(scores, codebook, want_residual, want_codes, index)
    assign_nearest(scores, codebook, residual, codes, index)
    assert int(codes[0, index]) == 3
    assert torch.equal(codes, want_codes)
    assert torch.equal(residual, want_residual)


def test_codebook_sum_is_the_eager_sum() -> None:
    generator = torch.Generator().manual_seed(0)
    rows, columns, first, count, bins, dim = 4, 8, 1, 7, 64, 24
    codebooks = torch.randn(count, bins, dim, generator=generator).to(DEVICE)
    codes = torch.randint(0, bins, (rows, columns), generator=generator).to(DEVICE)
    got = codebook_sum(codes, first, codebooks)
    assert torch.equal(got, codebook_sum_reference(codes, first, codebooks))
