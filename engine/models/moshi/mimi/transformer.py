"""Mimi's streaming transformers (one after the encoder, one before the decoder).

Pre-norm layers with LayerNorm (eps 1e-5, affine), RoPE attention over a per-slot KV ring of
`context` encoder frames (250 = 10 s at 25 Hz), a GELU FFN and layer scales. Each model step
feeds T = 2 encoder frames per slot, channels first as the convolutions produce them:

    x: float32 [slots, dim, T] -> [slots, dim, T]
    keys, values: [layers, slots, heads, context, head_dim];  positions: int64 [slots]
"""

import torch
from torch import Tensor, nn
from torch.nn import functional

from engine.models.moshi.attention import RingAttention, ring_mask
from engine.models.moshi.mimi.seanet import Streaming

LAYER_NORM_EPS = 1e-5


class MimiLayer(nn.Module):
    def __init__(
        self, dim: int, num_heads: int, ffn: int, max_period: float, device: torch.device
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=LAYER_NORM_EPS, device=device)
        self.self_attn = RingAttention(dim, num_heads, max_period, device, torch.float32)
        self.norm2 = nn.LayerNorm(dim, eps=LAYER_NORM_EPS, device=device)
        self.linear1 = nn.Linear(dim, ffn, bias=False, device=device)
        self.linear2 = nn.Linear(ffn, dim, bias=False, device=device)
        self.layer_scale_1 = LayerScale(dim, device)
        self.layer_scale_2 = LayerScale(dim, device)

    def forward(
        self, x: Tensor, start: Tensor, keys: Tensor, values: Tensor, mask: Tensor
    ) -> Tensor:
        attended: Tensor = self.self_attn(self.norm1(x), start, keys, values, mask)
        x = x + self.layer_scale_1(attended)
        update: Tensor = self.layer_scale_2(
            self.linear2(functional.gelu(self.linear1(self.norm2(x))))
        )
        return x + update


class LayerScale(nn.Module):
    def __init__(self, dim: int, device: torch.device) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim, device=device))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


class MimiTransformer(Streaming):
    def __init__(
        self,
        *,
        dim: int,
        num_heads: int,
        num_layers: int,
        ffn: int,
        context: int,
        max_period: float,
        slots: int,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.context = context
        self.layers = nn.ModuleList(
            MimiLayer(dim, num_heads, ffn, max_period, device) for _ in range(num_layers)
        )
        ring_shape = (num_layers, slots, num_heads, context, dim // num_heads)
        self.keys: Tensor
        self.values: Tensor
        self.positions: Tensor
        self.register_buffer("keys", torch.zeros(ring_shape, device=device), False)
        self.register_buffer("values", torch.zeros(ring_shape, device=device), False)
        self.register_buffer(
            "positions", torch.zeros(slots, device=device, dtype=torch.long), False
        )

    def reset(self, mask: Tensor) -> None:
        self.positions.masked_fill_(mask, 0)

    def forward(self, x: Tensor) -> Tensor:
        """x: [slots, dim, T] channels first -> same; every slot advances T positions."""
        steps = x.shape[2]
        h = x.transpose(1, 2)
        mask = ring_mask(self.positions, steps, self.context, self.context)
        for index, layer in enumerate(self.layers):
            h = layer(h, self.positions, self.keys[index], self.values[index], mask)
        self.positions.add_(steps)
        return h.transpose(1, 2)
