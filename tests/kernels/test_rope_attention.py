"""RoPE + ring append + ring attention in one launch (kernels/rope_attention.py) against the
two launches it replaces (kernels/kv_append.py, then kernels/ring_attention.py): the same
ring entries and the same output, bit for bit.

Triton's interpreter on CPU, compiled on a GPU (the same tests: the device is the test's)."""

import pytest

pytest.importorskip("torch")

import torch

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

from engine.models.moshi.attention import rope_frequencies
from kernels.kv_append import rope_kv_append
from kernels.ring_attention import ring_attention
from kernels.rope_attention import rope_ring_attention

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _case(
    slots: int, heads: int, head_dim: int, capacity: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv [slots, 1, 3, heads, head_dim] and rings full of stale entries (a write to the
    wrong index, or a read of the stale own entry, shows)."""
    generator = torch.Generator().manual_seed(seed)
    qkv = torch.randn(slots, 1, 3, heads, head_dim, generator=generator) * 2
    shape = (slots, heads, capacity, head_dim)
    keys, values = (torch.randn(shape, generator=generator) for _ in "kv")
    return qkv.to(DEVICE, dtype), keys.to(DEVICE, dtype), values.to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("splits", [1, 3], ids=["one-split", "merged"])
@pytest.mark.parametrize(
    ("positions", "context"),
    # young calls (the run of entries does not wrap; one at its first frame), calls past a
    # full ring (wrapped), and a context shorter than the ring
    [([0, 5, 17], 48), ([48, 100, 1000], 48), ([60, 200, 47], 20)],
    ids=["young", "wrapped", "short-context"],
)
def test_one_launch_is_the_two(
    dtype: torch.dtype, splits: int, positions: list[int], context: int
) -> None:
    slots, heads, head_dim, capacity = 3, 2, 64, 48
    qkv, keys, values = _case(slots, heads, head_dim, capacity, dtype, seed=sum(positions))
    start = torch.tensor(positions, device=DEVICE)
    freqs = rope_frequencies(head_dim, 10_000.0, DEVICE)
    want_keys, want_values = keys.clone(), values.clone()
    q = rope_kv_append(qkv, start, want_keys, want_values, freqs)
    want = ring_attention(q[:, :, 0], want_keys, want_values, start, context, splits=splits)
    got = rope_ring_attention(qkv, start, keys, values, freqs, context, splits=splits)
    assert got.shape == (slots, heads, head_dim)
    assert got.dtype == dtype
    assert torch.equal(keys, want_keys), "the ring entries are kv_append's"
    assert torch.equal(values, want_values)
    assert torch.equal(got, want), (got.float() - want.float()).abs().max()


def test_the_launch_refuses_what_it_cannot_do() -> None:
    qkv, keys, values = _case(1, 2, 64, 16, torch.bfloat16, seed=1)
    start = torch.zeros(1, dtype=torch.long, device=DEVICE)
    freqs = rope_frequencies(64, 10_000.0, DEVICE)
    with pytest.raises(AssertionError, match="one frame"):
        rope_ring_attention(qkv.expand(1, 2, 3, 2, 64), start, keys, values, freqs, 16)
    with pytest.raises(AssertionError):  # an fp8 ring keeps the two launches
        rope_ring_attention(qkv, start, keys.to(torch.float8_e4m3fn), values, freqs, 16)
    with pytest.raises(AssertionError):
        rope_ring_attention(qkv, start, keys, values, freqs, 17)  # a context over the ring
