"""RoPE + KV append: a step's q, k, v from the fused projection into the ring, one launch.

Per attention layer and step the torch path runs ~20 small ops for interleaved RoPE on q and
k (engine/models/moshi/attention.py `apply_rope`) and two scatters (`ring_write`); this kernel
does all of it, reading the projection once:

    qkv:          [B, T, 3, H, D]   in_proj's output viewed per part and head (D unit-stride)
    start:        int64 [B]         position of the step's first frame (frames since reset)
    freqs:        fp32 [D / 2]      attention.py's rope_frequencies, or None: no rotation
    keys, values: [B, H, capacity, D] this layer's ring, contiguous: qkv's dtype, or fp8 e4m3
                  with bf16 scales [B, H, capacity] (attention.py's quantize_kv)
    returns q:    [B, H, T, D]      rotated, qkv's dtype, contiguous

Frame t of slot b goes to ring index (start[b] + t) mod capacity. One program per (b, t, head)
computes the rotation in fp32 as apply_rope does (positions converted to fp32, the angle a
product of two fp32 values, libdevice's cos/sin, each product rounded before the sum: fp
contraction off), rounds k to the model's dtype as the torch path stores it, and, for an fp8
ring, quantizes k and v with their own scale: bf16(max|x| / 448) and x / scale in fp32 with
correctly rounded divisions, clamped to +-448. T = 1 is the temporal transformer's decode
step, its only caller. Small T and fp32 rings (Mimi's shapes: T = 2, fp32) are supported and
tested, but nothing launches them: Mimi's fused path rotates and writes its rings inside
kernels/mimi_transformer.py's ring_attention_step, and a prompt's prefill takes the torch ops.

Compiled on an H200 (Triton 3.6) it gives the torch path's bits: rotated q, ring entries and
scales (tests/kernels/test_kv_append.py, bf16 and fp32, plain and fp8 rings, positions up to
45,000). Its time was not measured apart; it replaces about 40 launches per layer and step
(by count of the torch ops: 18 per apply_rope, two of them, and the two scatters with their
index arithmetic).

The launcher asserts shapes, dtypes, strides and devices, allocates only q's output and never
reads device values on the host: it can be captured in a CUDA graph.
"""

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor

from engine.models.moshi.attention import (
    AMAX_FLOOR,
    FP8_MAX,
    KV_FP8,
    KV_SCALE_DTYPE,
    rope_frequencies,
    rope_kv_write,
)
from kernels.dependent_launch import dependent, wait_for_inputs

# the quantization constants of attention.py, as compile-time constants of the kernel
_FP8_MAX = tl.constexpr(FP8_MAX)
_AMAX_FLOOR = tl.constexpr(AMAX_FLOOR)


def rope_kv_append_reference(
    qkv: Tensor,
    start: Tensor,
    keys: Tensor,
    values: Tensor,
    max_period: float | None,
    scales: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """The torch ops the kernel replaces (the model's torch path); returns q [B, H, T, D]."""
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, T, D]
    freqs = None
    if max_period is not None:
        freqs = rope_frequencies(qkv.shape[-1], max_period, qkv.device)
    return rope_kv_write(q, k, v, start, keys, values, freqs, scales).contiguous()


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _store_entry(ring_ptr, scale_ptr, entry, pairs, real, imag, quantized: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
    """Write one ring entry from its (real, imag) halves, fp32 already rounded to the model's
    dtype; fp8 rings get the entry's scale too."""
    half: tl.constexpr = real.shape[0]
    offsets = entry * (2 * half) + 2 * pairs
    if quantized:
        amax = tl.maximum(tl.max(tl.abs(real), axis=0), tl.max(tl.abs(imag), axis=0))
        scale = tl.math.div_rn(tl.maximum(amax, _AMAX_FLOOR), _FP8_MAX).to(tl.bfloat16)
        tl.store(scale_ptr + entry, scale)
        scale = scale.to(tl.float32)
        real = tl.clamp(tl.math.div_rn(real, scale), -_FP8_MAX, _FP8_MAX)
        imag = tl.clamp(tl.math.div_rn(imag, scale), -_FP8_MAX, _FP8_MAX)
    tl.store(ring_ptr + offsets, real.to(ring_ptr.dtype.element_ty))
    tl.store(ring_ptr + offsets + 1, imag.to(ring_ptr.dtype.element_ty))


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _rope_append_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    qkv_ptr,
    start_ptr,
    freqs_ptr,
    q_out_ptr,
    k_ptr,
    v_ptr,
    k_scale_ptr,
    v_scale_ptr,
    stride_batch,
    stride_step,
    stride_part,
    stride_head,
    steps,
    heads,
    capacity,
    half: tl.constexpr,
    rotate: tl.constexpr,
    quantized: tl.constexpr,
    pdl: tl.constexpr,
):
    wait_for_inputs(pdl)
    row = tl.program_id(0)  # batch * steps + step
    head = tl.program_id(1)
    batch = row // steps
    step = row - batch * steps
    position = tl.load(start_ptr + batch) + step  # int64
    pairs = tl.arange(0, half)
    source = qkv_ptr + batch.to(tl.int64) * stride_batch + step * stride_step + head * stride_head
    dtype = qkv_ptr.dtype.element_ty
    q_re = tl.load(source + 2 * pairs).to(tl.float32)
    q_im = tl.load(source + 2 * pairs + 1).to(tl.float32)
    k_re = tl.load(source + stride_part + 2 * pairs).to(tl.float32)
    k_im = tl.load(source + stride_part + 2 * pairs + 1).to(tl.float32)
    v_re = tl.load(source + 2 * stride_part + 2 * pairs).to(tl.float32)
    v_im = tl.load(source + 2 * stride_part + 2 * pairs + 1).to(tl.float32)
    if rotate:
        angle = tl.load(freqs_ptr + pairs) * position.to(tl.float32)
        cos = tl.cos(angle)  # libdevice cosf on CUDA (PTX: __nv_cosf)
        sin = tl.sin(angle)
        q_re, q_im = q_re * cos - q_im * sin, q_re * sin + q_im * cos
        # k as the torch path stores it: rounded to the model's dtype
        k_re, k_im = (
            (k_re * cos - k_im * sin).to(dtype).to(tl.float32),
            (k_re * sin + k_im * cos).to(dtype).to(tl.float32),
        )
    slot_head = batch.to(tl.int64) * heads + head
    q_out = q_out_ptr + ((slot_head * steps + step) * half + pairs) * 2
    tl.store(q_out, q_re.to(dtype))
    tl.store(q_out + 1, q_im.to(dtype))
    entry = slot_head * capacity + position % capacity
    _store_entry(k_ptr, k_scale_ptr, entry, pairs, k_re, k_im, quantized)
    _store_entry(v_ptr, v_scale_ptr, entry, pairs, v_re, v_im, quantized)


