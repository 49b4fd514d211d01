"""Fused kernels of Mimi's streaming transformers (fp32, T = 2 encoder frames per step).

Eager, a Mimi layer launches ~55 kernels on CUDA (RoPE alone is ~20 ops per tensor, the ring
write ~6, the mask and SDPA a few more, layer scale and residual 2 each), most of them on a few
KiB of data, so a layer costs ~2.5 us per launch rather than its arithmetic. Two kernels take
over everything between the matrix products:

- `ring_attention_step`: RoPE, ring write and attention of one step, flash-decoding style.
  The ring layout and validity rule are engine/models/moshi/attention.py's (entry j holds the
  newest position p = j mod capacity up to the last query; a query attends p >= 0 within
  `context` and not after it). Grid (slots * heads, splits): every program of a (slot, head)
  rotates this step's q and k (interleaved RoPE from per-token cos/sin tables the caller
  computes once per step for all layers) and keeps them in registers; split 0 alone writes k
  and v into the ring at positions start..start+T-1 and attends the T queries to them from
  registers (causally), while each split attends the older entries of its own run of
  `tiles_per_split` tiles of `block_n` entries, never this step's, so no program reads an entry
  another one writes. Each keeps an online softmax (base-2, log2(e) folded into the scale;
  for T = 2 one per tile row, merged after the loop: _attend_older_pair) and stores its
  partial (max, sum, acc) per query; the last program of a (slot, head) to
  arrive (kernels/arrivals.py) rescales the row's partials to their common max, normalises
  and writes the output (whichever program it is, it merges the same partials the same
  way). With one split the program normalises and writes the output itself: one launch
  either way (the merge was a second launch until the last-to-arrive form, which has no A/B
  of its own on the GPU: the stages timed since include it). In a call younger than the ring
  the visible entries form one unwrapped run of indices and tiles outside it are skipped.

      qkv:          fp32 [slots, T, 3 * heads * head_dim]   the in_proj output, [q | k | v]
      cos, sin:     fp32 [slots, T, head_dim / 2]
      keys, values: fp32 [slots, heads, capacity, head_dim] one layer's ring, contiguous
      start:        int64 [slots]
      -> out:       fp32 [slots, T, heads * head_dim]        ready for out_proj

- `residual_layer_norm`: h = x + scale * update (the layer scale and residual), and
  LayerNorm(h) for the next sublayer, one program per token.

Measured on one H200 (bench/mimi_gpu.py, bench/results/mimi_gpu.json; with the rest of the
fused codec): the encode stage fell from 714 to 197 kernels and the decode from 606 to 179
at 1 slot (180 with the split form of the attention kernel and its merge launch,
mimi_gpu.json as committed; the merge is in the split launch since, not re-counted).
At 300 slots the first form of the attention kernel, one program per (slot, head) walking
its 4 tiles of 64 in series and reading this step's keys back after a barrier, was the slow
part: 3.27 ms for 8 layers = 408 us per layer for 307 MB of K+V (0.75 TB/s).

Predicted before the split form ran: with one tile per program (4 splits of 64 entries,
9600 programs at 300 slots), each program's K and V loads (32 KiB) are in flight together and
every SM holds several programs, so the layer should read its rings at 2.5-3 TB/s: ~110 us
per layer at 300 slots, ~50 at 128, and the encode and decode stages ~2.4 ms faster at 300
slots. ptxas (sm_90, triton 3.9 here) gives the 64 x 4-warp program 198 registers and no
spills (2 programs per SM), 32 x 4 warps 150, 32 x 8 warps 103; 64 x 2 and 128 x 4 spill.

Measured (python3 bench/mimi_gpu.py --slots 1,128,300, H200, triton 3.6, full rings; us per
layer, the kernel alone in a CUDA graph, the split shapes with their merge launch then), block
x tiles per split x warps:

    slots   16x1x4   32x1x4   32x1x8   64x1x4   64x1x8   32x2x4   64x4x4 (unsplit)
    1         5.1      5.9      6.1      7.9      7.5      8.3     17.3
    128     134.4    113.4    153.2    110.9    175.8    100.4     92.7
    300     314.0    268.7    371.0    260.5    427.0    228.2    210.9  (1.46 TB/s)

The prediction was wrong: splitting lost at 128 and 300 slots (1024 and 2400 unsplit
programs already fill the chip, 2 per SM at 198 registers) since every split loads and
rotates q and k again, stores partials and needed the merge launch; fewer tiles per program
was slower each time. The unsplit program of this form still halves the first one (408 ->
211 us at 300 slots; in the codec 3.27 -> 1.71 ms for 8 layers): K and V come as contiguous
rows (RoPE interleaved in registers, not two strided half-loads), both tiles are loaded
before any arithmetic, and nothing waits on a barrier to read this step's keys back. It is
the default from one program per multiprocessor on; below that (1 slot: 8 programs) splits
win instead (17.3 -> 5.1 us per layer) and are taken (step_shape, its table). That form was
still 3x short of the 4.8 TB/s read (its tile products live as [T, 64, 64] registers and it
reduces across the tile's rows at every tile); for T = 2, Mimi's step, the pair form
(_attend_older_pair) reads the full rings at 2.8 TB/s at 300 slots, 1.8x the generic form
(the table at step_shape).

The merge in the split launch costs registers (Triton 3.6's sm_90 build with
triton.compile, as bench/kernels_ring_sass.py builds the ring's; that script for this kernel
was not kept; no spills; 8 heads x 64, 250-frame rings):
16x1x4 110 -> 115, 32x2x4 159 -> 168 (still 3 programs per SM), 32x1x4 159 -> 202 (taken
then at 9-16 rows; no longer taken). Those counts are of the generic form; the pair form's
(two [block_n, head_dim] fp32 accumulators beside the K and V tiles) were not counted.

Each launcher asserts shapes, dtypes and strides, allocates only buffers whose size the
shapes fix (the merge's arrival counts once per device, outside any capture: run each shape
once before capturing), and never reads device values on the host, so it can be captured in a
CUDA graph.
Sums run in a different order than torch's kernels: results agree to fp32 rounding, not bit for bit
(tests/kernels/test_mimi_transformer.py bounds it; tests/kernels/test_mimi_codec.py compares
the codes of the whole codec).
"""

