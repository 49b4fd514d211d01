"""Causal self-attention over a per-slot KV ring, RMSNorm and interleaved RoPE.

Shared by the temporal transformer (one frame per step, ring of `context` frames) and the
Mimi transformers (two encoder frames per step, ring of 250). Each slot has its own write
position, so calls that joined at different ticks attend only to their own past:

    keys, values: [layers, slots, heads, capacity, head_dim]  (ring; index = position % capacity)
    start:        int64 [slots]   position of the first query of this step (frames since reset)

A ring index j holds the newest position p <= last with p = j (mod capacity), where
`last = start + T - 1`; it is valid when p >= 0 and within `context` of the query. Nothing is
cleared on reset: a reset slot starts at position 0, so every older entry maps to p < 0.

The temporal transformer's rings may hold fp8 e4m3 entries instead of the model's dtype, each
with its own bf16 scale (`quantize_kv`): the entry's largest magnitude maps to 448.

    key_scale, value_scale: bf16 [layers, slots, heads, capacity]   (fp8 rings only)

It passes each layer a `RingRead`: without a mask, one frame per slot goes through two
Triton launches, RoPE + append (kernels/kv_append.py) and decode attention
(kernels/ring_attention.py), which derives validity from `start` itself and reads only valid
entries; with a mask, the same steps run as torch ops and SDPA over the (dequantized) ring.
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional

KV_FP8 = torch.float8_e4m3fn
KV_SCALE_DTYPE = torch.bfloat16  # range of fp32: no head is too small or too large to scale
FP8_MAX = 448.0  # the largest finite float8 e4m3fn
AMAX_FLOOR = 1e-12  # an all-zero entry still gets a finite scale


def fused_on(x: Tensor, fused: bool | None) -> bool:
    """Whether to run the fused Triton kernels: `fused` if given, else on CUDA tensors only
    (CPU runs keep torch's ops, bit for bit)."""
    return x.is_cuda if fused is None else fused


def rms_norm(x: Tensor, alpha: Tensor, eps: float, fused: bool = False) -> Tensor:
    """RMSNorm computed in fp32 (as Kyutai's `rms_norm_f32`), returned in x's dtype; `fused`:
    in one launch of kernels/rms_norm.py (CUDA, or its interpreter) instead of ~9 torch ops."""
    if fused:
        # imported here: triton is absent from CPU-only installs, which never take this path
        from kernels.rms_norm import rms_norm as rms_norm_kernel

        return rms_norm_kernel(x, alpha, eps)
    x_f32 = x.float()
    var = eps + torch.mean(x_f32**2, dim=-1, keepdim=True)
    return (x_f32 * (alpha.to(var) * torch.rsqrt(var))).to(x.dtype)


def add_rms_norm(
    x: Tensor, residual: Tensor, alpha: Tensor, eps: float, fused: bool = False
) -> tuple[Tensor, Tensor]:
    """(x + residual, rms_norm(x + residual)), the sum in x's dtype; `fused`: one launch."""
    if fused:
        from kernels.rms_norm import add_rms_norm as add_rms_norm_kernel

        return add_rms_norm_kernel(x, residual, alpha, eps)
    total = x + residual
    return total, rms_norm(total, alpha, eps)


class RmsNorm(nn.Module):
    def __init__(self, dim: int, eps: float, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        # [1, 1, dim]: the checkpoint's own shape
        self.alpha = nn.Parameter(torch.ones(1, 1, dim, device=device, dtype=dtype))
        # None: the fused kernel on CUDA only (see fused_on); set it before a graph is captured
        self.fused: bool | None = None

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.alpha, self.eps, fused_on(x, self.fused))


def rope_frequencies(head_dim: int, max_period: float, device: torch.device) -> Tensor:
    """fp32 [head_dim / 2]: exp(-ln(max_period) * 2i / head_dim), the angle per frame of pair i."""
    half = torch.arange(head_dim // 2, device=device, dtype=torch.float32)
    return torch.exp(half * (-math.log(max_period) * 2 / head_dim))


def apply_rope(x: Tensor, positions: Tensor, freqs: Tensor) -> Tensor:
    """Rotate interleaved (real, imag) pairs of x: [B, H, T, D] by positions: int64 [B, T];
    freqs: rope_frequencies' fp32 [D / 2]."""
    batch, _, steps, head_dim = x.shape
    angles = freqs * positions.to(torch.float32).view(batch, 1, steps, 1)
    cos, sin = torch.cos(angles), torch.sin(angles)
    pairs = x.view(*x.shape[:-1], head_dim // 2, 2)
    real, imag = pairs[..., 0].float(), pairs[..., 1].float()
    out_real = (real * cos - imag * sin).to(x.dtype)
    out_imag = (real * sin + imag * cos).to(x.dtype)
    return torch.stack([out_real, out_imag], dim=-1).view(x.shape)


def ring_mask(start: Tensor, steps: int, capacity: int, context: int) -> Tensor:
    """Which ring entries each query may see: bool [B, 1, T, capacity]."""
    device = start.device
    last = (start + steps - 1).view(-1, 1)  # [B, 1]
    index = torch.arange(capacity, device=device).view(1, -1)
    key_pos = last - torch.remainder(last - index, capacity)  # [B, capacity]
    query_pos = start.view(-1, 1) + torch.arange(steps, device=device).view(1, -1)  # [B, T]
    delta = query_pos[:, :, None] - key_pos[:, None, :]  # [B, T, capacity]
    visible = (key_pos[:, None, :] >= 0) & (delta >= 0) & (delta < context)
    return visible[:, None]


def ring_write(ring: Tensor, new: Tensor, start: Tensor) -> None:
    """Write new: [B, H, T, D] into ring: [B, H, capacity, D] at positions start..start+T-1."""
    batch, heads, steps, head_dim = new.shape
    offsets = torch.arange(steps, device=start.device).view(1, -1)
    index = torch.remainder(start.view(-1, 1) + offsets, ring.shape[2])  # [B, T]
    if ring.dtype == KV_FP8:  # scatter has no fp8 kernels: move the bytes
        ring, new = ring.view(torch.uint8), new.view(torch.uint8)
    ring.scatter_(2, index.view(batch, 1, steps, 1).expand(-1, heads, -1, head_dim), new)


def quantize_kv(x: Tensor) -> tuple[Tensor, Tensor]:
    """[..., D] -> (fp8 e4m3 [..., D], bf16 scale [...]), one scale per entry (token and head).

    scale = bf16(max|x| / 448); the entry is x / scale, computed in fp32 with the stored
    (rounded) scale and clamped to +-448, so dequantizing multiplies by exactly what divided.
    """
    x32 = x.float()
    amax = x32.abs().amax(dim=-1).clamp(min=AMAX_FLOOR)
    scale = (amax / FP8_MAX).to(KV_SCALE_DTYPE)
    entries = (x32 / scale.float()[..., None]).clamp(-FP8_MAX, FP8_MAX).to(KV_FP8)
    return entries, scale


def dequantize_kv(entries: Tensor, scale: Tensor) -> Tensor:
    """fp32 [..., D]: what quantize_kv's output stands for."""
    return entries.float() * scale.float()[..., None]


def rope_kv_write(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    start: Tensor,
    keys: Tensor,
    values: Tensor,
    freqs: Tensor | None,
    scales: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """One step's RoPE and ring write in torch ops (what kernels/kv_append.py does in one
    launch): q, k, v [B, H, T, D] at positions start..start+T-1; k and v written into the
    rings keys, values [B, H, capacity, D] (quantized, with their scales, when `scales` are
    given); returns q, rotated. freqs: rope_frequencies' fp32 [D / 2], or None: no rotation."""
    if freqs is not None:
        steps = q.shape[2]
        positions = start.view(-1, 1) + torch.arange(steps, device=q.device).view(1, -1)
        q = apply_rope(q, positions, freqs)
        k = apply_rope(k, positions, freqs)
    if scales is None:
        ring_write(keys, k, start)
        ring_write(values, v, start)
        return q
    for ring_entries, ring_scale, new in ((keys, scales[0], k), (values, scales[1], v)):
        entries, scale = quantize_kv(new)
        ring_write(ring_entries, entries, start)
        ring_write(ring_scale[..., None], scale[..., None], start)
    return q


@dataclass(frozen=True)
class RingRead:
    """How a temporal layer reads its ring (see the module docstring).

    `context`: frames a query attends to. `scales`: this layer's (key_scale, value_scale),
    bf16 [B, H, capacity], when the ring holds fp8 entries. `mask`: None for the Triton
    kernels (one frame per slot, CUDA or Triton's interpreter), else ring_mask's bool
    [B, 1, T, capacity] for the torch ops.
    """

    context: int
    scales: tuple[Tensor, Tensor] | None = None
    mask: Tensor | None = None


class RingAttention(nn.Module):
    """Multi-head self-attention, fused q/k/v projection, no biases, optional RoPE."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        max_period: float | None,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        # in_proj rows: [q heads | k heads | v heads], each head contiguous
        self.in_proj = nn.Linear(dim, 3 * dim, bias=False, device=device, dtype=dtype)
        self.out_proj = nn.Linear(dim, dim, bias=False, device=device, dtype=dtype)
        self.rope_freqs: Tensor | None  # None: no positional encoding
        freqs = None
        if max_period is not None:
            freqs = rope_frequencies(dim // num_heads, max_period, device)
        self.register_buffer("rope_freqs", freqs, False)
        # decode's RoPE, ring append and attention in one launch of kernels/rope_attention.py
        # (rings in the model's dtype, with RoPE); off in a model built alone, on in the
        # engine on CUDA (ModelOptions.rope_in_attention). Read at every call: set it before
        # a graph is captured
        self.append_in_attention = False

    def forward(
        self, x: Tensor, start: Tensor, keys: Tensor, values: Tensor, mask: Tensor | RingRead
    ) -> Tensor:
        """x: [B, T, dim]; keys/values: this layer's ring [B, H, capacity, head_dim]; mask:
        bool [B, 1, T, capacity] (see ring_mask), or the temporal ring's RingRead."""
        batch, steps, dim = x.shape
        qkv = self.in_proj(x).view(batch, steps, 3, self.num_heads, dim // self.num_heads)
        if isinstance(mask, RingRead) and mask.mask is None:
            out = self.decode(qkv, start, keys, values, mask)
        else:
            ring = mask if isinstance(mask, RingRead) else RingRead(keys.shape[2], None, mask)
            out = self._masked(qkv, start, keys, values, ring)
        projected: Tensor = self.out_proj(out.transpose(1, 2).reshape(batch, steps, dim))
        return projected

    def decode(
        self, qkv: Tensor, start: Tensor, keys: Tensor, values: Tensor, ring: RingRead
    ) -> Tensor:
        """The Triton path, before the output projection: [B, 1, 3, H, D] -> [B, H, 1, D]
        (also TemporalLayer's few-rows path)."""
        # imported here: triton is absent from CPU-only installs, which never take this path
        from kernels.kv_append import rope_kv_append
        from kernels.ring_attention import ring_attention

        if qkv.shape[1] != 1:
            raise ValueError(f"ring decode attends one query per slot, got {qkv.shape[1]}")
        if self.append_in_attention and ring.scales is None and self.rope_freqs is not None:
            from kernels.rope_attention import rope_ring_attention

            attended = rope_ring_attention(qkv, start, keys, values, self.rope_freqs, ring.context)
            return attended[:, :, None]
        q = rope_kv_append(qkv, start, keys, values, self.rope_freqs, ring.scales)
        out = ring_attention(q[:, :, 0], keys, values, start, ring.context, scales=ring.scales)
        return out[:, :, None]

    def _masked(
        self, qkv: Tensor, start: Tensor, keys: Tensor, values: Tensor, ring: RingRead
    ) -> Tensor:
        """The torch path: [B, T, 3, H, D] -> [B, H, T, D] through SDPA with ring.mask."""
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, T, head_dim]
        q = rope_kv_write(q, k, v, start, keys, values, self.rope_freqs, ring.scales)
        if ring.scales is not None:
            key_scale, value_scale = ring.scales
            keys = dequantize_kv(keys, key_scale).to(q.dtype)
            values = dequantize_kv(values, value_scale).to(q.dtype)
        out: Tensor = functional.scaled_dot_product_attention(q, keys, values, attn_mask=ring.mask)
        return out
