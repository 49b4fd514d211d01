"""The depth transformer of one frame, for a few slots, as ONE resident Triton launch.

At a few slots the depformer is a chain of ~218 dependent launches of a few microseconds
each (kernels/fused_linear.py, attended_linear.py): every one pays the launch, the drain of
the one before and its own first weight load. Here one program per multiprocessor runs the
whole frame, phases separated by grid barriers, and each program loads its slice of the
NEXT phase's weights before it waits at the barrier, so the weights stream while the grid
gathers (the phase's inputs are a few KB of activations, read from L2 after it):

    for step s:                                       (x: [rows, dep_dim], the residual)
      for layer l:
        qkv    [token +] norm1 + x @ in_proj^T         q to its buffer, k, v to the scratch
        out    x += attention(q, scratch 0..s) @ out_proj^T   (every program attends itself)
        gate   g = silu(a) * b, [a | b] = norm2(x) @ linear_in^T
        down   x += g @ linear_out^T
      head     logits = x @ linears[s]^T
    token: the choice from step s's logits, made by every program at the start of step
           s + 1's first phase (and by program 0 after the last barrier)

25 phases a step, 201 barriers a frame. A phase spreads its output columns over the
programs, column c to program c % programs, whole rows of k each, so a program's weights
are one register tile (sized to the next power of two, the rest masked) and no sum crosses
programs. The rows are at most MAX_ROWS: every program reads all of them, and the products
run on the CUDA cores.

The input projection of all steps (one GEMM, independent of the tokens) and the race's
noise stay separate launches before this one (Depformer.forward). The numerics are the
served kernels': every linear's output rounded to the model dtype, the token embedding
added and rounded (add_fused_linear), RMSNorm in fp32 and rounded, attention in fp32 and
rounded (attended_linear), SiLU and the gate rounded as gated_silu, residual adds rounded;
sums over k run in another order, so bf16 tokens may differ from the torch ops' where two
logits nearly tie. Tokens are chosen by kernels/sampling.py's rule (greedy, or the
exponential race over the top-k set, the k-th largest found by bits), forced where asked.

Grid barrier: one int64 counter, only ever incremented; a program adds 1 and waits for the
next multiple of the grid, so a CUDA graph replays the launch without a reset. All programs
must be resident at once or the barrier never opens: the launcher checks the compiled
program's registers, threads and shared memory against the device before the first launch.
Loads of what other programs wrote in this launch bypass L1 (.cg). In Triton's interpreter
(CPU) programs run one after another, so there the grid is one program.

Weights are read in place from stacked tensors: `prepare_program` moves each layer's step
weights into one [layers, steps, ...] tensor per kind and points the layers' parameters at
its slices (no copy kept).

Not served (Depformer.program_rows is 0): it is slower than the few-rows kernels. Predicted
before measuring (H200, 1 slot): ~2.5 us a phase, ~0.55 ms a frame against 1.08 ms.
Measured (one H200, torch 2.11, Triton 3.6, bf16, random weights, CUDA graphs, each with the
few-rows kernels in the same run; `python3 bench/kernels_depformer.py`,
bench/results/kernels_depformer_program_*.json), 1 slot, ms, greedy / sampling:
- first version (barrier arrival with acq_rel after the weight loads): 1.89 / 1.98 against
  1.02 / 1.24; 2 slots 2.49 / 2.69 against 1.28 / 1.36; 4 slots 5.5 against 1.6. A
  release waits for this program's loads in flight, so the weights did not overlap the
  barrier at all;
- arrival (release) before the next phase's weight loads, the wait after them, and each
  program's residual columns kept in registers (this code): 1.36-1.39 / 1.43-1.46 against
  1.01-1.10 / 1.18-1.23, 6.7 us a phase; 2 slots 1.82-1.84 / 1.92-1.97 against 1.26-1.27 /
  1.28-1.36.
  Its weight loads and barriers alone (bench's _weights_only, same tiles): 0.64 ms a frame,
  a barrier alone 0.95 us. So ~0.7 ms is inside the phases: the L2 round trip for the
  activations after each wait, cross-warp reductions (16 warps), and Triton converting the
  whole weight tile (64 KB, 128 KB at the gate) through shared memory into the activation's
  layout before the product (ttg.convert_layout of tensor<32x1024xbf16> in its TTGIR, built
  for sm_90 on a CPU with Triton 3.6's triton.compile by a script not kept);
- the activations loaded as tiles of the weight's shape instead (no whole-tile conversion,
  bench/results/kernels_depformer_program_tiles.json, reverted): 1.50-1.63 ms, as the
  repeated rows spilled registers (480-760 bytes of stack a thread, same kind of build).
What would make it win (not built): explicit layouts (Triton's Gluon) so that the weight
tile never moves and the activation is broadcast into its layout, and the weights of two
phases in flight (shared memory via TMA rather than registers), towards the 0.64 ms floor.
"""

