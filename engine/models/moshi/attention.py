"""Causal self-attention over a per-slot KV ring, RMSNorm and interleaved RoPE.

Shared by the temporal transformer (one frame per step, ring of `context` frames) and the
Mimi transformers (two encoder frames per step, ring of 250). Each slot has its own write
position, so calls that joined at different ticks attend only to their own past:

    keys, values: [layers, slots, heads, capacity, head_dim]  (ring; index = position % capacity)
    start:        int64 [slots]   position of the first query of this step (frames since reset)

A ring index j holds the newest position p <= last with p = j (mod capacity), where
`last = start + T - 1`; it is valid when p >= 0 and within `context` of the query. Nothing is
cleared on reset: a reset slot starts at position 0, so every older entry maps to p < 0.

A decode step (T = 1) may pass `RingDecode` instead of a mask: attention then runs in the
Triton kernel of kernels/ring_attention.py, which derives validity from `start` itself and
reads only valid entries (SDPA reads the whole ring; with the mask it still streams it at
full bandwidth on an H200: see transformer.py for which is faster when).
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional


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


def apply_rope(x: Tensor, positions: Tensor, max_period: float) -> Tensor:
    """Rotate interleaved (real, imag) pairs of x: [B, H, T, D] by positions: int64 [B, T]."""
    batch, _, steps, head_dim = x.shape
    half = torch.arange(head_dim // 2, device=x.device, dtype=torch.float32)
    freqs = torch.exp(half * (-math.log(max_period) * 2 / head_dim))
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
    ring.scatter_(2, index.view(batch, 1, steps, 1).expand(-1, heads, -1, head_dim), new)


@dataclass(frozen=True)
class RingDecode:
    """Attend one query per slot through the ring decode kernel, within `context` frames."""

    context: int


def ring_decode(q: Tensor, keys: Tensor, values: Tensor, start: Tensor, context: int) -> Tensor:
    """q: [B, H, 1, D] -> [B, H, 1, D] through the Triton kernel (CUDA, or its interpreter)."""
    # imported here: triton is absent from CPU-only installs, which never take this path
    from kernels.ring_attention import ring_attention

    if q.shape[2] != 1:
        raise ValueError(f"ring decode attends one query per slot, got {q.shape[2]}")
    return ring_attention(q[:, :, 0], keys, values, start, context)[:, :, None]


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
        self.max_period = max_period  # None: no positional encoding
        # in_proj rows: [q heads | k heads | v heads], each head contiguous
        self.in_proj = nn.Linear(dim, 3 * dim, bias=False, device=device, dtype=dtype)
        self.out_proj = nn.Linear(dim, dim, bias=False, device=device, dtype=dtype)

    def forward(
        self, x: Tensor, start: Tensor, keys: Tensor, values: Tensor, mask: Tensor | RingDecode
    ) -> Tensor:
        """x: [B, T, dim]; keys/values: this layer's ring [B, H, capacity, head_dim]; mask:
        bool [B, 1, T, capacity] (see ring_mask), or RingDecode for the kernel when T = 1."""
        batch, steps, dim = x.shape
        qkv = self.in_proj(x).view(batch, steps, 3, self.num_heads, dim // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, T, head_dim]
        if self.max_period is not None:
            positions = start.view(-1, 1) + torch.arange(steps, device=x.device).view(1, -1)
            q = apply_rope(q, positions, self.max_period)
            k = apply_rope(k, positions, self.max_period)
        ring_write(keys, k, start)
        ring_write(values, v, start)
        if isinstance(mask, RingDecode):
            out = ring_decode(q, keys, values, start, mask.context)
        else:
            out = functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        projected: Tensor = self.out_proj(out.transpose(1, 2).reshape(batch, steps, dim))
        return projected
