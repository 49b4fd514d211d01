"""Mimi's streaming transformers (one after the encoder, one before the decoder).

Pre-norm layers with LayerNorm (eps 1e-5, affine), RoPE attention over a per-slot KV ring of
`context` encoder frames (250 = 10 s at 25 Hz), a GELU FFN and layer scales. Each model step
feeds T = 2 encoder frames per slot, channels first as the convolutions produce them:

    x: float32 [slots, dim, T] -> [slots, dim, T]
    keys, values: [layers, slots, heads, context, head_dim];  positions: int64 [slots]

Two paths compute the same layers. The eager one (CPU, and the reference on CUDA) runs
attention.py's RingAttention, whose codes match Kyutai's bit for bit on CPU. The fused one
(`fused=True`, Triton: CUDA, or its interpreter in tests) computes the RoPE tables once per
step for all layers and runs, per layer, 7 kernels: in_proj, kernels/mimi_transformer.py's
ring_attention_step (RoPE + ring write + attention, one launch whether or not the ring is
split), out_proj, residual_layer_norm (layer scale + residual + norm2), linear1, GELU,
linear2, then residual_layer_norm again with the next layer's norm1; 6 at up to FEW_ROWS
rows, where linear1 and the GELU are one launch (fused_linear's GELU epilogue: 16 launches
fewer a tick at one call, 8 layers in each direction). Eager it is ~55 kernels per layer on
CUDA, mostly 2.5 us launches on a few KiB (bench/mimi_gpu.py measures both).
"""

import torch
from torch import Tensor, nn
from torch.nn import functional

from engine.models.moshi.attention import RingAttention, ring_mask, rope_frequencies
from engine.models.moshi.mimi.seanet import Streaming

LAYER_NORM_EPS = 1e-5
# The fused path's matrix products take kernels/fused_linear.py (fp32 products and sums on
# the CUDA cores, no TF32) at up to this many rows (slots * T), cuBLAS's TF32 GEMMs above: at
# one slot those were 64 GEMM and split-k reduce launches a codec direction, ~210 us of its
# ~0.8 ms (bench/results/mimi_gpu_1.json's top kernels). Per instance (`few_rows`), so that
# benches can compare.
FEW_ROWS = 4


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

    def forward_fused(
        self,
        x: Tensor,
        normed: Tensor,
        rope: tuple[Tensor, Tensor],
        start: Tensor,
        keys: Tensor,
        values: Tensor,
        context: int,
        few_rows: int,
    ) -> tuple[Tensor, Tensor]:
        """x, normed = norm1(x): fp32 [slots, T, dim] -> (x after this layer, its FFN update
        before the layer scale); the caller adds it (and the next layer's norm1). Products
        of up to `few_rows` rows take the few-rows kernel (FEW_ROWS)."""
        # imported here: triton is absent from CPU-only installs, which never take this path
        from kernels.mimi_transformer import residual_layer_norm, ring_attention_step

        qkv = _linear(normed, self.self_attn.in_proj.weight, few_rows)
        attended = ring_attention_step(qkv, *rope, keys, values, start, context)
        x, normed = residual_layer_norm(
            x,
            _linear(attended, self.self_attn.out_proj.weight, few_rows),
            self.layer_scale_1.scale,
            self.norm2.weight,
            self.norm2.bias,
            LAYER_NORM_EPS,
        )
        hidden = _linear(normed, self.linear1.weight, few_rows, gelu=True)
        return x, _linear(hidden, self.linear2.weight, few_rows)


def _linear(rows: Tensor, weight: Tensor, few_rows: int, gelu: bool = False) -> Tensor:
    """rows [..., k] @ weight [n, k]^T, then torch's exact GELU if `gelu`: the few-rows
    kernel at up to `few_rows` rows (FEW_ROWS), four output columns a program and a whole row
    of k (512 or 2048) in one or two steps, the GELU its epilogue (one launch); cuBLAS and
    torch's GELU above."""
    k = rows.shape[-1]
    if rows.numel() // k > few_rows:
        product = functional.linear(rows, weight)
        return functional.gelu(product) if gelu else product
    from kernels.fused_linear import Tiles, fused_linear

    return fused_linear(rows, weight, gelu=gelu, tiles=Tiles(4, min(k, 1024), dot=False))


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
        fused: bool = False,
    ) -> None:
        super().__init__()
        self.context = context
        self.fused = fused
        self.few_rows = FEW_ROWS
        # the fused path's RoPE tables in one launch of kernels/mimi_rope.py; switched by
        # MimiCodec.use_glue_kernels. Read at every call: set it before a graph is captured
        self.rope_kernel = False
        self.layers = nn.ModuleList(
            MimiLayer(dim, num_heads, ffn, max_period, device) for _ in range(num_layers)
        )
        head_dim = dim // num_heads
        ring_shape = (num_layers, slots, num_heads, context, head_dim)
        self.keys: Tensor
        self.values: Tensor
        self.positions: Tensor
        self.freqs: Tensor
        self.register_buffer("keys", torch.zeros(ring_shape, device=device), False)
        self.register_buffer("values", torch.zeros(ring_shape, device=device), False)
        self.register_buffer(
            "positions", torch.zeros(slots, device=device, dtype=torch.long), False
        )
        # the fused path's RoPE frequencies, those of attention.apply_rope
        self.register_buffer("freqs", rope_frequencies(head_dim, max_period, device), False)

    def reset(self, mask: Tensor) -> None:
        self.positions.masked_fill_(mask, 0)

    def forward(self, x: Tensor) -> Tensor:
        """x: [slots, dim, T] channels first -> same; every slot advances T positions."""
        if self.fused:
            return self._forward_fused(x)
        steps = x.shape[2]
        h = x.transpose(1, 2)
        mask = ring_mask(self.positions, steps, self.context, self.context)
        for index, layer in enumerate(self.layers):
            h = layer(h, self.positions, self.keys[index], self.values[index], mask)
        self.positions.add_(steps)
        return h.transpose(1, 2)

    def _forward_fused(self, x: Tensor) -> Tensor:
        from kernels.mimi_transformer import residual_layer_norm, rope_tables

        steps = x.shape[2]
        if self.rope_kernel:
            from kernels.mimi_rope import step_rope_tables

            # the positions move on inside that launch; the layers read `start`
            cos, sin, start = step_rope_tables(self.positions, steps, self.freqs)
            rope = (cos, sin)
        else:
            start = self.positions
            positions = start[:, None] + torch.arange(steps, device=x.device)
            rope = rope_tables(positions, self.freqs)
        h = x.transpose(1, 2).contiguous()  # [slots, T, dim]
        layers: list[MimiLayer] = list(self.layers)  # type: ignore[arg-type]
        first = layers[0].norm1
        normed = functional.layer_norm(
            h, first.normalized_shape, first.weight, first.bias, first.eps
        )
        for index, layer in enumerate(layers):
            h, update = layer.forward_fused(
                h,
                normed,
                rope,
                start,
                self.keys[index],
                self.values[index],
                self.context,
                self.few_rows,
            )
            scale = layer.layer_scale_2.scale
            if index + 1 < len(layers):
                norm = layers[index + 1].norm1
                h, normed = residual_layer_norm(
                    h, update, scale, norm.weight, norm.bias, LAYER_NORM_EPS
                )
            else:
                h = torch.addcmul(h, scale, update)
        if not self.rope_kernel:
            self.positions.add_(steps)
        return h.transpose(1, 2)