import math
import weakref
from typing import TYPE_CHECKING, Any, cast

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor, nn

from kernels.device import multiprocessors

if TYPE_CHECKING:  # the model imports this module where it runs it
    from engine.models.moshi.depformer import Depformer, DepformerLayer
from kernels.sampling import key_value, ordered_key

__all__ = ["MAX_ROWS", "arrive", "depformer_program", "prepare_program", "wait_for", "weight_tile"]

MAX_ROWS = 4  # rows of the CUDA-core products; every program reads all of them
WARPS = 16  # one program per multiprocessor: 512 threads, at most 128 registers each
STREAM = tl.constexpr("evict_first")  # weights are read once a frame: they need not stay in L2


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def arrive(counter_ptr, programs: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
    """This program's arrival at the grid barrier; returns the count that opens it (module
    docstring). The release orders this program's earlier stores (and loads) before it, so
    the next phase's weights are loaded after it, not before: a release waits for loads
    still in flight."""
    tl.debug_barrier()  # every warp's stores are issued before the program arrives
    arrived = tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
    return (arrived // programs + 1) * programs


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def wait_for(counter_ptr, target):  # type: ignore[no-untyped-def,unused-ignore]
    """Wait until the barrier's count reaches `target` (arrive's); the polls acquire, so the
    other programs' stores are visible after it."""
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def weight_tile(w_ptr, col, n, k, ks):  # type: ignore[no-untyped-def,unused-ignore]
    """[cols, k_pow2] of weight [n, k] (unit-stride rows): rows `col`, masked past n and k."""
    tile = (col < n)[:, None] & (ks < k)[None, :]
    at = col.to(tl.int64)[:, None] * k + ks[None, :]
    return tl.load(w_ptr + at, mask=tile, other=0.0, eviction_policy=STREAM)


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _rows(ptr, stride, row, row_in, ks, k):  # type: ignore[no-untyped-def,unused-ignore]
    """[block_m, k_pow2] of activations other programs wrote in this launch (.cg)."""
    inside = row_in[:, None] & (ks < k)[None, :]
    at = ptr + row[:, None] * stride + ks[None, :]
    return tl.load(at, mask=inside, other=0.0, cache_modifier=".cg")


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _normed(x, alpha_ptr, ks, eps):  # type: ignore[no-untyped-def,unused-ignore]
    """RMSNorm of x [block_m, k] (k a power of two, every column real) in fp32, rounded."""
    x_f32 = x.to(tl.float32)
    inverse = tl.rsqrt(eps + tl.sum(x_f32 * x_f32, axis=1) / x.shape[1])
    alpha = tl.load(alpha_ptr + ks).to(tl.float32)
    return (x_f32 * (alpha[None, :] * inverse[:, None])).to(x.dtype)


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _times(a, w):  # type: ignore[no-untyped-def,unused-ignore]
    """fp32 [block_m, cols]: a [block_m, k] @ w [cols, k]^T, one row at a time (the
    broadcast product of all rows at once outgrows the registers)."""
    block_m: tl.constexpr = a.shape[0]
    row = tl.arange(0, block_m)
    w_f32 = w.to(tl.float32)
    acc = tl.zeros([block_m, w.shape[0]], tl.float32)
    for r in tl.static_range(block_m):
        a_r = tl.sum(tl.where(row[:, None] == r, a.to(tl.float32), 0.0), axis=0)
        acc = tl.where(row[:, None] == r, tl.sum(w_f32 * a_r[None, :], axis=1)[None, :], acc)
    return acc


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _embedded(projected_ptr, table, token, step, row, row_in, cols, steps, dep_dim):  # type: ignore[no-untyped-def,unused-ignore]
    """[block_m, cols] of step's layer input: its projection + the token's embedding,
    rounded (add_fused_linear's sum)."""
    inside = row_in[:, None] & (cols < dep_dim)[None, :]
    at = row[:, None] * (steps * dep_dim) + step * dep_dim + cols[None, :]
    projected = tl.load(projected_ptr + at, mask=inside, other=0.0)
    embedded = tl.load(table + token[:, None] * dep_dim + cols[None, :], mask=inside, other=0.0)
    return (projected.to(tl.float32) + embedded.to(tl.float32)).to(projected.dtype)


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _add_columns(x_ptr, own, acc, row, row_in, col, n):  # type: ignore[no-untyped-def,unused-ignore]
    """own + acc rounded, as a bf16 `residual + linear(...)` rounds: this program's columns
    of the residual stream x [rows, n], kept in registers; stored for the phases that read
    all of x."""
    updated = (own.to(tl.float32) + acc.to(own.dtype).to(tl.float32)).to(own.dtype)
    inside = row_in[:, None] & (col < n)[None, :]
    tl.store(x_ptr + row[:, None] * n + col[None, :], updated, mask=inside)
    return updated


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _choose(  # type: ignore[no-untyped-def,unused-ignore]
    logits_ptr,
    noise_ptr,
    forced_ptr,
    forced_mask_ptr,
    row,
    row_in,
    step,
    temperature,
    top_k,
    steps: tl.constexpr,
    card: tl.constexpr,
    key_bits: tl.constexpr,
    greedy: tl.constexpr,
):
    """int64 [block_m]: the tokens of `step` from its logits (kernels/sampling.py's rule)."""
    cols = tl.arange(0, card)
    inside = row_in[:, None]
    logits = tl.load(
        logits_ptr + row[:, None] * card + cols[None, :],
        mask=inside,
        other=0.0,
        cache_modifier=".cg",
    ).to(tl.float32)
    if greedy:
        token = tl.argmax(logits, axis=1, tie_break_left=True).to(tl.int64)
    else:
        key = ordered_key(logits)
        kth = tl.zeros([row.shape[0]], tl.uint32)
        bit = tl.full((), 1 << 31, tl.uint32)
        for _ in range(key_bits):
            candidate = kth | bit
            above = tl.sum((key >= candidate[:, None]).to(tl.int32), axis=1)
            kth = tl.where(above >= top_k, candidate, kth)
            bit = bit >> 1
        peak = key_value(tl.max(key, axis=1)) / temperature
        top = key >= kth[:, None]
        entry = (row[:, None] * steps + step) * card + cols[None, :]
        race = tl.load(noise_ptr + entry, mask=top & inside, other=1.0)
        score = tl.where(top, tl.exp(key_value(key) / temperature - peak[:, None]) / race, -1.0)
        token = tl.argmax(score, axis=1, tie_break_left=True).to(tl.int64)
    given = tl.load(forced_ptr + row * steps + step, mask=row_in, other=0)
    flag = tl.load(forced_mask_ptr + row * steps + step, mask=row_in, other=0)
    return tl.where(flag != 0, given, token)


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _attend(  # type: ignore[no-untyped-def,unused-ignore]
    q_ptr, keys_ptr, values_ptr, scratch, row_in, ks, step, scale,
    heads: tl.constexpr, head_dim: tl.constexpr, steps: tl.constexpr, steps_pow2: tl.constexpr,
):  # fmt: skip
    """[block_m, dim] in the model dtype: softmax(q k^T * scale) v over the scratch's entries
    0..step, every head side by side, fp32 inside (attended_linear's math)."""
    block_m: tl.constexpr = scratch.shape[0]
    dim: tl.constexpr = heads * head_dim
    row = tl.arange(0, block_m)
    at = q_ptr + row[:, None] * dim + ks[None, :]
    q = tl.load(at, mask=row_in[:, None], other=0.0, cache_modifier=".cg")
    dtype = q.dtype
    entries = tl.arange(0, steps_pow2)
    at = scratch[:, None, :] + (entries * head_dim)[None, :, None]
    visible = row_in[:, None, None] & (entries <= step)[None, :, None]
    keys = tl.load(keys_ptr + at, mask=visible, other=0.0, cache_modifier=".cg").to(tl.float32)
    products = tl.reshape(
        q.to(tl.float32)[:, None, :] * keys, [block_m, steps_pow2, heads, head_dim]
    )
    scores = tl.sum(products, axis=3) * scale  # [block_m, steps_pow2, heads]
    scores = tl.where((entries <= step)[None, :, None], scores, float("-inf"))
    shares = tl.exp(scores - tl.max(scores, axis=1)[:, None, :])
    total = tl.sum(shares, axis=1)  # [block_m, heads]
    values = tl.load(values_ptr + at, mask=visible, other=0.0, cache_modifier=".cg")
    spread = tl.broadcast_to(shares[:, :, :, None], [block_m, steps_pow2, heads, head_dim])
    mixed = tl.sum(tl.reshape(spread, [block_m, steps_pow2, dim]) * values.to(tl.float32), axis=1)
    per_column = tl.broadcast_to(total[:, :, None], [block_m, heads, head_dim])
    return (mixed / tl.reshape(per_column, [block_m, dim])).to(dtype)


# Triton specializes integers equal to 1 or divisible by 16 into kernels of their own
@triton.jit(do_not_specialize=["batch", "slots", "top_k"])  # type: ignore[untyped-decorator,unused-ignore]
def _program_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    projected_ptr,  # [B, steps * dep_dim]: the input projection of every step
    text_ptr,  # int64 [B]
    out_ptr,  # int64 [B, steps]
    forced_ptr,  # int64 [B, steps]
    forced_mask_ptr,  # uint8 [B, steps]
    noise_ptr,  # fp32 [B, steps, card]: the race's Exp(1) draws (unread when greedy)
    text_emb_ptr,  # [text_card + 1, dep_dim]
    emb_ptr,  # [steps - 1, card + 1, dep_dim]
    qkv_w_ptr,  # [layers, steps, 3 * dep_dim, dep_dim]
    out_w_ptr,  # [layers, steps, dep_dim, dep_dim]
    gate_w_ptr,  # [layers, steps, 2 * hidden, dep_dim]: rows [gate | up]
    down_w_ptr,  # [layers, steps, dep_dim, hidden]
    norm1_ptr,  # [layers, dep_dim]
    norm2_ptr,  # [layers, dep_dim]
    head_w_ptr,  # [steps, card, dep_dim]
    keys_ptr,  # [layers, slots, heads, steps, head_dim]
    values_ptr,  # [layers, slots, heads, steps, head_dim]
    x_ptr,  # [B, dep_dim]: the residual stream
    q_ptr,  # [B, dep_dim]
    gated_ptr,  # [B, hidden]
    logits_ptr,  # [B, card], the model dtype
    counter_ptr,  # int64 [1]: the grid barrier
    batch,
    slots,
    eps,
    scale,
    temperature,
    top_k,
    programs: tl.constexpr,
    dep_dim: tl.constexpr,
    heads: tl.constexpr,
    head_dim: tl.constexpr,
    hidden: tl.constexpr,
    card: tl.constexpr,
    steps: tl.constexpr,
    layers: tl.constexpr,
    block_m: tl.constexpr,
    greedy: tl.constexpr,
    key_bits: tl.constexpr,  # 16 for bf16 logits, else 32 (kernels/sampling.py)
    steps_pow2: tl.constexpr,
    hidden_pow2: tl.constexpr,
    qkv_cols: tl.constexpr,  # a program's output columns in each phase, a power of two
    model_cols: tl.constexpr,
    gate_cols: tl.constexpr,
    head_cols: tl.constexpr,
):
    pid = tl.program_id(0)
    dtype = x_ptr.dtype.element_ty
    # column c of every phase's output belongs to program c % programs
    qkv_col = pid + programs * tl.arange(0, qkv_cols)
    model_col = pid + programs * tl.arange(0, model_cols)
    gate_col = pid + programs * tl.arange(0, gate_cols)
    head_col = pid + programs * tl.arange(0, head_cols)
    row = tl.arange(0, block_m)
    row_in = row < batch
    features = tl.arange(0, dep_dim)
    hiddens = tl.arange(0, hidden_pow2)
    head_of = features // head_dim
    # [block_m, dep_dim]: entry 0 of (row, head, column) in one layer's scratch
    scratch = (row[:, None] * heads + head_of[None, :]) * (steps * head_dim)
    scratch = scratch + (features % head_dim)[None, :]
    # the qkv columns: which of q, k, v, and where in the scratch
    part = qkv_col // dep_dim
    within = qkv_col % dep_dim
    qkv_scratch = (row[:, None] * heads + (within // head_dim)[None, :]) * (steps * head_dim)
    qkv_scratch = qkv_scratch + (within % head_dim)[None, :]
    qkv_in = row_in[:, None] & (qkv_col < 3 * dep_dim)[None, :]
    own = tl.zeros([block_m, model_cols], dtype)  # this program's columns of x (_add_columns)
    for step in range(steps):
        for layer in range(layers):
            at = layer * steps + step
            layer_scratch = layer * slots * heads * steps * head_dim
            # qkv: [the token's embedding added, ] norm1, in_proj
            target = arrive(counter_ptr, programs)
            w = weight_tile(
                qkv_w_ptr + at * (3 * dep_dim * dep_dim), qkv_col, 3 * dep_dim, dep_dim, features
            )
            wait_for(counter_ptr, target)
            if layer == 0:
                if step == 0:
                    token = tl.load(text_ptr + row, mask=row_in, other=0)
                    table = text_emb_ptr
                else:
                    token = _choose(
                        logits_ptr, noise_ptr, forced_ptr, forced_mask_ptr, row, row_in,
                        step - 1, temperature, top_k, steps, card, key_bits, greedy,
                    )  # fmt: skip
                    if pid == 0:
                        tl.store(out_ptr + row * steps + step - 1, token, mask=row_in)
                    table = emb_ptr + (step - 1) * (card + 1) * dep_dim
                x = _embedded(
                    projected_ptr, table, token, step, row, row_in, features, steps, dep_dim
                )
                own = _embedded(
                    projected_ptr, table, token, step, row, row_in, model_col, steps, dep_dim
                )
            else:
                x = _rows(x_ptr, dep_dim, row, row_in, features, dep_dim)
            normed = _normed(x, norm1_ptr + layer * dep_dim, features, eps)
            qkv = _times(normed, w).to(dtype)
            q_at = q_ptr + row[:, None] * dep_dim + within[None, :]
            tl.store(q_at, qkv, mask=qkv_in & (part == 0)[None, :])
            kv_at = layer_scratch + qkv_scratch + step * head_dim
            tl.store(keys_ptr + kv_at, qkv, mask=qkv_in & (part == 1)[None, :])
            tl.store(values_ptr + kv_at, qkv, mask=qkv_in & (part == 2)[None, :])

            # out: attention (every program, all heads) @ out_proj + residual
            target = arrive(counter_ptr, programs)
            w = weight_tile(
                out_w_ptr + at * (dep_dim * dep_dim), model_col, dep_dim, dep_dim, features
            )
            wait_for(counter_ptr, target)
            attended = _attend(
                q_ptr, keys_ptr + layer_scratch, values_ptr + layer_scratch, scratch, row_in,
                features, step, scale, heads, head_dim, steps, steps_pow2,
            )  # fmt: skip
            own = _add_columns(x_ptr, own, _times(attended, w), row, row_in, model_col, dep_dim)

            # gate: norm2, linear_in, silu(gate) * up
            gate_at = gate_w_ptr + at * (2 * hidden * dep_dim)
            target = arrive(counter_ptr, programs)
            w_gate = weight_tile(gate_at, gate_col, hidden, dep_dim, features)
            w_up = weight_tile(gate_at + hidden * dep_dim, gate_col, hidden, dep_dim, features)
            wait_for(counter_ptr, target)
            x = _rows(x_ptr, dep_dim, row, row_in, features, dep_dim)
            normed = _normed(x, norm2_ptr + layer * dep_dim, features, eps)
            gate = _times(normed, w_gate).to(dtype).to(tl.float32)
            silu = (gate / (1.0 + tl.exp(-gate))).to(dtype)
            up = _times(normed, w_up).to(dtype)
            gated = (silu.to(tl.float32) * up.to(tl.float32)).to(dtype)
            gated_in = row_in[:, None] & (gate_col < hidden)[None, :]
            tl.store(gated_ptr + row[:, None] * hidden + gate_col[None, :], gated, mask=gated_in)

            # down + residual
            target = arrive(counter_ptr, programs)
            w = weight_tile(
                down_w_ptr + at * (dep_dim * hidden), model_col, dep_dim, hidden, hiddens
            )
            wait_for(counter_ptr, target)
            g = _rows(gated_ptr, hidden, row, row_in, hiddens, hidden)
            own = _add_columns(x_ptr, own, _times(g, w), row, row_in, model_col, dep_dim)

        # the head: logits rounded to the model dtype, chosen from at the next phase
        target = arrive(counter_ptr, programs)
        w = weight_tile(head_w_ptr + step * (card * dep_dim), head_col, card, dep_dim, features)
        wait_for(counter_ptr, target)
        logits = _times(_rows(x_ptr, dep_dim, row, row_in, features, dep_dim), w).to(dtype)
        logits_in = row_in[:, None] & (head_col < card)[None, :]
        tl.store(logits_ptr + row[:, None] * card + head_col[None, :], logits, mask=logits_in)
    wait_for(counter_ptr, arrive(counter_ptr, programs))
    if pid == 0:
        token = _choose(
            logits_ptr, noise_ptr, forced_ptr, forced_mask_ptr, row, row_in, steps - 1,
            temperature, top_k, steps, card, key_bits, greedy,
        )  # fmt: skip
        tl.store(out_ptr + row * steps + steps - 1, token, mask=row_in)


_STACKED: "weakref.WeakKeyDictionary[Depformer, tuple[Tensor, ...]]" = weakref.WeakKeyDictionary()
_CHECKED: set[tuple[Any, ...]] = set()  # compiled programs checked resident


def _layers(depformer: "Depformer") -> "list[DepformerLayer]":
    return [cast("DepformerLayer", layer) for layer in depformer.layers]


def _kinds(depformer: "Depformer") -> list[list[nn.Parameter]]:
    """Per kind, the layers' parameters the program reads stacked (in the kernel's order)."""
    layers = _layers(depformer)
    return [
        [layer.self_attn.in_proj for layer in layers],
        [layer.self_attn.out_proj for layer in layers],
        [layer.gating.linear_in for layer in layers],
        [layer.gating.linear_out for layer in layers],
        [layer.norm1.alpha for layer in layers],
        [layer.norm2.alpha for layer in layers],
    ]


def prepare_program(depformer: "Depformer") -> tuple[Tensor, ...]:
    """Stack each kind of layer weight into one tensor and point the layers' parameters at
    its slices (module docstring), and allocate the device's barrier counter; a no-op while
    every parameter still points there, else stacked again. Run it outside a CUDA graph
    capture (depformer_program does on its first call)."""
    kinds = _kinds(depformer)
    stacked = _STACKED.get(depformer)
    if stacked is not None and all(
        param.data_ptr() == whole[index].data_ptr()
        for params, whole in zip(kinds, stacked, strict=True)
        for index, param in enumerate(params)
    ):
        return stacked
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("call prepare_program(depformer) before capturing a CUDA graph")
    with torch.no_grad():
        stacked = tuple(torch.stack([param.data for param in params]) for params in kinds)
        for params, whole in zip(kinds, stacked, strict=True):
            for index, param in enumerate(params):
                param.data = whole[index]
    _STACKED[depformer] = stacked
    _counter(stacked[0].device)
    return stacked


def _check_residency(compiled: Any, device: torch.device, programs: int) -> None:
    """Refuse a grid that cannot be resident at once (its barrier would never open)."""
    props = torch.cuda.get_device_properties(device)
    compiled._init_handles()  # loads the binary: fills n_regs (Triton's own launch does this)
    warps = int(compiled.metadata.num_warps)
    regs_per_warp = math.ceil(int(compiled.n_regs) * 32 / 256) * 256  # allocation unit: 256
    registers = triton.runtime.driver.active.utils.get_device_properties(device.index)
    by_regs = int(registers["max_num_regs"]) // max(1, regs_per_warp * warps)
    by_threads = int(props.max_threads_per_multi_processor) // (warps * 32)
    shared = int(compiled.metadata.shared) + 1024  # the runtime reserves 1 KiB per block
    by_shared = int(props.shared_memory_per_multiprocessor) // shared
    resident = min(by_regs, by_threads, by_shared) * int(props.multi_processor_count)
    if programs > resident:
        raise RuntimeError(
            f"depformer program: grid of {programs} programs but only {resident} can be "
            f"resident ({compiled.n_regs} registers x {warps} warps, {shared} B shared per "
            "program): its barrier would never open"
        )


def depformer_program(
    depformer: "Depformer",
    projected: Tensor,
    text: Tensor,
    greedy: bool,
    temperature: float,
    top_k: int,
    noise: Tensor | None,
    forced: Tensor | None = None,
    forced_mask: Tensor | None = None,
) -> Tensor:
    """The frame's tokens int64 [B, steps] (module docstring), one launch.

    depformer: engine/models/moshi/depformer.py's Depformer; projected: [B, steps * dep_dim]
    its input projection of every step (unit-stride rows); text: int64 [B]; noise: fp32
    [B, steps, card] Exp(1) draws (None only when greedy); forced: int64 [B, steps] where
    forced_mask: bool [B, steps]. Never reads device values on the host: capturable once
    prepared.
    """
    qkv_w, out_w, gate_w, down_w, norm1, norm2 = prepare_program(depformer)
    text_emb, emb, head_w = depformer.depformer_text_emb, depformer.depformer_emb, depformer.linears
    keys, values = depformer.keys, depformer.values
    layers, slots, heads, steps, head_dim = keys.shape
    dep_dim = heads * head_dim
    hidden = down_w.shape[-1]
    card = head_w.shape[1]
    batch = projected.shape[0]
    dtype = head_w.dtype
    device = projected.device
    assert 1 <= batch <= min(MAX_ROWS, slots), f"{batch} rows: 1 to {min(MAX_ROWS, slots)}"
    assert projected.shape == (batch, steps * dep_dim), (projected.shape, steps, dep_dim)
    assert projected.stride(-1) == 1, f"projected rows must be unit-stride: {projected.stride()}"
    assert projected.dtype == dtype, (projected.dtype, dtype)
    assert text.shape == (batch,), (text.shape, batch)
    assert text.dtype == torch.int64, text.dtype
    for width in (dep_dim, head_dim, card):
        assert width & (width - 1) == 0, f"{width} must be a power of two"
    assert keys.is_contiguous(), "the key scratch must be contiguous"
    assert values.is_contiguous(), "the value scratch must be contiguous"
    if greedy:
        noise = projected  # not read: one signature for both ways to choose
    else:
        assert noise is not None, "top-k sampling needs its noise"
        assert noise.shape == (batch, steps, card), (noise.shape, batch, steps, card)
        assert noise.dtype == torch.float32, noise.dtype
        assert noise.is_contiguous(), f"noise must be contiguous: {noise.stride()}"
    if forced is not None and forced_mask is not None:
        assert forced.shape == forced_mask.shape == (batch, steps), (forced.shape, batch)
        assert forced.dtype == torch.int64, forced.dtype
        assert forced_mask.dtype == torch.bool, forced_mask.dtype
        forced, flags = forced.contiguous(), forced_mask.contiguous().view(torch.uint8)
    else:
        assert forced is None, "forced needs forced_mask"
        assert forced_mask is None, "forced_mask needs forced"
        forced = torch.zeros(batch, steps, device=device, dtype=torch.int64)
        flags = torch.zeros(batch, steps, device=device, dtype=torch.uint8)
    out = torch.empty(batch, steps, device=device, dtype=torch.int64)
    x = torch.empty(batch, dep_dim, device=device, dtype=dtype)
    q = torch.empty(batch, dep_dim, device=device, dtype=dtype)
    gated = torch.empty(batch, hidden, device=device, dtype=dtype)
    logits = torch.empty(batch, card, device=device, dtype=dtype)
    counter = _counter(device)
    programs = multiprocessors(device, 1)  # one in the interpreter: module docstring
    args = (
        projected, text, out, forced, flags, noise, text_emb, emb,
        qkv_w, out_w, gate_w, down_w, norm1, norm2, head_w, keys, values,
        x, q, gated, logits, counter,
        batch, slots, _layers(depformer)[0].norm1.eps, head_dim**-0.5,
        temperature if not greedy else 1.0, min(top_k, card),
    )  # fmt: skip

    def columns(width: int) -> int:
        return int(triton.next_power_of_2(triton.cdiv(width, programs)))

    constants = dict(
        programs=programs, dep_dim=dep_dim, heads=heads, head_dim=head_dim, hidden=hidden,
        card=card, steps=steps, layers=layers, block_m=triton.next_power_of_2(batch),
        greedy=greedy, key_bits=16 if dtype == torch.bfloat16 else 32,
        steps_pow2=triton.next_power_of_2(steps), hidden_pow2=triton.next_power_of_2(hidden),
        qkv_cols=columns(3 * dep_dim), model_cols=columns(dep_dim), gate_cols=columns(hidden),
        head_cols=columns(card), num_warps=WARPS,
    )  # fmt: skip
    if device.type == "cuda":
        key = (device, str(dtype), *sorted(constants.items()))
        if key not in _CHECKED:
            compiled = _program_kernel.warmup(*args, grid=(programs,), **constants)
            _check_residency(compiled, device, programs)
            _CHECKED.add(key)
    _program_kernel[(programs,)](*args, **constants)
    return out


_COUNTERS: dict[torch.device, Tensor] = {}


def _counter(device: torch.device) -> Tensor:
    """The device's barrier counter (int64 [1]), allocated by prepare_program, outside any
    capture."""
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros(1, device=device, dtype=torch.int64)
    return _COUNTERS[device]
