"""The temporal transformer: one position per frame, every slot at its own position.

Pre-norm layers (RMSNorm fp32, eps 1e-8), RoPE attention over a per-slot KV ring of
`context` frames, SiLU-gated FFN, no biases. State, allocated once for all slots:

    keys, values: [layers, slots, heads, context, head_dim]   model dtype, or fp8 e4m3
    key_scale, value_scale: bf16 [layers, slots, heads, context]  (fp8 rings only)
    positions:    int64 [slots]   frames this call has been through (RoPE position)

`kv_dtype` float8_e4m3fn halves the rings (docs/kv-cache.md: layout, memory, fidelity).

Unlike Kyutai's reference (a fixed 3000-frame ring per call, 4 minutes), the ring length is the
configured context (default 1500 frames = 2 minutes); within it the outputs are the same.

The per-tick `step` attends through the Triton ring decode kernel on CUDA (no mask, reads only
the valid entries: kernels/ring_attention.py) rather than torch's SDPA over the whole ring with
a mask: `decode_kernel` True, None (the kernel on CUDA only: the default) or False (SDPA).
`prefill` (T > 1 frames of one slot) always takes SDPA. Measured on one H200, bf16, 7B shapes
(bench/results/kernels_ring_attention_full_rings.json): with every ring full (calls past two
minutes) the kernel reads at 4.44 TB/s against SDPA's 4.37, 708 vs 720 us per layer at 128
slots, the same 46.2 ms step; at 1 slot 12.5 vs 20.5 us per layer; while calls are young it
skips what is unwritten (46 us per layer at 128 slots with ~50 frames per ring).
"""

import torch
from torch import Tensor, nn
from torch.nn import functional

from engine.models.moshi.attention import (
    KV_FP8,
    KV_SCALE_DTYPE,
    RingAttention,
    RingRead,
    RmsNorm,
    add_rms_norm,
    fused_on,
    ring_mask,
    rms_norm,
)
from engine.models.moshi.config import LmConfig

RMS_EPS = 1e-8
# the largest batch whose decode steps run on the few-rows linears of kernels/fused_linear.py
# (TemporalLayer._few_rows; measured: see that module's docstring); at most its MAX_ROWS
FEW_ROWS = 4