import math

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor
from torch.nn import functional

from kernels.arrivals import arrival_counts, last_to_arrive
from kernels.dependent_launch import dependent, wait_for_inputs
from kernels.device import multiprocessors
from kernels.ring_attention import cyclic_split

# The step kernel's shape, (block_n, tiles_per_split, num_warps): block_n ring entries per
# tile, tiles_per_split tiles walked by one program (the ring is split over
# ceil(tiles / tiles_per_split)). With T = 2 (Mimi's step) the older entries go through
# _attend_older_pair: each query's vectors apart in the tile's own layout and each tile row's
# softmax state kept until the loop ends, where the generic form broadcasts [T, block_n,
# head_dim] products and reduces across the tile's rows at every tile. Measured on one H200
# (Moshi's Mimi: 8 heads, full 250-frame rings; `python3 bench/mimi_gpu.py --slots
# 1,8,32,128,300 --sweep-only`, bench/results/mimi_gpu_attention_pair_sweep_052c7e3.json), us
# per layer, the generic form's served shapes before against the pair form's:
#
#     slots                 1      8     32    128    300
#     generic, served     5.3   10.9   21.2   85.8  195.6   (16x1x4, 32x2x4, 64x4x4 2 stages)
#     pair 16x1x4        [5.1]  11.3   31.4  118.8  275.7
#     pair 32x2x4         5.6   [6.5]  14.6   61.0  139.4
#     pair 64x4x4         7.2    7.4  [10.1] [48.0] [109.6]  (2.8 TB/s at 300)
#     pair 32x8x4 2 st.   8.5    8.7   13.0   47.9  105.4   (a pipelined loop, since removed)
#
# (in brackets: what step_shape takes, by rows = slots * heads against the multiprocessors;
# 2 to 4 slots were not swept with the pair form: they take SPLIT_SHAPE, the 8-slot best).
# Pipelining the tile loop two deep gained 5-7% in the generic form (91.7 -> 86.3 at 128
# slots); in the pair form it lost at 64x4x4 (50.6 against 48.0) and at 32x8x4 tied it at
# 128 and gained 4% at 300 (105.4 against 109.6) but lost at 32 (13.0 against 10.1), so the
# loop is not pipelined and one shape serves from the chip up. Two other generic forms were
# no faster and were dropped: fp32 tl.dot with the queries padded
# to 16 (123-134 us at 128 slots; mimi_gpu_attention_dot_sweep_a5f1945.json) and the per-row
# softmax state alone, with the [T, block_n, head_dim] products kept (84.1 at best at 128;
# mimi_gpu_attention_per_row_sweep_ffb5485.json). Before the pair form (T = 2 then through
# the generic form; bench/results/mimi_gpu_attention_crossover.json, 9 slot counts), 64x4x4
# took 92.5 us at 128 slots, splits won below 17 slots, and 32x2x4 from 4.
# 64 x 64 fp32 K and V tiles (and the pair form's two accumulators) in 4 warps' registers
FULL_CHIP_SHAPE = (64, 4, 4)
# below one program per multiprocessor (rows: the unsplit grid's programs, slots * heads):
# SMALL_SPLIT_SHAPE up to SMALL_SPLIT_ROWS rows (1 slot), else SPLIT_SHAPE
SMALL_SPLIT_ROWS = 8
SMALL_SPLIT_SHAPE = (16, 1, 4)
SPLIT_SHAPE = (32, 2, 4)
# a running max below any real score but finite: a fully masked tile rescales by exp2(0) = 1
EMPTY_MAX = -1.0e30


