"""The stream-K linear (kernels/streamed_linear.py) against fused_linear's torch reference:
every mode, grids that cut column blocks between programs in every way, counts left at zero.

Interpreter tests (no CUDA) use small shapes; GPU tests the temporal layer's 7B shapes.
"""

import os

import pytest

pytest.importorskip("torch")

import torch

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

from kernels.fused_linear import _WORKSPACES, MAX_ROWS, Tiles, fused_linear_reference
from kernels.streamed_linear import DEFAULT_TILES, streamed_linear

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
EPS = 1e-8
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
SMALL = Tiles(block_n=16, block_k=16, dot=True, stages=2, programs_per_sm=1, swap=True)
# (norm, residual, gated): the temporal layer's qkv, out and down, gate/up
MODES = {
    "plain": (False, False, False),
    "norm": (True, False, False),
    "residual": (False, True, False),
    "norm_gated": (True, False, True),
    "gated": (False, False, True),
}

interpreter = pytest.mark.interpreter
gpu = pytest.mark.gpu
needs_cpu = pytest.mark.skipif(DEVICE.type == "cuda", reason="compiled tests run on CUDA")
needs_cuda = pytest.mark.skipif(DEVICE.type != "cuda", reason="needs a CUDA device")


def _randn(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=generator) * scale).to(DEVICE, dtype)


def _assert_near(got: torch.Tensor, want: torch.Tensor) -> None:
    """As test_fused_linear's: fp32 to a few ulp of the sums, 16-bit within two units of
    rounding of the largest value (eight interpreted: it truncates) and, compiled, nearly all
    equal."""
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
        return
    ulps = 8 if INTERPRETED else 2
    scale = want.float().abs().amax().clamp(min=1.0)
    apart = (got.float() - want.float()).abs()
    assert float(apart.max()) <= ulps * 2.0**-7 * float(scale), float(apart.max())
    if not INTERPRETED:
        assert float((apart > 0).float().mean()) <= 0.05, "more than 5% of values differ"


def _check(
    mode: str,
    rows: int,
    n: int,
    k: int,
    dtype: torch.dtype,
    tiles: Tiles,
    programs: int | None,
) -> None:
    norm, has_residual, gated = MODES[mode]
    x = _randn(rows, 1, k, dtype=dtype, seed=1, scale=2.0)
    weight = _randn(2 * n if gated else n, k, dtype=dtype, seed=2, scale=k**-0.5)
    alpha = _randn(k, dtype=dtype, seed=3) if norm else None
    residual = _randn(rows, 1, n, dtype=dtype, seed=5) if has_residual else None
    _, want = fused_linear_reference(
        x, weight, alpha=alpha, eps=EPS, residual=residual, gated=gated
    )
    got = streamed_linear(
        x,
        weight,
        alpha=alpha,
        eps=EPS,
        residual=residual,
        gated=gated,
        tiles=tiles,
        programs=programs,
    )
    _assert_near(got, want)
    for _, arrived in _WORKSPACES[x.device]:
        assert int(arrived.abs().sum()) == 0, "every arrival count is back at zero"


@interpreter
@needs_cpu
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_interpreted_modes_match_reference(mode: str, dtype: torch.dtype) -> None:
    # 40 columns in 3 blocks (the last short), k 72 in 5 tiles (the last short): 15 tiles on
    # 4 programs, runs of 3 and 4 that cut every block
    _check(mode, 3, 40, 72, dtype, SMALL, 4)


@interpreter
@needs_cpu
@pytest.mark.parametrize(
    "programs",
    [1, 2, 3, 7, 15, 99],
    # one program: every block whole; 15: one tile each, a block in five parts; 99 is capped
    ids=["one", "two", "three", "seven", "one_tile_each", "more_than_tiles"],
)
@pytest.mark.parametrize("mode", ["residual", "norm_gated"])
def test_interpreted_every_cut(mode: str, programs: int) -> None:
    _check(mode, 2, 40, 72, torch.float32, SMALL, programs)


@interpreter
@needs_cpu
@pytest.mark.parametrize("rows", [1, 4, MAX_ROWS])
def test_interpreted_row_counts(rows: int) -> None:
    _check("norm_gated", rows, 24, 48, torch.float32, SMALL, 5)


@interpreter
@needs_cpu
def test_refuses_bad_inputs() -> None:
    x = _randn(2, 32, dtype=torch.float32, seed=6)
    weight = _randn(16, 32, dtype=torch.float32, seed=7)
    with pytest.raises(AssertionError, match="rows"):
        streamed_linear(_randn(MAX_ROWS + 1, 32, dtype=torch.float32, seed=8), weight)
    residual = _randn(2, 8, dtype=torch.float32, seed=9)
    with pytest.raises(AssertionError, match="not combined"):
        streamed_linear(x, weight, residual=residual, gated=True)
    with pytest.raises(AssertionError, match="unit-stride"):
        streamed_linear(_randn(2, 64, dtype=torch.float32, seed=10)[:, ::2], weight)


@gpu
@needs_cuda
@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize(
    ("mode", "n", "k"),
    [
        ("plain", 3 * 4096, 4096),  # the temporal layer's qkv
        ("norm", 3 * 4096, 4096),
        ("residual", 4096, 4096),  # its out_proj
        ("norm_gated", 11264, 4096),  # gate/up
        ("gated", 11264, 4096),
        ("residual", 4096, 11264),  # its down projection
    ],
)
def test_seven_b_shapes_bf16(mode: str, n: int, k: int, rows: int) -> None:
    _check(mode, rows, n, k, torch.bfloat16, DEFAULT_TILES, None)


@gpu
@needs_cuda
@pytest.mark.parametrize("programs", [1, 7, 132, 264, 1000])
@pytest.mark.parametrize("mode", ["residual", "norm_gated"])
def test_compiled_every_cut(mode: str, programs: int) -> None:
    tiles = Tiles(64, 64, True, stages=4, programs_per_sm=1, swap=True)
    _check(mode, 3, 1000, 1000, torch.float32, tiles, programs)
    _check(mode, 3, 1000, 1000, torch.bfloat16, tiles, programs)
