"""The few-rows linear (kernels/fused_linear.py) against its torch reference, in every
prologue and epilogue, on the tensor cores and on the CUDA cores.

Interpreter tests (no CUDA) use small shapes; GPU tests the Moshi 7B shapes, compiled.
"""

import os

import pytest

pytest.importorskip("torch")

import torch
from torch.nn import functional

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

from kernels.fused_linear import (
    _WORKSPACES,
    MAX_ROWS,
    Tiles,
    add_fused_linear,
    fused_linear,
    fused_linear_reference,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
EPS = 1e-8
# Triton's interpreter truncates fp32 -> bf16 instead of rounding (see test_layer_kernels)
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
SMALL_TILES = [
    Tiles(block_n=16, block_k=32, dot=True),
    Tiles(block_n=8, block_k=32, dot=False),
    Tiles(block_n=16, block_k=32, dot=True, swap=True),
    # k 72 in units of 64 and 8: the last unit of a block is short
    Tiles(block_n=16, block_k=32, dot=True, swap=True, splits=2),
]
TILE_IDS = ["dot", "cuda_cores", "swapped", "swapped_split"]
# a grid smaller than the column blocks (interpreted: programs_per_sm programs in all), so
# programs walk several blocks, unevenly: 40 columns are 3 blocks of 16 and 5 of 8
FEW_PROGRAM_TILES = [
    Tiles(block_n=16, block_k=32, dot=True, programs_per_sm=1),
    Tiles(block_n=8, block_k=32, dot=False, programs_per_sm=2),
    Tiles(block_n=16, block_k=32, dot=True, programs_per_sm=2, swap=True),
    # 9 units on 2 programs: a program adds two parts of one block, the other arrives last
    Tiles(block_n=16, block_k=32, dot=True, programs_per_sm=2, swap=True, splits=3),
]
# Mimi's linear1 + GELU (engine/models/moshi/mimi/transformer.py's _linear): four columns a
# program on the CUDA cores, the whole row of k in one step (here 72 of 128, masked)
MIMI_TILES = Tiles(block_n=4, block_k=128, dot=False)
# the modes of the module docstring: (norm, pending, residual, gated, gelu)
MODES = {
    "plain": (False, False, False, False, False),
    "norm": (True, False, False, False, False),
    "norm_pending": (True, True, False, False, False),
    "residual": (False, False, True, False, False),
    "norm_gated": (True, False, False, True, False),
    "norm_pending_gated": (True, True, False, True, False),
    "gelu": (False, False, False, False, True),
}

interpreter = pytest.mark.interpreter
gpu = pytest.mark.gpu
needs_cpu = pytest.mark.skipif(DEVICE.type == "cuda", reason="compiled tests run on CUDA")
needs_cuda = pytest.mark.skipif(DEVICE.type != "cuda", reason="needs a CUDA device")


def _randn(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=generator) * scale).to(DEVICE, dtype)


def _assert_near(got: torch.Tensor, want: torch.Tensor) -> None:
    """fp32: to a few ulp of the sums; 16-bit: within two units of rounding of the output's
    largest value and, compiled, nearly all equal (sums in another order round apart rarely)."""
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
        return
    step = 2.0**-7 if got.dtype == torch.bfloat16 else 2.0**-10
    # interpreted, each of the (up to 4) truncations in a row can lose an ulp
    ulps = 8 if INTERPRETED and got.dtype == torch.bfloat16 else 2
    scale = want.float().abs().amax().clamp(min=1.0)
    apart = (got.float() - want.float()).abs()
    assert float(apart.max()) <= ulps * step * float(scale), float(apart.max())
    if not INTERPRETED:
        assert float((apart > 0).float().mean()) <= 0.05, "more than 5% of values differ"


def _check(
    mode: str,
    rows: int,
    n: int,
    k: int,
    dtype: torch.dtype,
    tiles: Tiles | None,
    x_scale: float = 2.0,
) -> None:
    norm, has_pending, has_residual, gated, gelu = MODES[mode]
    x = _randn(rows, 1, k, dtype=dtype, seed=1, scale=x_scale)
    weight = _randn(2 * n if gated else n, k, dtype=dtype, seed=2, scale=k**-0.5)
    alpha = _randn(1, 1, k, dtype=dtype, seed=3) if norm else None
    pending = _randn(rows, 1, k, dtype=dtype, seed=4) if has_pending else None
    residual = _randn(rows, 1, n, dtype=dtype, seed=5) if has_residual else None
    want_total, want = fused_linear_reference(
        x, weight, alpha=alpha, eps=EPS, pending=pending, residual=residual, gated=gated, gelu=gelu
    )
    if pending is not None:
        assert alpha is not None
        assert not gelu, "add_fused_linear has no GELU"
        total, got = add_fused_linear(
            x, pending, weight, alpha=alpha, eps=EPS, gated=gated, tiles=tiles
        )
        if dtype == torch.bfloat16 and INTERPRETED:
            _assert_near(total, want_total)
            # the truncated sum is the norm's input: the rest is checked from it
            _, want = fused_linear_reference(total, weight, alpha=alpha, eps=EPS, gated=gated)
        else:
            assert torch.equal(total, want_total)
    else:
        got = fused_linear(
            x, weight, alpha=alpha, eps=EPS, residual=residual, gated=gated, gelu=gelu, tiles=tiles
        )
    _assert_near(got, want)


