"""The ring decode-attention kernel against its fp32 torch reference.

On a machine without CUDA the kernel runs in Triton's interpreter (small shapes); on a GPU it
is compiled. Without triton (CI's CPU torch does not pull it in) the module is skipped.
"""

import os

import pytest

pytest.importorskip("torch")

import torch

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

import kernels.ring_attention as ring_module
from engine.models.moshi.attention import dequantize_kv, quantize_kv, ring_mask
from kernels.arrivals import _COUNTS
from kernels.ring_attention import (
    FEW_ROWS,
    FEW_ROWS_PROGRAM,
    pass1_program,
    ring_attention,
    ring_attention_reference,
    ring_positions,
)
from tests.kernels.captured import assert_replays_one_kernel

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# Triton 3.6's interpreter gets bf16 tl.dot wrong (seen: errors of 1e10 on a 16 x 16 bf16
# product; with 3.9 too), so the kernel's bf16 path is checked on a GPU only: it carries the gpu
# mark, the only one allowed to skip in CI. The fp8 path's products are e4m3 (fp16 below a
# head_dim of 32) and packed fp16, which it gets right.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
needs_16bit_dot = [
    pytest.mark.gpu,
    pytest.mark.skipif(INTERPRETED, reason="the interpreter's bf16 tl.dot is wrong"),
]
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _inputs(
    slots: int, heads: int, capacity: int, head_dim: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (slots, heads, capacity, head_dim)
    q = torch.randn(slots, heads, head_dim, generator=generator) * 2
    keys = torch.randn(shape, generator=generator)
    values = torch.randn(shape, generator=generator)
    return q.to(DEVICE, dtype), keys.to(DEVICE, dtype), values.to(DEVICE, dtype)


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got64, want64 = got.double(), want.double()
    return float((got64 - want64).norm() / want64.norm())


def _positions(slots: int, capacity: int) -> torch.Tensor:
    """Query positions: fresh (0, a few), just before/at/after the first wrap, long after it;
    cycled over the slots."""
    kinds = [0, 3, 1, capacity - 2, capacity - 1, capacity, capacity + 1, 13 * capacity + 5]
    return torch.tensor([kinds[i % len(kinds)] for i in range(slots)], device=DEVICE)


@pytest.mark.parametrize(
    ("slots", "heads", "capacity", "head_dim", "context", "splits"),
    [
        (3, 2, 40, 64, 40, None),  # wraps (positions >= 40), default splits
        (8, 2, 40, 64, 40, 3),  # every position kind, the merge over 3 splits
        (8, 1, 200, 64, 200, 1),  # 4 tiles in one program: the online rescale
        (5, 2, 300, 128, 250, 2),  # several tiles per split and context < capacity
        (2, 1, 130, 128, 130, 5),  # capacity not a multiple of the tile, last tile partial
        (8, 1, 40, 128, 17, 2),  # context shorter than the ring
        (4, 3, 64, 64, 64, 1),  # a single split: pass 1 writes the output
    ],
)
@pytest.mark.parametrize(
    "dtype", [torch.float32, pytest.param(torch.bfloat16, marks=needs_16bit_dot)]
)
# these shapes' few rows take FEW_ROWS_PROGRAM by default; the program for more rows as well
@pytest.mark.parametrize("program", [None, (32, 4, 3)], ids=["default", "many-rows-program"])
def test_kernel_matches_reference(
    slots: int,
    heads: int,
    capacity: int,
    head_dim: int,
    context: int,
    splits: int | None,
    dtype: torch.dtype,
    program: tuple[int, int, int] | None,
) -> None:
    q, keys, values = _inputs(slots, heads, capacity, head_dim, dtype, seed=slots * capacity)
    last = _positions(slots, capacity)
    want = ring_attention_reference(q, keys, values, last, context)
    block_n, num_warps, num_stages = program or (None, None, None)
    got = ring_attention(q, keys, values, last, context, splits, block_n, num_warps, num_stages)
    assert got.dtype == dtype
    assert got.shape == q.shape
    assert torch.isfinite(got).all()
    assert _relative_error(got, want) <= TOLERANCE[dtype]


def test_the_pass1_program_follows_the_rows_and_the_ring_dtype() -> None:
    assert pass1_program(1, fp8=False) == pass1_program(FEW_ROWS, fp8=False) == FEW_ROWS_PROGRAM
    many = (ring_module.BLOCK_N, ring_module.NUM_WARPS, ring_module.NUM_STAGES)
    assert pass1_program(FEW_ROWS + 1, fp8=False) == many != FEW_ROWS_PROGRAM
    fp8 = (ring_module.FP8_BLOCK_N, ring_module.FP8_NUM_WARPS, ring_module.FP8_NUM_STAGES)
    assert pass1_program(1, fp8=True) == pass1_program(FEW_ROWS + 1, fp8=True) == fp8


def test_fresh_slot_ignores_stale_entries() -> None:
    """A slot reset to position 0 sees only entry 0, whatever the older entries hold."""
    q, keys, values = _inputs(2, 2, 40, 64, torch.float32, seed=7)
    keys[:, :, 1:] *= 1e3  # stale history that would dominate the softmax if it leaked
    last = torch.tensor([0, 0], device=DEVICE, dtype=torch.long)
    got = ring_attention(q, keys, values, last, 40, splits=3)
    torch.testing.assert_close(got, values[:, :, 0], rtol=1e-6, atol=1e-6)


def test_query_through_a_strided_view() -> None:
    """The transformer passes q as a permuted view of the fused projection."""
    q, keys, values = _inputs(3, 4, 40, 64, torch.float32, seed=3)
    fused = torch.randn(3, 3, 4, 64, device=DEVICE)  # [slots, q/k/v, heads, head_dim]
    fused[:, 0] = q
    view = fused[:, 0]
    assert not view.is_contiguous()
    last = torch.tensor([5, 45, 90], device=DEVICE, dtype=torch.long)
    got = ring_attention(view, keys, values, last, 40, splits=2)
    want = ring_attention_reference(q, keys, values, last, 40)
    assert _relative_error(got, want) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize(
    ("capacity", "context", "head_dim", "dtype"),
    [
        (200, 200, 64, torch.bfloat16),
        (300, 250, 128, torch.bfloat16),  # 7B heads: 16 softmax groups of 8 rows a tile
        (130, 130, 64, torch.float32),  # fp32 models (tests, CPU)
        (70, 60, 16, torch.float32),  # the tiny config's heads: an fp16 score product
    ],
)
def test_fp8_ring_matches_reference_on_dequantized_entries(
    capacity: int, context: int, head_dim: int, dtype: torch.dtype
) -> None:
    """fp8 e4m3 rings with per-entry bf16 scales: exact to the dequantized ring up to q's
    three-term split and the fp16 value products' rounding, and within a few 1e-2 of the
    unquantized one (the fidelity fp8 costs)."""
    q, keys, values = _inputs(8, 2, capacity, head_dim, dtype, seed=11)
    keys8, key_scale = quantize_kv(keys)
    values8, value_scale = quantize_kv(values)
    value_scale[:, 1] *= 1e-4  # a head of tiny values: the scale, not fp16, carries the range
    last = _positions(8, capacity)
    # entries a query may not see (a previous call's, or older than the context) far louder
    # than the rest: they must not scale the visible values' weights away
    positions = ring_positions(last, capacity)
    hidden = (positions < 0) | (positions <= last[:, None] - context)
    value_scale.masked_fill_(hidden[:, None, :], 1e6)
    got = ring_attention(
        q, keys8, values8, last, context, splits=2, scales=(key_scale, value_scale)
    )
    assert got.dtype == dtype
    dequantized = ring_attention_reference(
        q, dequantize_kv(keys8, key_scale), dequantize_kv(values8, value_scale), last, context
    )
    for head in range(2):
        assert _relative_error(got[:, head], dequantized[:, head]) <= 1e-2
    exact = ring_attention_reference(q, keys, values, last, context)
    assert _relative_error(got[:, 0], exact[:, 0]) <= 5e-2


def _launch(
    slots: int, capacity: int, splits: int, fp8: bool, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the kernel's output, the reference on the rings it read): fp32 q, 2 heads of 64, the
    whole ring in context."""
    q, keys, values = _inputs(slots, 2, capacity, 64, torch.float32, seed)
    last = _positions(slots, capacity)
    scales = None
    if fp8:
        keys, key_scale = quantize_kv(keys)
        values, value_scale = quantize_kv(values)
        scales = (key_scale, value_scale)
        want_keys, want_values = dequantize_kv(keys, key_scale), dequantize_kv(values, value_scale)
    else:
        want_keys, want_values = keys, values
    got = ring_attention(q, keys, values, last, capacity, splits, scales=scales)
    return got, ring_attention_reference(q, want_keys, want_values, last, capacity)


# fp8 rings: block 128, so their splits take rings of more than 128 entries
@pytest.mark.parametrize(("fp8", "capacity"), [(False, 40), (True, 300)], ids=["fp32", "fp8"])
def test_repeated_launches_give_the_same_bits(fp8: bool, capacity: int) -> None:
    """Each row's last split merges it and sets its arrival count back to zero, so that a
    launch reusing the counts (other rows, other splits) and a repeat of the first, as a
    graph replay runs it, give the same bits, and every count is zero after them."""
    first, want = _launch(8, capacity, 3, fp8, seed=5)
    other, other_want = _launch(3, capacity, 2, fp8, seed=6)
    again, _ = _launch(8, capacity, 3, fp8, seed=5)
    assert torch.equal(first, again)
    bound = 1e-2 if fp8 else TOLERANCE[torch.float32]
    assert _relative_error(first, want) <= bound
    assert _relative_error(other, other_want) <= bound
    for counts in _COUNTS[first.device]:  # the tensors' device (cuda:0, not cuda)
        assert int(counts.abs().sum()) == 0, counts


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_a_captured_call_is_one_kernel(fp8: bool) -> None:
    """One slot of 7B shapes (full 1500-frame rings; on 132 multiprocessors 16 splits bf16,
    12 fp8): one kernel in the graph, replays with the eager call's bits."""
    capacity = 1500
    q, keys, values = _inputs(1, 32, capacity, 128, torch.bfloat16, seed=21)
    last = torch.tensor([3 * capacity + 7], device=DEVICE)
    scales = None
    if fp8:
        keys, key_scale = quantize_kv(keys)
        values, value_scale = quantize_kv(values)
        scales = (key_scale, value_scale)

    def call() -> torch.Tensor:
        return ring_attention(q, keys, values, last, capacity, scales=scales)

    assert_replays_one_kernel(call)


def test_reference_validity_is_the_transformers_mask() -> None:
    """The reference's rule is attention.py's ring_mask for one query per slot."""
    last = torch.tensor([0, 5, 39, 40, 77, 1000], dtype=torch.long)
    for context in (40, 13):
        positions = ring_positions(last, 40)
        valid = (positions >= 0) & (positions > last[:, None] - context)
        mask = ring_mask(last, 1, 40, context)[:, 0, 0]
        assert torch.equal(valid, mask)


def test_launcher_rejects_bad_layouts() -> None:
    q, keys, values = _inputs(2, 2, 40, 64, torch.float32, seed=1)
    last = torch.zeros(2, device=DEVICE, dtype=torch.long)
    with pytest.raises(AssertionError, match="contiguous"):
        ring_attention(q, keys.transpose(2, 3).contiguous().transpose(2, 3), values, last, 40)
    with pytest.raises(AssertionError):
        ring_attention(q, keys, values, last.int(), 40)
    with pytest.raises(AssertionError):
        ring_attention(q.bfloat16(), keys, values, last, 40)
    with pytest.raises(AssertionError):
        ring_attention(q, keys, values, last, 41)
