"""The whole depth transformer of one frame as ONE Triton launch, phases split by grid barriers.

Depformer.forward (engine/models/moshi/depformer.py) runs 8 dependent steps x 6 layers for
every slot as ~1500 small kernels. Here one program per multiprocessor runs all of it:

    in-proj   xin[B, steps * dep_dim] = hidden @ depformer_in[s]^T for every step s at once
    for step s:
      token   x = xin[:, s] + table_s[previous token]   (previous: text at s = 0, else the
              token chosen from step s-1's logits: argmax, or the exponential race, or forced)
      for layer l:
        qkv   q, k, v = rmsnorm(x) @ in_proj^T         (k, v into the scratch at step s)
        attn  softmax(q k^T / sqrt(d)) v over the scratch's steps 0..s
        out   x += attn @ out_proj^T
        ffn   g = silu(a) * b, [a | b] = rmsnorm(x) @ linear_in^T
        down  x += g @ linear_out^T
      head    logits[B, card] = x @ linears[s]^T
    token     the last step's choice

Each arrow is a phase, and a grid barrier follows each (1 + 8 * (2 + 5 * layers) = 257 at 6
layers). A GEMM phase tiles the output columns across programs; a program reads its weight
tile for all rows (row blocks of BLOCK_M on the tensor cores; the tile stays in L2 between row
blocks). The numerics follow the torch code's rounding points: every linear's output is
rounded to the activation dtype, residual adds and the SiLU gate round as torch's bf16 ops
do, RMSNorm is fp32 (eps + mean(x^2), then x * (alpha * rsqrt)), attention is fp32 inside
and rounded once, and logits are the rounded head outputs read as fp32. Summation orders
differ from cuBLAS, so a token can differ from torch's where two logits nearly tie.

Sampling (temperature + top-k) is engine/models/moshi/sampling.py's rule (`choose`, its
torch reference for the same noise): the exponential race over the top-k set, with the draws
of every step made before the launch by one torch op, as Depformer.forward does.

Grid barrier: one int64 counter per prepared module, only ever incremented. A program adds
1 and waits until the counter reaches the next multiple of the grid size, so no reset is
needed between launches and a CUDA graph can replay the launch. The grid is one program per
multiprocessor, checked against the compiled kernel's registers, threads and shared memory
before the first launch (all programs must be resident at once or the barrier never opens).
Loads of what other programs wrote in this launch bypass L1 (.cg).

Triton's interpreter runs programs one after another, so barriers with more than one program
deadlock there; on CPU the launcher runs a grid of one program, for which every barrier opens
at once (tests/kernels/test_depformer_program.py).

Measured on one H200 (torch 2.11, Triton 3.6, CUDA graphs, random weights; the first version
of bench/kernels_depformer.py, tiles 64 x 32 x 64, 4 warps, 3 stages; the run stopped at its
75 s limit after the 1-slot row, compiling the integer specialisations since switched off;
bench/results/kernels_depformer.json):
- a grid barrier alone: 1.1 us (257 per tick: 0.28 ms);
- 1 slot, greedy: 3.13 ms vs 3.70 ms for Depformer.forward's torch ops (1.18x); with the audio
  sampling (temperature 0.8, top-k 250): 3.68 vs 4.20 ms (1.14x). The weights stream at only
  426 GB/s, ~10% of HBM: the ~2.85 ms left after the barriers are the phases themselves,
  ~11 us each, latency-bound (a program keeps a few KB of weights in flight; the 1024-wide
  outputs keep only 32 of 132 programs busy);
- 8 to 300 slots: not timed yet.
Those torch ops are Depformer.forward with `fused = False`. The path the engine serves, the
fused one (kernels/rms_norm.py, gated_silu.py, step_attention.py), takes 1.90 ms at 1 slot and
2.05-2.18 ms at 128 (bench/results/kernels_layer.json, engine_stages_layer_kernels.json): this
program is ~1.6x slower than what is served, and nothing in the engine launches it.
Tokens, tests/kernels/test_depformer_program.py on the same machine: greedy equal to
Depformer.forward at 1 and 8 slots; at 128 slots 104 of 128 rows equal through the 8 steps and
the others apart from a near tie (teacher-forced logit gap <= 0.042 row std); sampling with
the same noise 97.9% of tokens equal to sampling.choose under teacher forcing; the
step-0 distribution and three graph replays without a barrier reset passed.

What would make it faster (not measured): more weight bytes in flight per program (longer K
blocks, 16-row A tiles at few slots: bench's SWEEP), split-K so the 1024-wide outputs use
every program, and attention fused into the qkv phase (head-aligned tiles: 48 phases and
barriers fewer).
"""