@interpreter
@needs_cpu
@pytest.mark.parametrize("tiles", SMALL_TILES, ids=TILE_IDS)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_interpreted_modes_match_reference(mode: str, dtype: torch.dtype, tiles: Tiles) -> None:
    # k and n not multiples of the tiles: the masked edges are exercised
    _check(mode, 3, 40, 72, dtype, tiles)


@interpreter
@needs_cpu
@pytest.mark.parametrize("tiles", FEW_PROGRAM_TILES, ids=TILE_IDS)
@pytest.mark.parametrize("mode", ["norm_pending", "residual", "norm_gated", "gelu"])
def test_interpreted_programs_over_several_blocks(mode: str, tiles: Tiles) -> None:
    _check(mode, 3, 40, 72, torch.float32, tiles)


@interpreter
@needs_cpu
@pytest.mark.parametrize("rows", [1, 2, MAX_ROWS])
def test_interpreted_row_counts(rows: int) -> None:
    _check("norm_pending", rows, 24, 48, torch.float32, SMALL_TILES[0])
    _check("residual", rows, 24, 48, torch.float32, SMALL_TILES[1])
    _check("norm_gated", rows, 24, 48, torch.float32, SMALL_TILES[2])
    _check("norm_gated", rows, 24, 48, torch.float32, SMALL_TILES[3])


