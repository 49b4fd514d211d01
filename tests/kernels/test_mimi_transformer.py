"""The Mimi transformer kernels against their torch references, and those references against
the eager layer code (attention.py's RoPE, ring write and masked SDPA).

Interpreted on CPU (small shapes), compiled on a GPU; skipped without triton.
"""

import pytest

pytest.importorskip("torch")

import torch

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

import kernels.mimi_transformer
from engine.models.moshi.attention import apply_rope, ring_mask, ring_write, rope_frequencies
from kernels.arrivals import _COUNTS
from kernels.mimi_transformer import (
    FULL_CHIP_SHAPE,
    SMALL_SPLIT_ROWS,
    SMALL_SPLIT_SHAPE,
    SPLIT_SHAPE,
    residual_layer_norm,
    residual_layer_norm_reference,
    ring_attention_step,
    ring_attention_step_reference,
    rope_tables,
    step_shape,
)
from tests.kernels.captured import assert_replays_one_kernel

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
MAX_PERIOD = 10000.0


def _step_inputs(
    starts: list[int], heads: int, head_dim: int, capacity: int, seed: int, steps: int = 2
) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    slots = len(starts)
    qkv = torch.randn(slots, steps, 3 * heads * head_dim, generator=generator)
    keys = torch.randn(slots, heads, capacity, head_dim, generator=generator)
    values = torch.randn(slots, heads, capacity, head_dim, generator=generator)
    start = torch.tensor(starts)
    tensors = (qkv, keys, values, start)
    return tuple(t.to(DEVICE) for t in tensors)


def _freqs(head_dim: int) -> torch.Tensor:
    return rope_frequencies(head_dim, MAX_PERIOD, DEVICE)


# fresh calls, just before / at / across the first wrap, long after it
STARTS = [0, 2, 4, 5, 6, 7, 131]


@pytest.mark.parametrize(("capacity", "context"), [(8, 8), (8, 5), (40, 23), (250, 250)])
@pytest.mark.parametrize("head_dim", [8, 64])
@pytest.mark.parametrize(
    ("block_n", "tiles_per_split"),
    # the module's default (unsplit at 250 entries); splits of one tile (this step's keys in
    # split 0 only, the others merged); of several tiles; one program over the whole ring
    [(None, None), (64, 1), (16, 1), (16, 2), (32, 2), (16, 16)],
)
# T = 2 as Mimi steps: the pair form (served) and the generic one
@pytest.mark.parametrize("pair", [True, False], ids=["pair", "generic"])
def test_ring_attention_step_matches_reference(
    capacity: int,
    context: int,
    head_dim: int,
    block_n: int | None,
    tiles_per_split: int | None,
    pair: bool,
) -> None:
    _check_step(capacity, context, head_dim, block_n, tiles_per_split, 2, pair)


@pytest.mark.parametrize(("capacity", "context"), [(8, 5), (40, 23)])
@pytest.mark.parametrize(("block_n", "tiles_per_split"), [(None, None), (16, 1), (16, 16)])
@pytest.mark.parametrize("steps", [1, 4])
def test_other_step_lengths_take_the_generic_form(
    capacity: int, context: int, block_n: int | None, tiles_per_split: int | None, steps: int
) -> None:
    _check_step(capacity, context, 16, block_n, tiles_per_split, steps, None)


@pytest.mark.parametrize(
    ("capacity", "context", "starts"),
    [
        (2, 2, [0, 1, 2, 5]),  # a ring of this step's two entries only: no older ones
        (17, 1, [0, 16, 33, 1000]),  # each query sees its own key alone
        (17, 2, [0, 15, 16, 1000]),  # query 0 sees one older entry, query 1 none
        (40, 39, [38, 39, 79, 1000]),  # the start one entry before a wrap, and long after
    ],
)
@pytest.mark.parametrize(("block_n", "tiles_per_split"), [(16, 1), (16, 16)])
def test_the_pair_form_at_its_edges(
    capacity: int, context: int, starts: list[int], block_n: int, tiles_per_split: int
) -> None:
    heads, head_dim = 2, 16
    qkv, keys, values, start = _step_inputs(starts, heads, head_dim, capacity, seed=capacity)
    positions = start[:, None] + torch.arange(2, device=DEVICE)
    cos, sin = rope_tables(positions, _freqs(head_dim))
    want_keys, want_values = keys.clone(), values.clone()
    want = ring_attention_step_reference(qkv, cos, sin, want_keys, want_values, start, context)
    got = ring_attention_step(
        qkv, cos, sin, keys, values, start, context, block_n, tiles_per_split, pair=True
    )
    assert torch.equal(values, want_values)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()


def test_the_pair_form_takes_two_queries_only() -> None:
    qkv, keys, values, start = _step_inputs([3], 2, 16, 8, seed=2, steps=4)
    cos, sin = rope_tables(start[:, None] + torch.arange(4, device=DEVICE), _freqs(16))
    with pytest.raises(AssertionError, match="pair takes T = 2"):
        ring_attention_step(qkv, cos, sin, keys, values, start, 8, pair=True)


def _check_step(
    capacity: int,
    context: int,
    head_dim: int,
    block_n: int | None,
    tiles_per_split: int | None,
    steps: int,
    pair: bool | None,
) -> None:
    heads = 2
    qkv, keys, values, start = _step_inputs(
        STARTS, heads, head_dim, capacity, seed=capacity, steps=steps
    )
    positions = start[:, None] + torch.arange(steps, device=DEVICE)
    cos, sin = rope_tables(positions, _freqs(head_dim))
    want_keys, want_values = keys.clone(), values.clone()
    want = ring_attention_step_reference(qkv, cos, sin, want_keys, want_values, start, context)
    got = ring_attention_step(
        qkv, cos, sin, keys, values, start, context, block_n, tiles_per_split, pair=pair
    )
    assert torch.allclose(keys, want_keys, atol=1e-6, rtol=0)
    assert torch.equal(values, want_values)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()