class GatedFfn(nn.Module):
    """silu(x W_gate) * (x W_up) W_down; linear_in rows are [gate | up]."""

    def __init__(self, dim: int, hidden: int, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.linear_in = nn.Linear(dim, 2 * hidden, bias=False, device=device, dtype=dtype)
        self.linear_out = nn.Linear(hidden, dim, bias=False, device=device, dtype=dtype)

    def forward(self, x: Tensor, residual: Tensor, fused: bool) -> Tensor:
        """residual + FFN(x) (see gated_ffn for `fused`)."""
        return gated_ffn(x, self.linear_in.weight, self.linear_out.weight, residual, fused)


def gated_ffn(
    x: Tensor,
    weight_in: Tensor,
    weight_out: Tensor,
    residual: Tensor | None = None,
    fused: bool = False,
) -> Tensor:
    """x: [B, T, dim]; weight_in: [2 * hidden, dim]; weight_out: [dim, hidden]. Returns the
    FFN's output, plus `residual` ([B, T, dim], x's dtype) when given.

    `fused`: the gate in one launch (kernels/gated_silu.py) and the residual added by the
    output GEMM itself (beta = 1: one kernel and one rounding instead of two); the sum is then
    accumulated into `residual`, which must be a tensor nothing else reads afterwards."""
    h = functional.linear(x, weight_in)
    if not fused:
        pair = h.view(*h.shape[:-1], 2, -1)
        update = functional.linear(functional.silu(pair[..., 0, :]) * pair[..., 1, :], weight_out)
        return update if residual is None else residual + update
    # imported here: triton is absent from CPU-only installs, which never take this path
    from kernels.gated_silu import gated_silu

    gated = gated_silu(h)
    if residual is None:
        return functional.linear(gated, weight_out)
    rows = residual.view(-1, residual.shape[-1])
    rows.addmm_(gated.view(-1, gated.shape[-1]), weight_out.t())
    return residual


class TemporalLayer(nn.Module):
    def __init__(
        self,
        dim: int,
        num_heads: int,
        ffn_hidden: int,
        max_period: float,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.norm1 = RmsNorm(dim, RMS_EPS, device, dtype)
        self.self_attn = RingAttention(dim, num_heads, max_period, device, dtype)
        self.norm2 = RmsNorm(dim, RMS_EPS, device, dtype)
        self.gating = GatedFfn(dim, ffn_hidden, device, dtype)
        # None: the fused norm and gate kernels on CUDA only (see fused_on). Read at every call:
        # set it before a graph is captured
        self.fused: bool | None = None

    def forward(
        self,
        x: Tensor,
        start: Tensor,
        keys: Tensor,
        values: Tensor,
        mask: Tensor | RingRead,
        few_rows: bool = False,
    ) -> Tensor:
        """`few_rows` (one frame per slot through the ring kernels, at most
        TemporalTransformer.few_rows slots): the residual GEMMs on the swapped tiles, see
        _few_rows; only with the fused kernels (`fused`), as that path is made of them."""
        fused = fused_on(x, self.fused)
        if few_rows and fused and isinstance(mask, RingRead) and mask.mask is None:
            return self._few_rows(x, start, keys, values, mask)
        normed = rms_norm(x, self.norm1.alpha, self.norm1.eps, fused)
        attended = self.self_attn(normed, start, keys, values, mask)
        x, normed = add_rms_norm(x, attended, self.norm2.alpha, self.norm2.eps, fused)
        out: Tensor = self.gating(normed, x, fused)
        return out

    def _few_rows(
        self, x: Tensor, start: Tensor, keys: Tensor, values: Tensor, ring: RingRead
    ) -> Tensor:
        """The layer for a few slots: the two GEMMs that end in the residual add (out_proj,
        linear_out) on kernels/fused_linear.py's swapped tiles, the add their epilogue; the
        others as the per-op path (cuBLAS behind the norm kernel). Measured on one H200 at
        one row (bench/results/kernels_fused_linear_split.json, us a call): out + residual
        11.5 against cuBLAS's 16.3, down + residual 26.1 against 32.0; with the norm as their
        prologue fused_linear lost on qkv (39.3 on the swapped tiles, 36.7 on its best, CUDA-
        core tile, against 31.7) and gate/up (62.7 and 61.7 against 51.3), so those stay on
        cuBLAS. Two more tries at one slot, each timed with `python3 bench/engine_stages.py
        --slots 1` and reverted: the SiLU gate as the down projection's prologue (its rows
        computed as they load) ran the stage 4.37 -> 4.86 ms (bench/results/
        engine_stages_fusions_{old,new}.json): every unit recomputes the gate of its k range
        for all 16 padded rows; and the first 4 to 32 MB of each GEMM's weight sent to L2
        from a side stream ahead of it (bulk prefetch, commit 37df884, `--prefetch`):
        4.43 ms without, 4.43 / 4.57 / 4.77 / 4.91 with 4 / 8 / 16 / 32 MB
        (engine_stages_1_prefetch.json). A third, commit 0f902f7, reverted: each norm in the
        epilogue of the GEMM before it (the swapped kernel's last column block to finish
        normed the whole output row; 63 launches fewer) ran the stage slower, 4.23-4.24 ms
        against 4.17 at 1 slot and 5.02 against 4.89-4.92 at 4, with qkv also on the swapped
        tiles 4.23 (as fast as cuBLAS there) and gate/up too 4.29; 1 call on the 80 ms clock
        p50 6.60-6.62 against 6.54-6.56 ms (`python3 bench/engine_stages.py --slots 1,4
        --stages temporal --ab chain` as it was, engine_stages_chain_0f902f7.json,
        bench_engine_bf16_1_chain_{0f902f7,221735d}_{1,2}.json): under PDL a launch boundary
        costs less than one program's serial tail of an atomic and a reload of the row.
        Rounded where the per-op path rounds, but the down
        projection's sum, rounded before the residual is added (the per-op path's addmm
        rounds once)."""
        # imported here: triton is absent from CPU-only installs, which never take this path
        from kernels.fused_linear import fused_linear
        from kernels.gated_silu import gated_silu

        attention, gating = self.self_attn, self.gating
        batch, _, dim = x.shape
        heads = attention.num_heads
        normed = rms_norm(x, self.norm1.alpha, self.norm1.eps, True)
        qkv = attention.in_proj(normed).view(batch, 1, 3, heads, dim // heads)
        attended = attention.decode(qkv, start, keys, values, ring)  # [B, H, 1, D]
        attended = attended.transpose(1, 2).reshape(batch, 1, dim)  # the heads side by side
        x = fused_linear(attended, attention.out_proj.weight, residual=x)
        normed = rms_norm(x, self.norm2.alpha, self.norm2.eps, True)
        gated = gated_silu(gating.linear_in(normed))
        return fused_linear(gated, gating.linear_out.weight, residual=x)


class TemporalTransformer(nn.Module):
    def __init__(
        self,
        *,
        dim: int,
        num_heads: int,
        num_layers: int,
        ffn_hidden: int,
        max_period: float,
        context: int,
        slots: int,
        device: torch.device,
        dtype: torch.dtype,
        decode_kernel: bool | None = None,
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        """`kv_dtype`: the rings' entries, the model's dtype (None) or float8_e4m3fn."""
        super().__init__()
        self.context = context
        # None: the kernel on CUDA only. Read at every step: set it before a graph is captured
        self.decode_kernel = decode_kernel
        # the largest batch whose decode steps take TemporalLayer's few-rows path (0: never).
        # Read at every step, like decode_kernel
        self.few_rows = FEW_ROWS
        self.layers = nn.ModuleList(
            TemporalLayer(dim, num_heads, ffn_hidden, max_period, device, dtype)
            for _ in range(num_layers)
        )
        kv_dtype = dtype if kv_dtype is None else kv_dtype
        if kv_dtype not in (dtype, KV_FP8):
            raise ValueError(f"KV ring dtype {kv_dtype} must be the model's {dtype} or {KV_FP8}")
        ring_shape = (num_layers, slots, num_heads, context, dim // num_heads)
        self.keys: Tensor
        self.values: Tensor
        self.key_scale: Tensor | None
        self.value_scale: Tensor | None
        self.positions: Tensor
        for name in ("keys", "values"):
            ring = torch.zeros(ring_shape, device=device, dtype=kv_dtype)
            self.register_buffer(name, ring, False)
        for name in ("key_scale", "value_scale"):
            scale = None
            if kv_dtype == KV_FP8:
                scale = torch.ones(ring_shape[:4], device=device, dtype=KV_SCALE_DTYPE)
            self.register_buffer(name, scale, False)
        self.register_buffer(
            "positions", torch.zeros(slots, device=device, dtype=torch.long), False
        )

    @classmethod
    def for_lm(
        cls,
        config: LmConfig,
        slots: int,
        device: torch.device,
        dtype: torch.dtype,
        kv_dtype: torch.dtype | None = None,
    ) -> "TemporalTransformer":
        """The temporal transformer of an LM of `config`."""
        return cls(
            dim=config.dim,
            num_heads=config.num_heads,
            num_layers=config.num_layers,
            ffn_hidden=config.ffn_hidden,
            max_period=config.max_period,
            context=config.context,
            slots=slots,
            device=device,
            dtype=dtype,
            kv_dtype=kv_dtype,
        )

    def append_in_attention(self, on: bool) -> None:
        """Every layer's decode with its RoPE and ring append inside the attention's launch
        (kernels/rope_attention.py, RingAttention.append_in_attention), or in a launch of
        their own (kernels/kv_append.py, the default). Set it before a graph is captured."""
        for module in self.modules():
            if isinstance(module, RingAttention):
                module.append_in_attention = on

    def reset(self, mask: Tensor) -> None:
        """mask: bool [slots]; those slots start over at position 0."""
        self.positions.masked_fill_(mask, 0)

    def step(self, x: Tensor) -> Tensor:
        """x: [slots, 1, dim] -> [slots, 1, dim]; every slot advances one position."""
        decode = x.is_cuda if self.decode_kernel is None else self.decode_kernel
        out = self._run(x, slice(None), decode)
        self.positions.add_(1)
        return out

    def prefill(self, x: Tensor, slot: int) -> Tensor:
        """x: [1, T, dim], T <= context: run T known frames for one slot from its position."""
        if x.shape[1] > self.context:
            raise ValueError(f"prefill of {x.shape[1]} frames exceeds the context {self.context}")
        s = slice(slot, slot + 1)
        out = self._run(x, s, False)
        self.positions[s] += x.shape[1]
        return out

    def _run(self, x: Tensor, rows: slice, decode: bool) -> Tensor:
        """x: [B, T, dim] for the slots `rows`: through the Triton kernels (`decode`: T = 1)
        or torch ops with a mask."""
        start = self.positions[rows]
        mask = None if decode else ring_mask(start, x.shape[1], self.context, self.context)
        few_rows = decode and x.shape[0] <= self.few_rows
        for index, layer in enumerate(self.layers):
            scales = None
            if self.key_scale is not None and self.value_scale is not None:
                scales = (self.key_scale[index, rows], self.value_scale[index, rows])
            ring = RingRead(self.context, scales, mask)
            x = layer(x, start, self.keys[index, rows], self.values[index, rows], ring, few_rows)
        return x