def rope_tables(positions: Tensor, freqs: Tensor) -> tuple[Tensor, Tensor]:
    """cos, sin: fp32 [slots, T, head_dim / 2] for positions int64 [slots, T] and the
    frequencies fp32 [head_dim / 2], in the arithmetic of attention.apply_rope."""
    angles = freqs * positions.to(torch.float32)[..., None]
    return torch.cos(angles), torch.sin(angles)


def ring_attention_step_reference(
    qkv: Tensor,
    cos: Tensor,
    sin: Tensor,
    keys: Tensor,
    values: Tensor,
    start: Tensor,
    context: int,
) -> Tensor:
    """The kernel's contract in torch: writes the rings, returns [slots, T, dim]."""
    slots, steps, width = qkv.shape
    heads, capacity, head_dim = keys.shape[1:]
    dim = width // 3
    q, k, v = qkv.view(slots, steps, 3, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def rotate(x: Tensor) -> Tensor:  # [slots, heads, T, head_dim]
        real, imag = x[..., 0::2], x[..., 1::2]
        c, s = cos[:, None], sin[:, None]
        return torch.stack([real * c - imag * s, real * s + imag * c], dim=-1).flatten(-2)

    q, k = rotate(q), rotate(k)
    positions = start[:, None] + torch.arange(steps, device=start.device)  # [slots, T]
    entry = torch.remainder(positions, capacity)
    rows = torch.arange(slots, device=start.device)[:, None]
    keys[rows, :, entry] = k.transpose(1, 2)
    values[rows, :, entry] = v.transpose(1, 2)
    last = positions[:, -1:]
    key_pos = last - torch.remainder(last - torch.arange(capacity, device=start.device), capacity)
    delta = positions[:, :, None] - key_pos[:, None, :]  # [slots, T, capacity]
    visible = (key_pos[:, None, :] >= 0) & (delta >= 0) & (delta < context)
    out = functional.scaled_dot_product_attention(q, keys, values, attn_mask=visible[:, None])
    return out.transpose(1, 2).reshape(slots, steps, dim)


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _rotate(x, cos, sin):  # type: ignore[no-untyped-def,unused-ignore]
    """Interleaved RoPE of x [T, head_dim] with cos, sin [T, head_dim / 2], in registers."""
    real, imag = tl.split(tl.reshape(x, (x.shape[0], x.shape[1] // 2, 2)))
    rotated = tl.join(real * cos - imag * sin, real * sin + imag * cos)
    return tl.reshape(rotated, (x.shape[0], x.shape[1]))


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _older_run(start, steps: tl.constexpr, capacity, context, split, split_frames):  # type: ignore[no-untyped-def,unused-ignore]
    """(final, oldest, lo, hi): the older entries one split attends, for the T = `steps`
    queries at positions start..start+T-1.

    Ring entry j is age = (final - j) mod capacity frames older than the last query (final:
    its entry). Older entries (age >= T) are attended by query i when age <= last (position
    >= 0) and age < context + reach_i (reach_i = T - 1 - i); those of all queries form one
    cyclic run of indices, which does not wrap in a call younger than the ring: there the
    split's entries [lo, hi) are cut to it, so tiles outside it are skipped."""
    last = start + steps - 1
    final = (last % capacity).to(tl.int32)
    oldest = tl.minimum(last, context + steps - 2).to(tl.int32)
    lo, hi = cyclic_split(final, oldest, steps, capacity, split, split_frames)
    return final, oldest, lo, hi


# the ints stay unspecialised: a swept split size or split count compiles no new program
# (unless the merge's width, splits_pow2, changes)
@triton.jit(do_not_specialize=["capacity", "context", "split_frames", "splits"])  # type: ignore[untyped-decorator,unused-ignore]
def _ring_attention_step_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    keys_ptr,
    values_ptr,
    start_ptr,
    out_ptr,
    max_ptr,
    sum_ptr,
    acc_ptr,
    arrived_ptr,
    capacity,
    context,
    split_frames,
    splits,
    qk_scale_log2,
    heads: tl.constexpr,
    head_dim: tl.constexpr,
    steps: tl.constexpr,
    block_n: tl.constexpr,
    splits_pow2: tl.constexpr,
    empty: tl.constexpr,
    direct: tl.constexpr,
    pair: tl.constexpr,
    pdl: tl.constexpr,
):
    wait_for_inputs(pdl)
    row = tl.program_id(0)  # slot * heads + head
    split = tl.program_id(1)
    slot = row // heads
    head = row % heads
    ring = row.to(tl.int64) * capacity * head_dim
    dim: tl.constexpr = heads * head_dim
    half: tl.constexpr = head_dim // 2
    pairs = tl.arange(0, half)
    dims = tl.arange(0, head_dim)
    tokens = tl.arange(0, steps)
    start = tl.load(start_ptr + slot)
    token = (slot * steps + tokens).to(tl.int64)  # [T]
    base = token[:, None] * (3 * dim) + head * head_dim + dims[None, :]
    table = token[:, None] * half + pairs[None, :]
    cos = tl.load(cos_ptr + table)
    sin = tl.load(sin_ptr + table)
    # every program of the row rotates this step's q and k: they stay in registers
    q = _rotate(tl.load(qkv_ptr + base), cos, sin)  # [T, head_dim]
    k_new = _rotate(tl.load(qkv_ptr + base + dim), cos, sin)
    v_new = tl.load(qkv_ptr + base + 2 * dim)
    if split == 0:  # the only writer; no program reads these entries in this step
        written = ring + ((start + tokens) % capacity).to(tl.int64)[:, None] * head_dim
        tl.store(keys_ptr + written + dims[None, :], k_new)
        tl.store(values_ptr + written + dims[None, :], v_new)

    # Query i (position start + i) lies reach_i = T - 1 - i positions before the last one.
    # This step's keys (ages 0..T-1 from the last query's entry) come from registers, in
    # split 0 only: key j is seen by query i when 0 <= i - j < context.
    reach = steps - 1 - tokens  # [T]
    own = tl.sum(q[:, None, :] * k_new[None, :, :], axis=2) * qk_scale_log2  # [T, T]
    seen = (tokens[None, :] <= tokens[:, None]) & (tokens[:, None] - tokens[None, :] < context)
    own = tl.where(seen & (split == 0), own, float("-inf"))
    run_max = tl.maximum(tl.max(own, axis=1), empty)
    own = tl.exp2(own - run_max[:, None])
    run_sum = tl.sum(own, axis=1)
    acc = tl.sum(own[:, :, None] * v_new[None, :, :], axis=1)  # [T, head_dim]

    final, oldest, lo, hi = _older_run(start, steps, capacity, context, split, split_frames)
    if pair:
        run_max, run_sum, acc = _attend_older_pair(
            q, run_max, run_sum, acc, keys_ptr, values_ptr, ring, lo, hi, final, oldest,
            capacity, context, qk_scale_log2, head_dim, block_n, empty,
        )  # fmt: skip
    else:
        for first in range(lo, hi, block_n):
            age, live, k, v = _older_tile(
                keys_ptr, values_ptr, ring, first, hi, final, oldest, capacity, steps,
                head_dim, block_n,
            )  # fmt: skip
            scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * qk_scale_log2  # [T, block_n]
            valid = live[None, :] & (age[None, :] < context + reach[:, None])
            scores = tl.where(valid, scores, float("-inf"))
            new_max = tl.maximum(run_max, tl.max(scores, axis=1))
            rescale = tl.exp2(run_max - new_max)
            weights = tl.exp2(scores - new_max[:, None])
            run_sum = run_sum * rescale + tl.sum(weights, axis=1)
            acc = acc * rescale[:, None] + tl.sum(weights[:, :, None] * v[None, :, :], axis=1)
            run_max = new_max
    if direct:  # one split: every query saw at least its own key, run_sum > 0
        out = acc / run_sum[:, None]
        tl.store(out_ptr + token[:, None] * dim + head * head_dim + dims[None, :], out)
    else:
        partial = (row * splits + split).to(tl.int64) * steps + tokens  # [T]
        tl.store(max_ptr + partial, run_max)
        tl.store(sum_ptr + partial, run_sum)
        tl.store(acc_ptr + partial[:, None] * head_dim + dims[None, :], acc)
        if last_to_arrive(arrived_ptr, row, splits):
            _merge_splits(
                max_ptr, sum_ptr, acc_ptr, out_ptr, row, splits, heads, head_dim, steps,
                splits_pow2, empty,
            )  # fmt: skip


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _attend_older_pair(  # type: ignore[no-untyped-def,unused-ignore]
    q,
    run_max,
    run_sum,
    acc,
    keys_ptr,
    values_ptr,
    ring,
    lo,
    hi,
    final,
    oldest,
    capacity,
    context,
    qk_scale_log2,
    head_dim: tl.constexpr,
    block_n: tl.constexpr,
    empty: tl.constexpr,
):
    """The ring's older entries for T = 2 queries, each query's vectors apart ([head_dim],
    [block_n], [block_n, head_dim] in the tile's own layout: no [T, block_n, head_dim]
    products), and each tile row keeping its own running max, sum and output until the
    loop ends (so no step reduces across the tile's rows); merged then with this step's
    keys' state (run_max, run_sum, acc: [2], [2], [2, head_dim]), which it returns updated."""
    tokens = tl.arange(0, 2)
    first_q = tokens[:, None] == 0
    q0 = tl.sum(tl.where(first_q, q, 0.0), axis=0)  # [head_dim]
    q1 = tl.sum(tl.where(first_q, 0.0, q), axis=0)
    max0 = tl.full([block_n], empty, tl.float32)
    max1 = tl.full([block_n], empty, tl.float32)
    sum0 = tl.zeros([block_n], dtype=tl.float32)
    sum1 = tl.zeros([block_n], dtype=tl.float32)
    acc0 = tl.zeros([block_n, head_dim], dtype=tl.float32)
    acc1 = tl.zeros([block_n, head_dim], dtype=tl.float32)
    for first in range(lo, hi, block_n):
        age, live, k, v = _older_tile(
            keys_ptr, values_ptr, ring, first, hi, final, oldest, capacity, 2, head_dim, block_n
        )
        # query 0 lies one position before query 1: it reaches one entry further back
        score0 = tl.sum(k * q0[None, :], axis=1) * qk_scale_log2  # [block_n]
        score0 = tl.where(live & (age < context + 1), score0, float("-inf"))
        score1 = tl.sum(k * q1[None, :], axis=1) * qk_scale_log2
        score1 = tl.where(live & (age < context), score1, float("-inf"))
        max0, sum0, acc0 = _rows_online_softmax(score0, v, max0, sum0, acc0)
        max1, sum1, acc1 = _rows_online_softmax(score1, v, max1, sum1, acc1)
    # this step's keys' state of each query, then every row's, to their common max
    first_t = tokens == 0
    own_max0 = tl.sum(tl.where(first_t, run_max, 0.0), axis=0)
    own_max1 = tl.sum(tl.where(first_t, 0.0, run_max), axis=0)
    top0 = tl.maximum(own_max0, tl.max(max0, axis=0))
    top1 = tl.maximum(own_max1, tl.max(max1, axis=0))
    rows0 = tl.exp2(max0 - top0)  # [block_n]
    rows1 = tl.exp2(max1 - top1)
    top = tl.where(first_t, top0, top1)  # [2]
    own_scale = tl.exp2(run_max - top)
    rows_sum = tl.where(first_t, tl.sum(sum0 * rows0, axis=0), tl.sum(sum1 * rows1, axis=0))
    rows_acc0 = tl.sum(acc0 * rows0[:, None], axis=0)  # [head_dim]
    rows_acc1 = tl.sum(acc1 * rows1[:, None], axis=0)
    rows_acc = tl.where(first_q, rows_acc0[None, :], rows_acc1[None, :])  # [2, head_dim]
    return top, run_sum * own_scale + rows_sum, acc * own_scale[:, None] + rows_acc


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _older_tile(  # type: ignore[no-untyped-def,unused-ignore]
    keys_ptr,
    values_ptr,
    ring,
    first,
    hi,
    final,
    oldest,
    capacity,
    steps: tl.constexpr,
    head_dim: tl.constexpr,
    block_n: tl.constexpr,
):
    """The tile of ring entries first..first + block_n: each entry's age (frames before the
    last query's), whether it is an older entry to attend (inside the run, older than this
    step's `steps` keys, not before position 0), and its K and V [block_n, head_dim], zero
    where not live. Both loads before any arithmetic: they are in flight together."""
    index = first + tl.arange(0, block_n)
    age = final - index
    age = tl.where(age < 0, age + capacity, age)
    live = (index < hi) & (age >= steps) & (age <= oldest)
    entry = ring + index.to(tl.int64)[:, None] * head_dim + tl.arange(0, head_dim)[None, :]
    k = tl.load(keys_ptr + entry, mask=live[:, None], other=0.0)
    v = tl.load(values_ptr + entry, mask=live[:, None], other=0.0)
    return age, live, k, v


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _rows_online_softmax(scores, v, row_max, row_sum, row_acc):  # type: ignore[no-untyped-def,unused-ignore]
    """One tile into each tile row's own online softmax (one query): scores [block_n],
    v [block_n, head_dim]; returns the rows' max, sum [block_n] and output [block_n,
    head_dim], each row rescaled to its own new max."""
    new_max = tl.maximum(row_max, scores)
    rescale = tl.exp2(row_max - new_max)
    weights = tl.exp2(scores - new_max)
    return new_max, row_sum * rescale + weights, row_acc * rescale[:, None] + weights[:, None] * v


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _merge_splits(  # type: ignore[no-untyped-def,unused-ignore]
    max_ptr,
    sum_ptr,
    acc_ptr,
    out_ptr,
    row,
    splits,
    heads: tl.constexpr,
    head_dim: tl.constexpr,
    steps: tl.constexpr,
    splits_pow2: tl.constexpr,
    empty: tl.constexpr,
):
    """The (slot, head) row's T outputs from its splits' partials, by the last of its programs
    to arrive (kernels/arrivals.py): rescaled to their common max and normalised."""
    slot = row // heads
    head = row % heads
    dim: tl.constexpr = heads * head_dim
    parts = tl.arange(0, splits_pow2)
    tokens = tl.arange(0, steps)
    dims = tl.arange(0, head_dim)
    present = (parts < splits)[:, None, None]
    partial = (row * splits + parts).to(tl.int64)[:, None] * steps + tokens[None, :]
    partial = partial[:, :, None]  # [S, T, 1]: every operand in the layout of the [S, T, D] one
    # .cg: the other programs' partials come from L2 (the L1 is not coherent)
    part_max = tl.load(max_ptr + partial, mask=present, other=empty, cache_modifier=".cg")
    part_sum = tl.load(sum_ptr + partial, mask=present, other=0.0, cache_modifier=".cg")
    part_acc = tl.load(
        acc_ptr + partial * head_dim + dims[None, None, :],
        mask=present,
        other=0.0,
        cache_modifier=".cg",
    )
    # a split with no visible entry carries empty and a zero sum: its weight underflows to 0
    scale = tl.exp2(part_max - tl.max(part_max, axis=0)[None, :, :])  # [S, T, 1]
    total = tl.sum(part_sum * scale, axis=0)  # [T, 1], > 0: split 0 holds each query's own key
    out = tl.sum(part_acc * scale, axis=0) / total  # [T, head_dim]
    token = (slot * steps + tokens).to(tl.int64)
    tl.store(out_ptr + token[:, None] * dim + head * head_dim + dims[None, :], out)


def step_shape(rows: int, device: torch.device) -> tuple[int, int, int]:
    """The step kernel's (block_n, tiles_per_split, num_warps) for `rows` (slot, head) pairs:
    split while the unsplit grid is below one program per multiprocessor, else
    FULL_CHIP_SHAPE (table above)."""
    if rows >= multiprocessors(device, 1):
        return FULL_CHIP_SHAPE
    return SMALL_SPLIT_SHAPE if rows <= SMALL_SPLIT_ROWS else SPLIT_SHAPE


def ring_attention_step(
    qkv: Tensor,
    cos: Tensor,
    sin: Tensor,
    keys: Tensor,
    values: Tensor,
    start: Tensor,
    context: int,
    block_n: int | None = None,
    tiles_per_split: int | None = None,
    num_warps: int | None = None,
    pair: bool | None = None,
) -> Tensor:
    """RoPE, ring write and attention of one step (module docstring) -> fp32 [slots, T, dim].
    `block_n`, `tiles_per_split` and `num_warps` shape the program (None: step_shape's);
    `pair`: the older entries through _attend_older_pair (T = 2 only; None: where T = 2)."""
    slots, steps, width = qkv.shape
    _, heads, capacity, head_dim = keys.shape
    shape = step_shape(slots * heads, qkv.device)
    block_n = shape[0] if block_n is None else block_n
    tiles_per_split = shape[1] if tiles_per_split is None else tiles_per_split
    num_warps = shape[2] if num_warps is None else num_warps
    pair = steps == 2 if pair is None else pair
    dim = heads * head_dim
    assert width == 3 * dim, (qkv.shape, keys.shape)
    assert keys.shape == (slots, heads, capacity, head_dim), (keys.shape, slots)
    assert values.shape == keys.shape, (values.shape, keys.shape)
    assert cos.shape == sin.shape == (slots, steps, head_dim // 2), (cos.shape, sin.shape)
    for tensor in (qkv, cos, sin, keys, values):
        assert tensor.dtype == torch.float32, tensor.dtype
        assert tensor.is_contiguous(), "qkv, cos, sin and the rings must be contiguous"
        assert tensor.device == start.device, "tensors on one device"
    assert start.shape == (slots,), (start.shape, slots)
    assert start.dtype == torch.int64, start.dtype
    assert steps in (1, 2, 4, 8), f"steps {steps} must be a small power of two"
    assert head_dim in (8, 16, 32, 64, 128), f"head_dim {head_dim} must be a power of two"
    assert steps <= capacity, f"the {steps} entries written must fit the ring of {capacity}"
    assert 1 <= context <= capacity, (context, capacity)
    assert block_n in (16, 32, 64, 128, 256), f"block_n {block_n} must be a power of two"
    assert tiles_per_split >= 1, tiles_per_split
    assert not pair or steps == 2, f"pair takes T = 2 queries, not {steps}"
    rows = slots * heads
    split_frames = block_n * tiles_per_split
    splits = math.ceil(capacity / split_frames)
    out = torch.empty(slots, steps, dim, device=qkv.device, dtype=torch.float32)
    direct = splits == 1  # the program writes the output; else a row's last split merges it
    partials = 1 if direct else rows * splits * steps
    part_max = torch.empty(partials, device=qkv.device, dtype=torch.float32)
    part_sum = torch.empty(partials, device=qkv.device, dtype=torch.float32)
    part_acc = torch.empty(partials, head_dim, device=qkv.device, dtype=torch.float32)
    # one split counts nothing: part_max stands in
    arrived = part_max if direct else arrival_counts(qkv.device, rows)
    pdl = dependent(qkv, "mimi_transformer")
    _ring_attention_step_kernel[(rows, splits)](
        qkv,
        cos,
        sin,
        keys,
        values,
        start,
        out,
        part_max,
        part_sum,
        part_acc,
        arrived,
        capacity,
        context,
        split_frames,
        splits,
        math.log2(math.e) / math.sqrt(head_dim),
        heads=heads,
        head_dim=head_dim,
        steps=steps,
        block_n=block_n,
        splits_pow2=triton.next_power_of_2(splits),
        empty=EMPTY_MAX,
        direct=direct,
        pair=pair,
        num_warps=num_warps,
        pdl=pdl,
        launch_pdl=pdl,
    )
    return out


def residual_layer_norm_reference(
    x: Tensor, update: Tensor, scale: Tensor, weight: Tensor, bias: Tensor, eps: float
) -> tuple[Tensor, Tensor]:
    """(x + scale * update, LayerNorm of it) in torch."""
    total = x + scale * update
    return total, functional.layer_norm(total, (x.shape[-1],), weight, bias, eps)


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _residual_layer_norm_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    x_ptr,
    update_ptr,
    scale_ptr,
    weight_ptr,
    bias_ptr,
    total_ptr,
    normed_ptr,
    dim,
    eps,
    block: tl.constexpr,
    pdl: tl.constexpr,
):
    wait_for_inputs(pdl)
    token = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, block)
    inside = cols < dim
    offsets = token * dim + cols
    x = tl.load(x_ptr + offsets, mask=inside, other=0.0)
    update = tl.load(update_ptr + offsets, mask=inside, other=0.0)
    scale = tl.load(scale_ptr + cols, mask=inside, other=0.0)
    total = x + scale * update
    tl.store(total_ptr + offsets, total, mask=inside)
    mean = tl.sum(total, axis=0) / dim
    centred = tl.where(inside, total - mean, 0.0)
    variance = tl.sum(centred * centred, axis=0) / dim
    weight = tl.load(weight_ptr + cols, mask=inside, other=0.0)
    bias = tl.load(bias_ptr + cols, mask=inside, other=0.0)
    normed = centred * tl.rsqrt(variance + eps) * weight + bias
    tl.store(normed_ptr + offsets, normed, mask=inside)


def residual_layer_norm(
    x: Tensor, update: Tensor, scale: Tensor, weight: Tensor, bias: Tensor, eps: float
) -> tuple[Tensor, Tensor]:
    """x, update: fp32 [..., dim] contiguous; scale, weight, bias: fp32 [dim]
    -> (x + scale * update, LayerNorm(x + scale * update)), both [..., dim]."""
    dim = x.shape[-1]
    assert update.shape == x.shape, (update.shape, x.shape)
    for tensor in (x, update, scale, weight, bias):
        assert tensor.dtype == torch.float32, tensor.dtype
        assert tensor.is_contiguous(), "inputs must be contiguous"
        assert tensor.device == x.device, "tensors on one device"
    for vector in (scale, weight, bias):
        assert vector.shape == (dim,), (vector.shape, dim)
    total = torch.empty_like(x)
    normed = torch.empty_like(x)
    pdl = dependent(x, "mimi_transformer")
    _residual_layer_norm_kernel[(x.numel() // dim,)](
        x,
        update,
        scale,
        weight,
        bias,
        total,
        normed,
        dim,
        eps,
        block=triton.next_power_of_2(dim),
        num_warps=4,
        pdl=pdl,
        launch_pdl=pdl,
    )
    return total, normed