def _step(
    starts: list[int], capacity: int, block_n: int, tiles_per_split: int, seed: int
) -> torch.Tensor:
    """The kernel's output for 2 heads of 16 over rings of `capacity`, the whole ring in
    context."""
    qkv, keys, values, start = _step_inputs(starts, 2, 16, capacity, seed)
    positions = start[:, None] + torch.arange(2, device=DEVICE)
    cos, sin = rope_tables(positions, _freqs(16))
    return ring_attention_step(
        qkv, cos, sin, keys, values, start, capacity, block_n, tiles_per_split
    )


def test_repeated_split_launches_give_the_same_bits() -> None:
    """Each (slot, head)'s last split merges it and sets its arrival count back to zero, so
    that a launch reusing the counts (other rows, other splits) and a repeat of the first, as
    a graph replay runs it, give the same bits, and every count is zero after them."""
    first = _step(STARTS, 40, 16, 1, seed=8)  # 3 splits
    other = _step(STARTS[:3], 40, 16, 2, seed=9)  # 2 splits
    again = _step(STARTS, 40, 16, 1, seed=8)
    assert torch.equal(first, again)
    qkv, keys, values, start = _step_inputs(STARTS[:3], 2, 16, 40, seed=9)
    cos, sin = rope_tables(start[:, None] + torch.arange(2, device=DEVICE), _freqs(16))
    want = ring_attention_step_reference(qkv, cos, sin, keys, values, start, 40)
    assert torch.allclose(other, want, atol=1e-5, rtol=1e-5), (other - want).abs().max()
    for counts in _COUNTS[first.device]:  # the tensors' device (cuda:0, not cuda)
        assert int(counts.abs().sum()) == 0, counts


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_captured_split_step_is_one_kernel() -> None:
    """Moshi's Mimi at one slot (8 heads x 64, 250-frame rings in 16 splits of 16 entries, as
    step_shape splits them at 8 rows): one kernel in the graph, replays with the eager call's
    bits. Each replay writes the same k and v into the rings again, which changes nothing."""
    heads, head_dim, capacity = 8, 64, 250
    qkv, keys, values, start = _step_inputs([1000], heads, head_dim, capacity, seed=10)
    cos, sin = rope_tables(start[:, None] + torch.arange(2, device=DEVICE), _freqs(head_dim))

    def call() -> torch.Tensor:
        return ring_attention_step(qkv, cos, sin, keys, values, start, capacity, 16, 1)

    assert_replays_one_kernel(call)


def test_step_shape_splits_the_ring_while_the_grid_leaves_multiprocessors_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kernels.mimi_transformer, "multiprocessors", lambda device, off: 132)
    cuda = torch.device("cuda")
    # Moshi's Mimi: 8 heads, so 16 slots are 128 programs unsplit and 17 are 136
    assert SMALL_SPLIT_ROWS == 8
    assert step_shape(8, cuda) == SMALL_SPLIT_SHAPE
    assert step_shape(9, cuda) == step_shape(16, cuda) == step_shape(128, cuda) == SPLIT_SHAPE
    assert step_shape(136, cuda) == step_shape(2400, cuda) == FULL_CHIP_SHAPE
    assert len({SMALL_SPLIT_SHAPE, SPLIT_SHAPE, FULL_CHIP_SHAPE}) == 3


def test_reference_is_the_eager_attention() -> None:
    """The reference's RoPE, ring write and mask are attention.py's, so the kernel is held to
    what the eager Mimi layer computes."""
    heads, head_dim, capacity, context = 2, 16, 8, 6
    qkv, keys, values, start = _step_inputs(STARTS, heads, head_dim, capacity, seed=3)
    slots, steps = qkv.shape[:2]
    positions = start[:, None] + torch.arange(steps, device=DEVICE)
    freqs = _freqs(head_dim)
    cos, sin = rope_tables(positions, freqs)
    eager_keys, eager_values = keys.clone(), values.clone()
    got = ring_attention_step_reference(qkv, cos, sin, keys, values, start, context)
    q, k, v = qkv.view(slots, steps, 3, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    q, k = apply_rope(q, positions, freqs), apply_rope(k, positions, freqs)
    ring_write(eager_keys, k, start)
    ring_write(eager_values, v, start)
    mask = ring_mask(start, steps, capacity, context)
    want = torch.nn.functional.scaled_dot_product_attention(
        q, eager_keys, eager_values, attn_mask=mask
    )
    assert torch.equal(keys, eager_keys)
    assert torch.equal(values, eager_values)
    assert torch.equal(got, want.transpose(1, 2).reshape(slots, steps, heads * head_dim))


@pytest.mark.parametrize("dim", [40, 512])
def test_residual_layer_norm_matches_reference(dim: int) -> None:
    generator = torch.Generator().manual_seed(dim)
    x, update = (torch.randn(3, 2, dim, generator=generator).to(DEVICE) for _ in range(2))
    scale, weight, bias = (torch.randn(dim, generator=generator).to(DEVICE) for _ in range(3))
    got = residual_layer_norm(x, update, scale, weight, bias, 1e-5)
    want = residual_layer_norm_reference(x, update, scale, weight, bias, 1e-5)
    # compiled, x + scale * update is one fused multiply-add (torch: a product, then a sum)
    assert torch.allclose(got[0], want[0], atol=1e-6, rtol=1e-6), (got[0] - want[0]).abs().max()
    assert torch.allclose(got[1], want[1], atol=2e-6, rtol=1e-5), (got[1] - want[1]).abs().max()