import math
import weakref
from dataclasses import dataclass
from typing import Any, cast

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor
from torch.nn import functional

from engine.models.moshi.attention import rms_norm
from engine.models.moshi.depformer import Depformer, DepformerLayer
from engine.models.moshi.sampling import Sampling, choose, draw_noise
from engine.models.moshi.transformer import RMS_EPS

# the program's tiles; module-level and read at each launch, so the bench can sweep them
BLOCK_M = 64  # rows per tensor-core tile (padded with masked rows below it)
BLOCK_N = 32  # output columns per program tile
BLOCK_K = 64
NUM_WARPS = 4
NUM_STAGES = 3  # loads in flight in each K loop (cp.async); Triton's default on Hopper


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def grid_sync(counter_ptr, programs):  # type: ignore[no-untyped-def,unused-ignore]
    """Wait until every program of the grid has arrived (module docstring)."""
    tl.debug_barrier()  # this program's stores are issued before it arrives
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    target = (arrived // programs + 1) * programs
    seen = arrived + 1
    while seen < target:
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _linear_tile(  # type: ignore[no-untyped-def,unused-ignore]
    a_ptr,
    a_stride,
    rows,
    m0,
    w_ptr,
    n0,
    k_size,
    alpha_ptr,
    eps,
    norm: tl.constexpr,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
    precision: tl.constexpr,
):
    """fp32 [block_m, block_n]: rows m0.. of A (RMS-normed first when `norm`) times rows
    n0.. of W: [N, k_size] transposed."""
    offs_m = m0 + tl.arange(0, block_m)
    row_ok = offs_m < rows
    offs_n = n0 + tl.arange(0, block_n)
    offs_k = tl.arange(0, block_k)
    a_rows = a_ptr + offs_m[:, None].to(tl.int64) * a_stride + offs_k[None, :]
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * k_size + offs_k[None, :]
    if norm:
        squares = tl.zeros((block_m,), tl.float32)
        for k0 in range(0, k_size, block_k):
            a = tl.load(a_rows + k0, mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
            a = a.to(tl.float32)
            squares += tl.sum(a * a, axis=1)
        inv_rms = tl.rsqrt(eps + squares / k_size)
    acc = tl.zeros((block_m, block_n), tl.float32)
    for k0 in range(0, k_size, block_k):
        a = tl.load(a_rows + k0, mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
        if norm:
            alpha = tl.load(alpha_ptr + k0 + offs_k).to(tl.float32)
            scale = alpha[None, :] * inv_rms[:, None]
            a = (a.to(tl.float32) * scale).to(a_ptr.dtype.element_ty)
        w = tl.load(w_rows + k0, eviction_policy="evict_first")
        acc = tl.dot(a, tl.trans(w), acc, input_precision=precision)
    return acc


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _choose(  # type: ignore[no-untyped-def,unused-ignore]
    logits_ptr,
    noise_ptr,
    forced_ptr,
    forced_mask_ptr,
    out_ptr,
    row,
    step,
    temperature,
    top_k,
    steps: tl.constexpr,
    card: tl.constexpr,
    greedy,
):
    """The token of (row, step) from its logits; stored in out[row, step] and returned."""
    cols = tl.arange(0, card)
    logits = tl.load(logits_ptr + row * card + cols, cache_modifier=".cg")
    if greedy != 0:
        token = tl.argmax(logits, axis=0, tie_break_left=True).to(tl.int64)
    else:
        scaled = logits / temperature
        weight = tl.exp(scaled - tl.max(scaled, axis=0))  # p_i up to the softmax's sum
        ranked = tl.sort(logits, descending=True)
        kth = tl.max(tl.where(cols == top_k - 1, ranked, float("-inf")), axis=0)
        race = tl.load(noise_ptr + (row * steps + step) * card + cols)
        score = tl.where(logits >= kth, weight / race, -1.0)
        token = tl.argmax(score, axis=0, tie_break_left=True).to(tl.int64)
    entry = row * steps + step
    given = tl.load(forced_ptr + entry)
    token = tl.where(tl.load(forced_mask_ptr + entry) != 0, given, token)
    tl.store(out_ptr + row * steps + step, token)
    return token


# Triton specialises integer arguments equal to 1 or divisible by 16 into separate compiled
# kernels (tens of seconds of compiling each); none of these needs it.
_RUNTIME_INTS = ["batch", "slots", "programs", "greedy", "top_k"]


@triton.jit(do_not_specialize=_RUNTIME_INTS)  # type: ignore[untyped-decorator,unused-ignore]
def _depformer_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    hidden_ptr,  # [B, dim]
    text_ptr,  # int64 [B]
    out_ptr,  # int64 [B, steps]
    forced_ptr,  # int64 [B, steps]
    forced_mask_ptr,  # uint8 [B, steps]
    noise_ptr,  # fp32 [B, steps, card]: Exp(1) draws
    w_in_ptr,  # [steps, dep_dim, dim]
    text_emb_ptr,  # [text_card + 1, dep_dim]
    emb_ptr,  # [steps - 1, card + 1, dep_dim]
    w_qkv_ptr,  # [layers, steps, 3 * dep_dim, dep_dim]
    w_out_ptr,  # [layers, steps, dep_dim, dep_dim]
    w_ffn_in_ptr,  # [layers, steps, 2 * hidden, dep_dim]
    w_ffn_out_ptr,  # [layers, steps, dep_dim, hidden]
    norm1_ptr,  # [layers, dep_dim]
    norm2_ptr,  # [layers, dep_dim]
    w_head_ptr,  # [steps, card, dep_dim]
    keys_ptr,  # [layers, slots, heads, steps, head_dim]
    values_ptr,  # [layers, slots, heads, steps, head_dim]
    xin_ptr,  # [B, steps * dep_dim]
    x_ptr,  # [B, dep_dim]: the residual stream
    q_ptr,  # [B, dep_dim]
    attn_ptr,  # [B, dep_dim]
    gate_ptr,  # [B, hidden]
    logits_ptr,  # fp32 [B, card]
    counter_ptr,  # int64 [1]: the grid barrier
    batch,
    slots,
    programs,
    eps,
    qk_scale,
    greedy,
    temperature,
    top_k,
    dim: tl.constexpr,
    dep_dim: tl.constexpr,
    heads: tl.constexpr,
    head_dim: tl.constexpr,
    hidden: tl.constexpr,
    card: tl.constexpr,
    steps: tl.constexpr,
    steps_pow2: tl.constexpr,
    layers: tl.constexpr,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
    precision: tl.constexpr,
):
    pid = tl.program_id(0)
    dtype = x_ptr.dtype.element_ty
    tile_cols = tl.arange(0, block_n)
    tile_rows = tl.arange(0, block_m)
    width = steps * dep_dim
    for tile in range(pid, width // block_n, programs):
        n0 = tile * block_n
        for m0 in range(0, batch, block_m):
            acc = _linear_tile(
                hidden_ptr, dim, batch, m0, w_in_ptr, n0, dim, w_in_ptr, eps,
                False, block_m, block_n, block_k, precision,
            )  # fmt: skip
            offs_m = m0 + tile_rows
            where = offs_m[:, None].to(tl.int64) * width + n0 + tile_cols[None, :]
            tl.store(xin_ptr + where, acc.to(dtype), mask=(offs_m < batch)[:, None])
    grid_sync(counter_ptr, programs)

    features = tl.arange(0, dep_dim)
    head_index = tl.arange(0, heads)
    scratch_steps = tl.arange(0, steps_pow2)
    dims = tl.arange(0, head_dim)
    for step in range(steps):
        # token: the previous step's choice (or the text token) enters through its embedding
        for row in range(pid, batch, programs):
            if step == 0:
                previous = tl.load(text_ptr + row)
                table = text_emb_ptr
            else:
                previous = _choose(
                    logits_ptr, noise_ptr, forced_ptr, forced_mask_ptr, out_ptr, row,
                    step - 1, temperature, top_k, steps, card, greedy,
                )  # fmt: skip
                table = emb_ptr + (step - 1) * (card + 1) * dep_dim
            embedded = tl.load(table + previous * dep_dim + features).to(tl.float32)
            projected = tl.load(
                xin_ptr + row * width + step * dep_dim + features, cache_modifier=".cg"
            )
            tl.store(
                x_ptr + row * dep_dim + features, (projected.to(tl.float32) + embedded).to(dtype)
            )
        grid_sync(counter_ptr, programs)

        for layer in range(layers):
            at = layer * steps + step
            alpha1 = norm1_ptr + layer * dep_dim
            alpha2 = norm2_ptr + layer * dep_dim
            # qkv: q to its buffer, k and v to the scratch at this step
            w_qkv = w_qkv_ptr + at * (3 * dep_dim * dep_dim)
            for tile in range(pid, 3 * dep_dim // block_n, programs):
                n0 = tile * block_n
                part = n0 // dep_dim
                within = n0 % dep_dim + tile_cols
                for m0 in range(0, batch, block_m):
                    acc = _linear_tile(
                        x_ptr, dep_dim, batch, m0, w_qkv, n0, dep_dim, alpha1, eps,
                        True, block_m, block_n, block_k, precision,
                    )  # fmt: skip
                    offs_m = m0 + tile_rows
                    row_ok = (offs_m < batch)[:, None]
                    if part == 0:
                        where = offs_m[:, None] * dep_dim + within[None, :]
                        tl.store(q_ptr + where, acc.to(dtype), mask=row_ok)
                    else:
                        entry = (layer * slots + offs_m[:, None]) * heads
                        entry = entry + (within // head_dim)[None, :]
                        where = (entry * steps + step) * head_dim + (within % head_dim)[None, :]
                        if part == 1:
                            tl.store(keys_ptr + where, acc.to(dtype), mask=row_ok)
                        else:
                            tl.store(values_ptr + where, acc.to(dtype), mask=row_ok)
            grid_sync(counter_ptr, programs)

            # attention of each row's heads over the scratch steps 0..step
            visible = (scratch_steps <= step)[None, :, None]
            for row in range(pid, batch, programs):
                q = tl.load(
                    q_ptr + row * dep_dim + head_index[:, None] * head_dim + dims[None, :],
                    cache_modifier=".cg",
                ).to(tl.float32)
                entry = (layer * slots + row) * heads + head_index
                where = (entry[:, None, None] * steps + scratch_steps[None, :, None]) * head_dim
                where = where + dims[None, None, :]  # [heads, steps_pow2, head_dim]
                k = tl.load(keys_ptr + where, mask=visible, other=0.0, cache_modifier=".cg")
                scores = tl.sum(q[:, None, :] * k.to(tl.float32), axis=2) * qk_scale
                scores = tl.where(scratch_steps[None, :] <= step, scores, float("-inf"))
                weights = tl.exp(scores - tl.max(scores, axis=1)[:, None])
                weights = weights / tl.sum(weights, axis=1)[:, None]
                v = tl.load(values_ptr + where, mask=visible, other=0.0, cache_modifier=".cg")
                mixed = tl.sum(weights[:, :, None] * v.to(tl.float32), axis=1)
                where_out = row * dep_dim + head_index[:, None] * head_dim + dims[None, :]
                tl.store(attn_ptr + where_out, mixed.to(dtype))
            grid_sync(counter_ptr, programs)

            # out projection + residual
            w_out = w_out_ptr + at * (dep_dim * dep_dim)
            for tile in range(pid, dep_dim // block_n, programs):
                n0 = tile * block_n
                for m0 in range(0, batch, block_m):
                    acc = _linear_tile(
                        attn_ptr, dep_dim, batch, m0, w_out, n0, dep_dim, alpha1, eps,
                        False, block_m, block_n, block_k, precision,
                    )  # fmt: skip
                    offs_m = m0 + tile_rows
                    row_ok = (offs_m < batch)[:, None]
                    where = offs_m[:, None] * dep_dim + n0 + tile_cols[None, :]
                    residual = tl.load(x_ptr + where, mask=row_ok, other=0.0, cache_modifier=".cg")
                    update = acc.to(dtype).to(tl.float32)
                    tl.store(
                        x_ptr + where, (residual.to(tl.float32) + update).to(dtype), mask=row_ok
                    )
            grid_sync(counter_ptr, programs)

            # gated FFN in: a program owns the same columns of both halves
            w_ffn_in = w_ffn_in_ptr + at * (2 * hidden * dep_dim)
            for tile in range(pid, hidden // block_n, programs):
                n0 = tile * block_n
                for m0 in range(0, batch, block_m):
                    acc_a = _linear_tile(
                        x_ptr, dep_dim, batch, m0, w_ffn_in, n0, dep_dim, alpha2, eps,
                        True, block_m, block_n, block_k, precision,
                    )  # fmt: skip
                    acc_b = _linear_tile(
                        x_ptr, dep_dim, batch, m0, w_ffn_in, hidden + n0, dep_dim, alpha2, eps,
                        True, block_m, block_n, block_k, precision,
                    )  # fmt: skip
                    a = acc_a.to(dtype).to(tl.float32)
                    silu = (a / (1.0 + tl.exp(-a))).to(dtype).to(tl.float32)
                    gate = silu * acc_b.to(dtype).to(tl.float32)
                    offs_m = m0 + tile_rows
                    where = offs_m[:, None] * hidden + n0 + tile_cols[None, :]
                    tl.store(gate_ptr + where, gate.to(dtype), mask=(offs_m < batch)[:, None])
            grid_sync(counter_ptr, programs)

            # gated FFN out + residual
            w_ffn_out = w_ffn_out_ptr + at * (dep_dim * hidden)
            for tile in range(pid, dep_dim // block_n, programs):
                n0 = tile * block_n
                for m0 in range(0, batch, block_m):
                    acc = _linear_tile(
                        gate_ptr, hidden, batch, m0, w_ffn_out, n0, hidden, alpha2, eps,
                        False, block_m, block_n, block_k, precision,
                    )  # fmt: skip
                    offs_m = m0 + tile_rows
                    row_ok = (offs_m < batch)[:, None]
                    where = offs_m[:, None] * dep_dim + n0 + tile_cols[None, :]
                    residual = tl.load(x_ptr + where, mask=row_ok, other=0.0, cache_modifier=".cg")
                    update = acc.to(dtype).to(tl.float32)
                    tl.store(
                        x_ptr + where, (residual.to(tl.float32) + update).to(dtype), mask=row_ok
                    )
            grid_sync(counter_ptr, programs)

        # output head: logits rounded as the linear's output, kept as fp32
        w_head = w_head_ptr + step * (card * dep_dim)
        for tile in range(pid, card // block_n, programs):
            n0 = tile * block_n
            for m0 in range(0, batch, block_m):
                acc = _linear_tile(
                    x_ptr, dep_dim, batch, m0, w_head, n0, dep_dim, w_head, eps,
                    False, block_m, block_n, block_k, precision,
                )  # fmt: skip
                offs_m = m0 + tile_rows
                where = offs_m[:, None] * card + n0 + tile_cols[None, :]
                logits = acc.to(dtype).to(tl.float32)
                tl.store(logits_ptr + where, logits, mask=(offs_m < batch)[:, None])
        grid_sync(counter_ptr, programs)

    for row in range(pid, batch, programs):
        _choose(
            logits_ptr, noise_ptr, forced_ptr, forced_mask_ptr, out_ptr, row, steps - 1,
            temperature, top_k, steps, card, greedy,
        )  # fmt: skip


def _layers(depformer: Depformer) -> list[DepformerLayer]:
    return [cast(DepformerLayer, layer) for layer in depformer.layers]


def depformer_reference(
    depformer: Depformer,
    hidden: Tensor,
    text: Tensor,
    how: Sampling,
    generator: torch.Generator | None,
    forced: Tensor | None = None,
    forced_mask: Tensor | None = None,
    race: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Depformer.forward's math in plain torch ops on the module's weights, also returning
    the fp32 logits [B, steps, card] (it keeps its own keys and values: the module's scratch
    is left alone).

    Without `race` it draws as Depformer.forward does (same tokens for the same generator
    state); with race: fp32 [B, steps, card] it chooses with those draws (sampling.choose,
    the kernel's rule).
    """
    batch = hidden.shape[0]
    if race is None:
        race = draw_noise(
            (batch, depformer.steps, depformer.linears.shape[1]), hidden.device, how, generator
        )
    layers = _layers(depformer)
    heads = layers[0].self_attn.num_heads
    keys: list[list[Tensor]] = [[] for _ in layers]
    values: list[list[Tensor]] = [[] for _ in layers]
    tokens: list[Tensor] = []
    all_logits: list[Tensor] = []
    previous = text
    for step in range(depformer.steps):
        table = depformer.depformer_text_emb if step == 0 else depformer.depformer_emb[step - 1]
        x = functional.linear(hidden[:, 0], depformer.depformer_in[step])
        x = x + functional.embedding(previous, table)  # [B, dep_dim]
        for index, layer in enumerate(layers):
            attention = layer.self_attn
            normed = rms_norm(x, layer.norm1.alpha[0], RMS_EPS)
            qkv = functional.linear(normed, attention.in_proj[step]).view(batch, 3, heads, -1)
            q, k, v = qkv[:, :, :, None].unbind(1)  # each [B, H, 1, head_dim]
            keys[index].append(k)
            values[index].append(v)
            mixed = functional.scaled_dot_product_attention(
                q, torch.cat(keys[index], dim=2), torch.cat(values[index], dim=2)
            )
            x = x + functional.linear(mixed.reshape(batch, -1), attention.out_proj[step])
            normed = rms_norm(x, layer.norm2.alpha[0], RMS_EPS)
            ffn = layer.gating
            gate = functional.linear(normed, ffn.linear_in[step]).view(batch, 2, -1)
            gated = functional.silu(gate[:, 0]) * gate[:, 1]
            x = x + functional.linear(gated, ffn.linear_out[step])
        logits = functional.linear(x, depformer.linears[step]).float()
        token = choose(logits, how, None if race is None else race[:, step])
        if forced is not None and forced_mask is not None:
            token = torch.where(forced_mask[:, step], forced[:, step], token)
        tokens.append(token)
        all_logits.append(logits)
        previous = token
    return torch.stack(tokens, dim=1), torch.stack(all_logits, dim=1)


@dataclass(frozen=True)
class _Prepared:
    """Per-layer weights stacked per kind ([layers, steps, ...]) and the barrier counter."""

    qkv: Tensor
    out: Tensor
    ffn_in: Tensor
    ffn_out: Tensor
    norm1: Tensor
    norm2: Tensor
    counter: Tensor  # int64 [1], only ever incremented


_PREPARED: "weakref.WeakKeyDictionary[Depformer, _Prepared]" = weakref.WeakKeyDictionary()


def prepare_program(depformer: Depformer) -> None:
    """Stack the layer weights the kernel reads (a copy, ~1.2 GB at 7B in bf16). Call it
    after the weights are loaded and before any CUDA graph capture; depformer_program calls
    it on first use outside a capture."""
    layers = _layers(depformer)
    with torch.no_grad():
        _PREPARED[depformer] = _Prepared(
            qkv=torch.stack([layer.self_attn.in_proj for layer in layers]).contiguous(),
            out=torch.stack([layer.self_attn.out_proj for layer in layers]).contiguous(),
            ffn_in=torch.stack([layer.gating.linear_in for layer in layers]).contiguous(),
            ffn_out=torch.stack([layer.gating.linear_out for layer in layers]).contiguous(),
            norm1=torch.stack([layer.norm1.alpha.reshape(-1) for layer in layers]).contiguous(),
            norm2=torch.stack([layer.norm2.alpha.reshape(-1) for layer in layers]).contiguous(),
            counter=torch.zeros(1, device=depformer.keys.device, dtype=torch.int64),
        )


def _grid_size(device: torch.device) -> int:
    """One program per multiprocessor; one in Triton's interpreter (see module docstring)."""
    if device.type != "cuda":
        return 1
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def _check_residency(compiled: Any, device: torch.device, programs: int) -> None:
    props = torch.cuda.get_device_properties(device)
    compiled._init_handles()  # loads the binary: fills n_regs (Triton's own launch does this)
    warps = int(compiled.metadata.num_warps)
    regs_per_warp = math.ceil(int(compiled.n_regs) * 32 / 256) * 256  # allocation unit: 256
    # registers a block may hold (Triton's driver; on Hopper the same as per multiprocessor)
    registers = triton.runtime.driver.active.utils.get_device_properties(device.index)
    by_regs = int(registers["max_num_regs"]) // max(1, regs_per_warp * warps)
    by_threads = int(props.max_threads_per_multi_processor) // (warps * 32)
    shared = int(compiled.metadata.shared) + 1024  # the runtime reserves 1 KiB per block
    by_shared = int(props.shared_memory_per_multiprocessor) // shared
    per_sm = min(by_regs, by_threads, by_shared)
    resident = per_sm * int(props.multi_processor_count)
    if programs > resident:
        raise RuntimeError(
            f"depformer program: grid of {programs} programs but only {resident} can be "
            f"resident ({compiled.n_regs} registers x {warps} warps, {shared} B shared per "
            "program): the grid barrier would deadlock"
        )


_CHECKED: set[tuple[Any, ...]] = set()


def depformer_program(
    depformer: Depformer,
    hidden: Tensor,
    text: Tensor,
    how: Sampling,
    generator: torch.Generator | None,
    forced: Tensor | None = None,
    forced_mask: Tensor | None = None,
    *,
    race: Tensor | None = None,
) -> Tensor:
    """Depformer.forward as one launch: hidden [B, 1, dim], text int64 [B] -> int64 [B, steps].

    Sampling draws race: fp32 [B, steps, card] ~ Exp(1) with `generator` (one torch op)
    unless `race` is given. Never reads device values on the host: capturable in a CUDA graph
    once prepare_program has run.
    """
    batch, _, dim = hidden.shape
    steps = depformer.steps
    layers = len(depformer.layers)
    w_in = depformer.depformer_in
    _, dep_dim, _ = w_in.shape
    card = depformer.linears.shape[1]
    first = _layers(depformer)[0]
    heads = first.self_attn.num_heads
    head_dim = dep_dim // heads
    ffn_hidden = int(first.gating.linear_out.shape[2])
    keys, values = depformer.keys, depformer.values
    slots = keys.shape[1]
    device = hidden.device
    dtype = w_in.dtype
    assert hidden.shape == (batch, 1, dim), (hidden.shape, dim)
    assert hidden.is_contiguous(), "hidden must be contiguous"
    assert hidden.dtype == dtype, (hidden.dtype, dtype)
    assert text.shape == (batch,), (text.shape, batch)
    assert text.dtype == torch.int64, text.dtype
    assert batch <= slots, (batch, slots)
    for size in (dim, dep_dim, ffn_hidden):
        assert size % BLOCK_K == 0, f"width {size} must divide by BLOCK_K {BLOCK_K}"
        # Triton 3.6's software pipeliner crashed (sm_90) when dep_dim was one K block
        assert size >= 2 * BLOCK_K, f"width {size} must span two BLOCK_K {BLOCK_K} at least"
    for size in (dep_dim, ffn_hidden, card):
        assert size % BLOCK_N == 0, f"width {size} must divide by BLOCK_N {BLOCK_N}"
    for size in (card, heads, head_dim, dep_dim):
        assert size & (size - 1) == 0, f"{size} must be a power of two"
    assert keys.is_contiguous(), "the key scratch must be contiguous"
    assert values.is_contiguous(), "the value scratch must be contiguous"
    if forced is not None and forced_mask is not None:
        assert forced.shape == forced_mask.shape == (batch, steps), (forced.shape, batch)
        assert forced.dtype == torch.int64, forced.dtype
        assert forced_mask.dtype == torch.bool, forced_mask.dtype
        forced_tokens = forced.contiguous()
        forced_flags = forced_mask.contiguous().view(torch.uint8)
    else:
        forced_tokens = torch.zeros(batch, steps, device=device, dtype=torch.int64)
        forced_flags = torch.zeros(batch, steps, device=device, dtype=torch.uint8)
    if depformer not in _PREPARED:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("call prepare_program(depformer) before capturing a CUDA graph")
        prepare_program(depformer)
    prepared = _PREPARED[depformer]
    logits = torch.empty(batch, card, device=device, dtype=torch.float32)
    if how.greedy:
        race = logits  # not read: one compiled kernel for both ways to choose
    elif race is None:
        race = torch.empty(batch, steps, card, device=device, dtype=torch.float32)
        race.exponential_(1.0, generator=generator)
    else:
        assert race.shape == (batch, steps, card), (race.shape, batch, steps, card)
        assert race.dtype == torch.float32, race.dtype
        race = race.contiguous()
    out = torch.empty(batch, steps, device=device, dtype=torch.int64)
    xin = torch.empty(batch, steps * dep_dim, device=device, dtype=dtype)
    x = torch.empty(batch, dep_dim, device=device, dtype=dtype)
    q = torch.empty(batch, dep_dim, device=device, dtype=dtype)
    attn = torch.empty(batch, dep_dim, device=device, dtype=dtype)
    gate = torch.empty(batch, ffn_hidden, device=device, dtype=dtype)
    programs = _grid_size(device)
    args = (
        hidden, text, out, forced_tokens, forced_flags, race,
        w_in, depformer.depformer_text_emb, depformer.depformer_emb,
        prepared.qkv, prepared.out, prepared.ffn_in, prepared.ffn_out,
        prepared.norm1, prepared.norm2, depformer.linears, keys, values,
        xin, x, q, attn, gate, logits, prepared.counter,
        batch, slots, programs, RMS_EPS, 1.0 / math.sqrt(head_dim), int(how.greedy),
        how.temperature if not how.greedy else 1.0, min(how.top_k, card),
    )  # fmt: skip
    constants = dict(
        dim=dim, dep_dim=dep_dim, heads=heads, head_dim=head_dim, hidden=ffn_hidden,
        card=card, steps=steps, steps_pow2=triton.next_power_of_2(steps), layers=layers,
        block_m=BLOCK_M, block_n=BLOCK_N, block_k=BLOCK_K,
        precision="ieee" if dtype == torch.float32 else None, num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )  # fmt: skip
    if device.type == "cuda":
        key = (device, programs, str(dtype), *sorted(constants.items()))
        if key not in _CHECKED:
            compiled = _depformer_kernel.warmup(*args, grid=(programs,), **constants)
            _check_residency(compiled, device, programs)
            _CHECKED.add(key)
    _depformer_kernel[(programs,)](*args, **constants)
    return out