@interpreter
@needs_cpu
@pytest.mark.parametrize("tiles", [MIMI_TILES, *SMALL_TILES], ids=["mimi", *TILE_IDS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_interpreted_gelu_row_counts(rows: int, dtype: torch.dtype, tiles: Tiles) -> None:
    _check("gelu", rows, 40, 72, dtype, tiles)


@interpreter
@needs_cpu
@pytest.mark.parametrize("rows", [1, 4])
def test_interpreted_gelu_is_torch_gelu_of_the_linear(rows: int) -> None:
    """fp32, as Mimi runs: the eager layer's own ops (torch's CPU linear is full fp32), not
    the reference, against the erf GELU; tanh's approximation is ~1e-3 away at |y| ~ 2."""
    x = _randn(rows, 72, dtype=torch.float32, seed=15, scale=2.0)
    weight = _randn(40, 72, dtype=torch.float32, seed=16, scale=72**-0.5)
    got = fused_linear(x, weight, gelu=True, tiles=MIMI_TILES)
    product = functional.linear(x, weight)
    assert float(product.abs().max()) > 3.0, "the GELU's curved part is exercised"
    assert float(product.min()) < -1.0, "and its negative side"
    torch.testing.assert_close(got, functional.gelu(product), rtol=2e-5, atol=2e-5)
    approximate = functional.gelu(product, approximate="tanh")
    assert float((got - approximate).abs().max()) > 1e-4, "erf's GELU, not tanh's"


def _split_launches_agree(tiles: Tiles, n: int, k: int, dtype: torch.dtype) -> None:
    """Split units leave every arrival count at zero, so that the next launch (another
    shape, reusing the counts) and a repeat of the first give the same bits."""
    x = _randn(1, 1, k, dtype=dtype, seed=12)
    weight = _randn(2 * n, k, dtype=dtype, seed=13, scale=k**-0.5)
    alpha = _randn(k, dtype=dtype, seed=14)
    first = fused_linear(x, weight, alpha=alpha, eps=EPS, gated=True, tiles=tiles)
    other = fused_linear(x, weight[: n // 2], residual=first[..., : n // 2], tiles=tiles)
    again = fused_linear(x, weight, alpha=alpha, eps=EPS, gated=True, tiles=tiles)
    assert torch.equal(first, again)
    _assert_near(
        other, fused_linear_reference(x, weight[: n // 2], residual=first[..., : n // 2])[1]
    )
    for _, arrived in _WORKSPACES[x.device]:
        assert int(arrived.abs().sum()) == 0, arrived


@interpreter
@needs_cpu
def test_interpreted_split_counts_return_to_zero() -> None:
    _split_launches_agree(SMALL_TILES[3], 40, 72, torch.float32)


@interpreter
@needs_cpu
def test_reads_a_column_slice_and_refuses_bad_layouts() -> None:
    wide = _randn(2, 1, 4 * 32, dtype=torch.float32, seed=6)
    x = wide[..., 64:96]  # row stride 128: the depformer's slice of all steps' projections
    pending = _randn(2, 1, 32, dtype=torch.float32, seed=7)
    weight = _randn(16, 32, dtype=torch.float32, seed=8)
    alpha = _randn(32, dtype=torch.float32, seed=9)
    total, got = add_fused_linear(x, pending, weight, alpha=alpha, eps=EPS, tiles=SMALL_TILES[0])
    want_total, want = fused_linear_reference(x, weight, alpha=alpha, eps=EPS, pending=pending)
    assert torch.equal(total, want_total)
    _assert_near(got, want)
    with pytest.raises(AssertionError, match="unit-stride"):
        fused_linear(wide[..., ::4], weight)
    with pytest.raises(AssertionError, match="rows"):
        fused_linear(_randn(MAX_ROWS + 1, 32, dtype=torch.float32, seed=10), weight)
    with pytest.raises(AssertionError, match="not combined"):
        fused_linear(x, weight, residual=_randn(2, 1, 8, dtype=torch.float32, seed=11), gated=True)


@interpreter
@needs_cpu
def test_gelu_refuses_the_gate_and_the_residual() -> None:
    x = _randn(2, 1, 32, dtype=torch.float32, seed=17)
    weight = _randn(16, 32, dtype=torch.float32, seed=18)
    residual = _randn(2, 1, 16, dtype=torch.float32, seed=19)
    with pytest.raises(AssertionError, match="the GELU and the gate are not combined"):
        fused_linear(x, weight, gelu=True, gated=True)
    with pytest.raises(AssertionError, match="the GELU and the residual are not combined"):
        fused_linear(x, weight, gelu=True, residual=residual)
    # each alone is taken (the refusals above are of the pairs, not of the arguments)
    _assert_near(
        fused_linear(x, weight, gelu=True), fused_linear_reference(x, weight, gelu=True)[1]
    )
    _assert_near(
        fused_linear(x, weight, residual=residual),
        fused_linear_reference(x, weight, residual=residual)[1],
    )


@gpu
@needs_cuda
@pytest.mark.parametrize("rows", [1, 8, MAX_ROWS])
@pytest.mark.parametrize(
    ("mode", "n", "k"),
    [
        ("norm_pending", 3 * 1024, 1024),  # the depformer's layer step
        ("residual", 1024, 1024),
        ("norm_gated", 2816, 1024),
        ("residual", 1024, 2816),
        ("plain", 2048, 1024),  # its head
        ("norm", 3 * 4096, 4096),  # the temporal layer's
        ("norm_gated", 11264, 4096),
        ("residual", 4096, 4096),  # its out_proj
        ("residual", 4096, 11264),
    ],
)
def test_seven_b_shapes_bf16(mode: str, n: int, k: int, rows: int) -> None:
    _check(mode, rows, n, k, torch.bfloat16, None)


@gpu
@needs_cuda
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_mimi_linear1_gelu_fp32(rows: int) -> None:
    # Moshi's Mimi: dim 512 -> ffn 2048, on the tiles its transformer passes
    _check("gelu", rows, 2048, 512, torch.float32, Tiles(4, 512, False))


@gpu
@needs_cuda
@pytest.mark.parametrize(
    "tiles",
    [
        Tiles(32, 128, True),
        Tiles(4, 512, False),
        Tiles(4, 512, False, programs_per_sm=1),
        Tiles(64, 128, True, stages=4, swap=True),
        Tiles(128, 64, True, stages=4, programs_per_sm=1, swap=True),
        Tiles(64, 128, True, stages=4, swap=True, splits=3),
        Tiles(64, 64, True, stages=4, programs_per_sm=1, swap=True, splits=4),
    ],
    ids=[
        "dot",
        "cuda_cores",
        "cuda_cores_few_programs",
        "swapped",
        "swapped_few_programs",
        "swapped_split",
        "swapped_split_few_programs",
    ],
)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_modes_and_tiles(mode: str, dtype: torch.dtype, tiles: Tiles) -> None:
    _check(mode, 3, 200, 1000, dtype, tiles)


@gpu
@needs_cuda
@pytest.mark.parametrize("splits", [2, 5])
def test_compiled_split_counts_return_to_zero(splits: int) -> None:
    # a gated launch of the temporal FFN's size, then a residual one reusing the counts; the
    # repeat runs on another program placement
    tiles = Tiles(64, 128, True, stages=4, swap=True, splits=splits)
    _split_launches_agree(tiles, 11264, 4096, torch.bfloat16)


@gpu
@needs_cuda
@pytest.mark.parametrize("mode", ["residual", "norm_pending_gated"])
def test_compiled_programs_over_several_split_units(mode: str) -> None:
    # 256 units on 132 programs: each program walks two, in parallel with the others
    tiles = Tiles(64, 64, True, stages=4, programs_per_sm=1, swap=True, splits=4)
    _check(mode, 3, 4096, 1024, torch.bfloat16, tiles)
