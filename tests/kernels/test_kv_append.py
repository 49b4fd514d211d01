"""RoPE + KV append against the torch ops it replaces (the model's torch path).

Triton's interpreter on CPU rounds fp32 to bf16 by truncation and takes numpy's cos/sin, so
there the kernel is held to a few units in the last place; compiled on a GPU it must give
the torch path's bits.
"""

import pytest

pytest.importorskip("torch")

import torch

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

from engine.models.moshi.attention import (
    KV_FP8,
    KV_SCALE_DTYPE,
    dequantize_kv,
    rope_frequencies,
)
from kernels.kv_append import rope_kv_append, rope_kv_append_reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
COMPILED = DEVICE.type == "cuda"
MAX_PERIOD = 10_000.0


def _rings(
    slots: int, heads: int, capacity: int, head_dim: int, dtype: torch.dtype, fp8: bool
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """Rings full of stale entries, so a write to the wrong index shows."""
    generator = torch.Generator().manual_seed(slots * capacity)
    shape = (slots, heads, capacity, head_dim)
    keys, values = (torch.randn(shape, generator=generator).to(DEVICE, dtype) for _ in "kv")
    if not fp8:
        return keys, values, None
    scale_shape = shape[:3]
    scales = tuple(torch.rand(scale_shape, generator=generator) for _ in "kv")
    return (
        keys.to(KV_FP8),
        values.to(KV_FP8),
        (scales[0].to(DEVICE, KV_SCALE_DTYPE), scales[1].to(DEVICE, KV_SCALE_DTYPE)),
    )


def _clone(
    rings: tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None],
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    keys, values, scales = rings
    copied = None if scales is None else (scales[0].clone(), scales[1].clone())
    return keys.clone(), values.clone(), copied


def _ring_values(keys: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    return keys.float() if scale is None else dequantize_kv(keys, scale)


@pytest.mark.parametrize(
    ("slots", "steps", "heads", "head_dim", "capacity", "dtype", "fp8", "rotate"),
    [
        (3, 1, 4, 128, 50, torch.bfloat16, False, True),  # the temporal decode step
        (3, 1, 4, 128, 50, torch.bfloat16, True, True),  # ... with fp8 rings
        (2, 2, 8, 64, 25, torch.float32, False, True),  # Mimi's transformers: T = 2, fp32
        (2, 3, 2, 64, 25, torch.float32, True, False),  # fp8 from fp32, no rotation
    ],
)
def test_kernel_matches_torch_ops(
    slots: int,
    steps: int,
    heads: int,
    head_dim: int,
    capacity: int,
    dtype: torch.dtype,
    fp8: bool,
    rotate: bool,
) -> None:
    generator = torch.Generator().manual_seed(steps * heads)
    projection = torch.randn(slots, steps, 3 * heads * head_dim, generator=generator) * 3
    qkv = projection.to(DEVICE, dtype).view(slots, steps, 3, heads, head_dim)
    # fresh, mid-ring, wrapping within the step, and an hour into a call
    start = torch.tensor([0, capacity - 1, 45_000][:slots], device=DEVICE)
    want_rings = _rings(slots, heads, capacity, head_dim, dtype, fp8)
    got_rings = _clone(want_rings)
    want = rope_kv_append_reference(
        qkv, start, want_rings[0], want_rings[1], MAX_PERIOD if rotate else None, want_rings[2]
    )
    freqs = rope_frequencies(head_dim, MAX_PERIOD, DEVICE) if rotate else None
    got = rope_kv_append(qkv, start, got_rings[0], got_rings[1], freqs, got_rings[2])
    assert got.shape == (slots, heads, steps, head_dim)
    assert got.dtype == dtype
    if COMPILED:
        assert torch.equal(got, want)
        for got_ring, want_ring in zip(got_rings[:2], want_rings[:2], strict=True):
            assert torch.equal(got_ring.view(torch.uint8), want_ring.view(torch.uint8))
        if want_rings[2] is not None and got_rings[2] is not None:
            for got_written, want_written in zip(got_rings[2], want_rings[2], strict=True):
                assert torch.equal(got_written, want_written)
        return
    # interpreted: the rotation to a few ulps, the rings to the model's dtype's (or fp8's) step
    ulp = torch.finfo(dtype).eps * 4
    torch.testing.assert_close(
        got.float(), want.float(), rtol=ulp, atol=ulp * float(want.abs().max())
    )
    got_scales = got_rings[2] or (None, None)
    want_scales = want_rings[2] or (None, None)
    for got_entries, want_entries, got_scale, want_scale in zip(
        got_rings[:2], want_rings[:2], got_scales, want_scales, strict=True
    ):
        got_ring = _ring_values(got_entries, got_scale)
        want_ring = _ring_values(want_entries, want_scale)
        step = 2.0**-3 if fp8 else ulp  # e4m3 keeps 3 mantissa bits
        scale = want_ring.abs().amax(dim=-1, keepdim=True)
        close = (got_ring - want_ring).abs() <= step * scale
        if fp8:
            # the interpreter's fp32 -> e4m3 drops the carry of a mantissa that rounds up
            # into the next binade (seen: -124 -> -64 where the GPU gives -128)
            got_raw, want_raw = got_entries.float(), want_entries.float()
            close |= (got_raw * 2 - want_raw).abs() <= want_raw.abs() * step
        assert close.all()
        # only the step's entries were written: the rest stays as it was, to the bit
        assert (got_ring != want_ring).sum() <= slots * heads * steps * head_dim


def test_launcher_rejects_bad_layouts() -> None:
    qkv = torch.zeros(2, 1, 3, 2, 64, device=DEVICE)
    keys = torch.zeros(2, 2, 10, 64, device=DEVICE)
    start = torch.zeros(2, dtype=torch.long, device=DEVICE)
    freqs = rope_frequencies(64, MAX_PERIOD, DEVICE)
    with pytest.raises(AssertionError, match="contiguous"):
        rope_kv_append(qkv, start, keys.transpose(2, 3).contiguous().transpose(2, 3), keys, freqs)
    with pytest.raises(AssertionError):
        rope_kv_append(qkv, start.int(), keys, keys.clone(), freqs)
    with pytest.raises(AssertionError):
        rope_kv_append(qkv, start, keys.bfloat16(), keys.bfloat16(), freqs)
    with pytest.raises(AssertionError):  # fp8 rings need their scales
        rope_kv_append(qkv, start, keys.to(KV_FP8), keys.to(KV_FP8), freqs)