def rope_kv_append(
    qkv: Tensor,
    start: Tensor,
    keys: Tensor,
    values: Tensor,
    freqs: Tensor | None,
    scales: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """Rotate q and k of this step, append k and v to the ring (module docstring); returns the
    rotated q: [B, H, T, D] in qkv's dtype."""
    batch, steps, parts, heads, head_dim = qkv.shape
    capacity = keys.shape[2]
    assert parts == 3, f"qkv must be [B, T, 3, H, D], got {tuple(qkv.shape)}"
    assert qkv.stride(4) == 1, f"qkv's head_dim must be unit-stride, strides {qkv.stride()}"
    assert qkv.dtype in (torch.float32, torch.float16, torch.bfloat16), qkv.dtype
    assert head_dim in (16, 32, 64, 128, 256), f"head_dim {head_dim} must be a power of two"
    assert keys.shape == (batch, heads, capacity, head_dim), (keys.shape, qkv.shape)
    assert values.shape == keys.shape, (values.shape, keys.shape)
    assert keys.is_contiguous(), "the rings must be contiguous"
    assert values.is_contiguous(), "the rings must be contiguous"
    assert keys.dtype == values.dtype, (keys.dtype, values.dtype)
    assert 1 <= steps <= capacity, (steps, capacity)
    assert start.shape == (batch,), (start.shape, batch)
    assert start.dtype == torch.int64, start.dtype
    assert qkv.device == keys.device == values.device == start.device, "tensors on one device"
    if freqs is not None:
        assert freqs.shape == (head_dim // 2,), (freqs.shape, head_dim)
        assert freqs.dtype == torch.float32, freqs.dtype
        assert freqs.is_contiguous(), "freqs must be contiguous"
        assert freqs.device == qkv.device, "tensors on one device"
    if scales is None:
        assert keys.dtype == qkv.dtype, (keys.dtype, qkv.dtype)
        key_scale = value_scale = keys  # not read
    else:
        assert keys.dtype == KV_FP8, keys.dtype
        key_scale, value_scale = scales
        for scale in scales:
            assert scale.shape == keys.shape[:3], (scale.shape, keys.shape)
            assert scale.dtype == KV_SCALE_DTYPE, scale.dtype
            assert scale.is_contiguous(), "scales must be contiguous"
            assert scale.device == qkv.device, "tensors on one device"
    q = torch.empty(batch, heads, steps, head_dim, device=qkv.device, dtype=qkv.dtype)
    pdl = dependent(qkv, "kv_append")
    _rope_append_kernel[(batch * steps, heads)](
        qkv,
        start,
        freqs if freqs is not None else q,
        q,
        keys,
        values,
        key_scale,
        value_scale,
        qkv.stride(0),
        qkv.stride(1),
        qkv.stride(2),
        qkv.stride(3),
        steps,
        heads,
        capacity,
        half=head_dim // 2,
        rotate=freqs is not None,
        quantized=scales is not None,
        num_warps=1,
        # each product rounded before the sum, as the torch ops round them
        enable_fp_fusion=False,
        pdl=pdl,
        launch_pdl=pdl,
    )
    return q
