"""Decode attention over a per-slot KV ring: one query per (slot, head), flash-decoding style.

The temporal transformer attends, every tick, from one new frame per slot to that slot's whole
ring (see engine/models/moshi/attention.py for the layout and the validity rule):

    q:            [slots, heads, head_dim]            this step's query (RoPE applied)
    keys, values: [slots, heads, capacity, head_dim]  one layer's ring, contiguous
    last:         int64 [slots]                       the query's position (frames since reset)

Ring entry j holds position p = last - ((last - j) mod capacity); it is attended when p >= 0
and p > last - context. At 7B shapes the step is a pure read of the rings (a 1500-frame ring of
32 heads x 128 is 24.6 MB of K+V per slot and layer in bf16), so the kernel is built to stream
them once at full bandwidth:

- pass 1, grid (slots * heads, splits): each program walks `split_frames` ring entries in
  tiles of BLOCK_N, keeps an online softmax (running max, running sum, fp32 accumulator) and
  writes its partial (max, sum, acc[head_dim]). Splitting the ring gives a small batch enough
  programs to fill the chip; at 128 slots one split per (slot, head) already does. The valid
  entries form one cyclic run of ring indices; when it does not wrap (a call younger than the
  ring), tiles outside it are skipped, so a young call reads only what it has written.
- the merge, in the same launch: each program counts itself once its partial is stored, and
  the last of a (slot, head) to arrive (kernels/arrivals.py) rescales the row's partials to
  their common max, normalises and writes the output (whichever program it is, it merges
  the same partials the same way). With one split pass 1 normalises and writes the output
  itself. One launch a layer either way: the merge was a launch of its own before (32 a step
  at 7B), in the figures measured below too; this form has no A/B of its own on the GPU (the
  stages and ticks timed since include it: bench/results/engine_stages_ab_902ed82.json,
  bench_engine_bf16_1_ab_baa6a49_*.json). Its arithmetic is the merge launch's: interpreted,
  the outputs are that form's bit for bit; compiled, the sums over the splits reduce in the
  pass-1 program's layout (1 or 4 warps, the merge launch had 4), so they may differ by those
  sums' rounding (not compared bit for bit on a GPU; the GPU tests against the reference
  pass).

fp8 e4m3 rings (attention.py's quantize_kv: a bf16 scale per entry) have their own pass 1,
_ring_split_fp8_kernel. The scores are K q^T with the ring entries as the product's rows: the
e4m3 key tile goes from shared memory into the tensor cores as it is (no conversion, no trip
through registers), against q split into three e4m3 columns (q ~ hi + mid + lo, ~2^-12 of
each element). The values are weighed on the CUDA cores in packed fp16: e4m3 widens to fp16 two
at a time, and each thread sums its own rows of the tile (fused multiply-adds) before one fp32
add per tile, so no reduction crosses threads inside the loop: the tile's rows fall into
`groups` softmax groups (a thread's rows are one group's), each with its own running max, sum
and accumulator, merged after the loop. Key scales multiply the scores; value scales weigh the
fp16 weights relative to the largest valid value scale of the program (found before the loop),
which multiplies the result.

Measured on one H200 (bench/kernels_ring_attention.py; 32 heads x 128, 1500-frame rings, every
entry valid, per layer). bf16 rings (bench/results/kernels_ring_attention_full_rings.json):
12.5 us at 1 slot (torch SDPA with the ring mask: 20.5), 708 us at 128 slots = 4.44 TB/s,
level with SDPA's 720 us and with a plain 4 GiB read (4.39 TB/s); 46 us at 128 slots with 51
valid frames per ring (SDPA reads the whole ring whatever it holds); the best program is block
32 x 4 warps, 3 stages at 128 slots, block 16 x 1 warp at 1 and 32 slots (16 x 2 at 8).
fp8 rings (`python bench/kernels_ring_attention.py --slots 128,300 --step-slots ""`,
bench/results/kernels_ring_attention_fp8_loop.json; bf16 708 / 1644 us in the same run):
393 us at 128 slots = 4.07 TB/s of entries and scales (0.55x bf16; the previous fp8 kernel,
which repeated q over 16 rows and widened both tiles to fp16 for the dots, 607 us = 2.63 TB/s
in the same run), 888 us at 300 slots = 4.22 TB/s (previous 1421); 68 us at 128 slots with 51
valid frames; 1.4e-3 relative error against the fp32 reference of the dequantized rings
(previous 1.0e-3), 3.7e-2 against the unquantized random rings (unchanged). Program: block 128
x 4 warps, 2 stages (103 registers; 105 with the merge in the launch, no spills: Triton 3.6's
sm_90 build, bench/kernels_ring_sass.py). Others in that run, us at 128 / 300 slots: 128 x 4
x 3 stages 413 / 923, 256 x 4 x 2 402 / 899, 64 x 4 x 3 423 / 932, 64 x 4 x 4 437 / 986, 128
x 8 x 3 510 / 1168, 256 x 8 x 2 573 / 1303 (eight warps: one CTA per SM at 256). The previous
kernel's loop issued 800 instructions per 64-entry tile (Triton 3.6's sm_90 SASS: byte loads
of the value tile from shared memory, index arithmetic, conversions): it was issue-bound at
~60% of the read ceiling; this one issues 528 per 128 entries. A first form that loaded the
value tile as a 3-d [rounds, groups, head_dim] tensor got its rows laid across threads by
Triton 3.6 (302 shuffles per tile, spills at 128): 858-5023 us at 128 slots
(bench/results/kernels_ring_attention_fp8_loop_first.json); loading it as the key tile's 2-d
tile and reshaping keeps a thread's rows in its registers.

Tried and reverted (commit ec42be0): each program of the few-rows program (and of Mimi's
split step, kernels/mimi_transformer.py) sent its run of K and V towards L2 with bulk
prefetches (`cp.async.bulk.prefetch.L2`) before its PDL wait, so that HBM would start on them
while RoPE + the ring append ran. Same bits, but slower at one slot, each stage alternated
twice in one process (`python3 bench/engine_stages.py --slots 1 --ab prefetch` as it was,
bench/results/engine_stages_prefetch_ec42be0.json, ms with against without): temporal
4.276 / 4.287 against 4.221 / 4.149, Mimi encode 0.565 / 0.568 against 0.524 / 0.525; only
Mimi decode gained (0.444 / 0.446 against 0.470 / 0.459). Not profiled further.

The launcher asserts shapes, dtypes, strides and devices, allocates only buffers whose size is
fixed by the shapes (the merge's arrival counts once per device, outside any capture: run each
shape once before capturing), and never reads device values on the host: it can be captured in
a CUDA graph. Scores use exp2 with log2(e) folded into the query scale.
"""

import math
from dataclasses import dataclass

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor

from engine.models.moshi.attention import FP8_MAX, KV_FP8, KV_SCALE_DTYPE
from kernels.arrivals import arrival_counts, last_to_arrive
from kernels.dependent_launch import dependent, wait_for_inputs
from kernels.device import multiprocessors

# the pass-1 program; module-level and read at each launch, so the bench can sweep them
BLOCK_N = 32  # ring entries per tile: a 32 x 128 bf16 tile of K is 8 KiB
PROGRAMS_PER_SM = 4  # pass-1 programs wanted per multiprocessor before splitting stops
NUM_WARPS = 4
NUM_STAGES = 3  # K/V tiles in the software pipeline (cp.async); Triton's default on Hopper
# rings of at most FEW_ROWS (slot, head) rows (an engine of at most 32 slots at 32 heads: the
# graph steps every slot), fp8 ones excepted, take this program (block_n, num_warps,
# num_stages) instead (pass1_program): one warp on 16 entries a tile, measured faster
# there (us per layer, H200, full 1500-frame rings, against the 32 x 4 warps above: 1 slot
# 12.6 / 13.9, 8 slots 53.2 / 66.3, 32 slots 184.0 / 193.2; at 128 slots 727.1 / 708.1;
# bench/results/kernels_ring_attention_pps.json and kernels_ring_attention_full_rings.json).
# More programs per multiprocessor did not help there (pps 8 and 16: 13.3-15.3 us at 1 slot,
# 53.3-56.7 at 8). The bench sets FEW_ROWS to 0 to run its sweep's best everywhere.
FEW_ROWS = 1024
FEW_ROWS_PROGRAM = (16, 1, 3)
# the pass-1 program for fp8 rings (half the bytes per entry), read at each launch likewise
FP8_BLOCK_N = 128
FP8_NUM_WARPS = 4
FP8_NUM_STAGES = 2
# a running max below any real score but finite, so an all-masked tile gives exp2(0) = 1 for
# the rescale and exp2(-inf) = 0 for the masked scores, never inf - inf
EMPTY_MAX = -1.0e30
_FP8_MAX = tl.constexpr(FP8_MAX)


def ring_positions(last: Tensor, capacity: int) -> Tensor:
    """int64 [slots, capacity]: the position each ring entry holds, for queries at `last`."""
    index = torch.arange(capacity, device=last.device)
    return last[:, None] - torch.remainder(last[:, None] - index[None, :], capacity)


def ring_attention_reference(
    q: Tensor, keys: Tensor, values: Tensor, last: Tensor, context: int
) -> Tensor:
    """Plain fp32 softmax(q k^T / sqrt(d)) v over the valid ring entries; returns q's dtype."""
    head_dim = q.shape[-1]
    positions = ring_positions(last, keys.shape[2])  # [slots, capacity]
    valid = (positions >= 0) & (positions > last[:, None] - context)
    scores = torch.einsum("bhd,bhnd->bhn", q.float(), keys.float()) / math.sqrt(head_dim)
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return torch.einsum("bhn,bhnd->bhd", weights, values.float()).to(q.dtype)


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _split_run(last, capacity, context, split, split_frames):  # type: ignore[no-untyped-def,unused-ignore]
    """(final, oldest, lo, hi) of one split of a ring whose query is at position `last`.

    Entry j is (final - j) mod capacity frames older than the query (final: the query's own
    entry), and attended when that age is at most `oldest` (p >= 0 and within the context):
    one cyclic run of indices ending at `final`. The split covers entries [lo, hi); when the
    run does not wrap (a call younger than the ring) they are cut to it, so a young call
    reads only what it wrote. The 64-bit modulo stays out of the loops: it costs tens of
    instructions per entry."""
    final = (last % capacity).to(tl.int32)
    oldest = tl.minimum(last, context - 1).to(tl.int32)
    lo, hi = cyclic_split(final, oldest, 0, capacity, split, split_frames)
    return final, oldest, lo, hi


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def cyclic_split(final, oldest, newest, capacity, split, split_frames):  # type: ignore[no-untyped-def,unused-ignore]
    """[lo, hi) of split `split` (`split_frames` ring entries each) over a ring whose attended
    entries are those `newest` to `oldest` frames older than entry `final`: one cyclic run
    of indices. When the run does not wrap (oldest <= final: a call younger than the ring)
    the split is cut to it, so a young call reads only what it wrote (_split_run's, with
    newest 0; kernels/mimi_transformer.py's _older_run's, with newest T, its own entries
    attended from registers)."""
    lo = split * split_frames
    hi = tl.minimum(lo + split_frames, capacity)
    unwrapped = oldest <= final
    lo = tl.where(unwrapped, tl.maximum(lo, final - oldest), lo)
    hi = tl.where(unwrapped, tl.minimum(hi, final + 1 - newest), hi)
    return lo, hi


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _ring_split_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    q_ptr,
    k_ptr,
    v_ptr,
    last_ptr,
    out_ptr,
    max_ptr,
    sum_ptr,
    acc_ptr,
    arrived_ptr,
    stride_q_slot,
    stride_q_head,
    heads,
    capacity,
    context,
    split_frames,
    splits,
    qk_scale_log2,
    head_dim: tl.constexpr,
    block_n: tl.constexpr,
    splits_pow2: tl.constexpr,
    direct: tl.constexpr,
    empty: tl.constexpr,
    precision: tl.constexpr,
    pdl: tl.constexpr,
):
    """Pass 1 over rings in q's dtype: the query is repeated over the 16 rows a tensor-core dot
    needs, so the tile reductions are matrix products fed straight from the (pipelined) K/V
    loads."""
    wait_for_inputs(pdl)
    row = tl.program_id(0)  # slot * heads + head
    slot = row // heads
    head = row % heads
    last = tl.load(last_ptr + slot)
    q = tl.load(q_ptr + slot * stride_q_slot + head * stride_q_head + tl.arange(0, head_dim))
    attend_split(
        q, k_ptr, v_ptr, out_ptr, max_ptr, sum_ptr, acc_ptr, arrived_ptr, row, last, capacity,
        context, split_frames, splits, qk_scale_log2, head_dim, block_n, splits_pow2, direct,
        empty, precision,
    )  # fmt: skip


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def attend_split(  # type: ignore[no-untyped-def,unused-ignore]
    q,
    k_ptr,
    v_ptr,
    out_ptr,
    max_ptr,
    sum_ptr,
    acc_ptr,
    arrived_ptr,
    row,
    last,
    capacity,
    context,
    split_frames,
    splits,
    qk_scale_log2,
    head_dim: tl.constexpr,
    block_n: tl.constexpr,
    splits_pow2: tl.constexpr,
    direct: tl.constexpr,
    empty: tl.constexpr,
    precision: tl.constexpr,
):
    """One program's split of row `row` (slot * heads + head) for the query q [head_dim] at
    position `last`, in q's dtype rings: its online softmax over the split's entries, then
    the output (one split) or its partial and, by the row's last split to arrive, the merge
    (_ring_split_kernel's pass 1; kernels/rope_attention.py's too)."""
    split = tl.program_id(1)
    ring = row.to(tl.int64) * capacity
    dims = tl.arange(0, head_dim)
    lanes = tl.arange(0, 16)  # the repeated query rows; row 0 is stored
    q_rows = tl.broadcast_to(q[None, :], (16, head_dim))
    final, oldest, lo, hi = _split_run(last, capacity, context, split, split_frames)
    run_max = tl.full((16,), empty, tl.float32)
    run_sum = tl.zeros((16,), tl.float32)
    acc = tl.zeros((16, head_dim), tl.float32)
    for start in range(lo, hi, block_n):
        index = start + tl.arange(0, block_n)
        age = final - index
        age = tl.where(age < 0, age + capacity, age)
        valid = (index < hi) & (age <= oldest)
        offsets = (ring + index.to(tl.int64))[:, None] * head_dim + dims[None, :]
        k = tl.load(k_ptr + offsets, mask=valid[:, None], other=0.0)
        scores = tl.dot(q_rows, tl.trans(k), input_precision=precision) * qk_scale_log2
        scores = tl.where(valid[None, :], scores, float("-inf"))  # [16, block_n], log2 units
        new_max = tl.maximum(run_max, tl.max(scores, axis=1))
        rescale = tl.exp2(run_max - new_max)
        weights = tl.exp2(scores - new_max[:, None])
        run_sum = run_sum * rescale + tl.sum(weights, axis=1)
        v = tl.load(v_ptr + offsets, mask=valid[:, None], other=0.0)
        update = tl.dot(weights.to(q.dtype), v, input_precision=precision)
        acc = acc * rescale[:, None] + update
        run_max = new_max
    first_lane = lanes == 0
    if direct:  # one split: the query's own entry is valid, so run_sum > 0
        out = (acc / run_sum[:, None]).to(out_ptr.dtype.element_ty)
        out_offsets = row.to(tl.int64) * head_dim + 0 * lanes[:, None] + dims[None, :]
        tl.store(out_ptr + out_offsets, out, mask=first_lane[:, None])
    else:
        partial = row * splits + split
        tl.store(max_ptr + partial + 0 * lanes, run_max, mask=first_lane)
        tl.store(sum_ptr + partial + 0 * lanes, run_sum, mask=first_lane)
        acc_offsets = partial.to(tl.int64) * head_dim + 0 * lanes[:, None] + dims[None, :]
        tl.store(acc_ptr + acc_offsets, acc, mask=first_lane[:, None])
        if last_to_arrive(arrived_ptr, row, splits):
            _merge_splits(
                max_ptr, sum_ptr, acc_ptr, out_ptr, row, splits, head_dim, splits_pow2, empty
            )


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _ring_split_fp8_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    q_ptr,
    k_ptr,
    v_ptr,
    k_scale_ptr,
    v_scale_ptr,
    last_ptr,
    out_ptr,
    max_ptr,
    sum_ptr,
    acc_ptr,
    arrived_ptr,
    stride_q_slot,
    stride_q_head,
    heads,
    capacity,
    context,
    split_frames,
    splits,
    qk_scale_log2,
    head_dim: tl.constexpr,
    block_n: tl.constexpr,
    groups: tl.constexpr,
    splits_pow2: tl.constexpr,
    direct: tl.constexpr,
    empty: tl.constexpr,
    pdl: tl.constexpr,
):
    """Pass 1 over fp8 rings: the ring entries are the rows of the score product (K q^T, the
    tile straight from shared memory as an e4m3 operand, no conversion), and the value tile is
    weighed on the CUDA cores in packed fp16, each thread summing its own rows of the tile.

    q enters the product as three e4m3 columns, q ~ hi + mid + lo (each the e4m3 rounding of
    what the previous ones leave), so the scores carry q to ~2^-12 of each element's
    magnitude. The tile's rows are `rounds` x `groups`: row r * groups + g belongs to softmax
    group g, and a thread holds all `rounds` rows of its group for 16 bytes of head_dim, so
    the value rows are summed in registers and each group keeps its own running max, sum and
    accumulator; the groups are merged once, after the loop."""
    wait_for_inputs(pdl)
    rounds: tl.constexpr = block_n // groups
    row = tl.program_id(0)  # slot * heads + head
    split = tl.program_id(1)
    slot = row // heads
    head = row % heads
    last = tl.load(last_ptr + slot)
    dims = tl.arange(0, head_dim)
    q = tl.load(q_ptr + slot * stride_q_slot + head * stride_q_head + dims).to(tl.float32)
    q_amax = tl.maximum(tl.max(tl.abs(q), axis=0), 1e-30)
    q = tl.clamp(q * (_FP8_MAX / q_amax), -_FP8_MAX, _FP8_MAX)
    qk_scale_log2 = qk_scale_log2 * (q_amax / _FP8_MAX)
    q_hi = q.to(tl.float8e4nv).to(tl.float32)
    q_mid = (q - q_hi).to(tl.float8e4nv).to(tl.float32)
    q_lo = (q - q_hi - q_mid).to(tl.float8e4nv).to(tl.float32)
    column = tl.arange(0, 16)[None, :]  # the product's N: 16, the smallest it takes
    q_cols = tl.where(column == 0, q_hi[:, None], 0.0)
    q_cols = tl.where(column == 1, q_mid[:, None], q_cols)
    q_cols = tl.where(column == 2, q_lo[:, None], q_cols).to(tl.float8e4nv)  # [head_dim, 16]
    if head_dim < 32:  # an e4m3 product needs K >= 32; fp16 holds every e4m3 value exactly
        q_cols = q_cols.to(tl.float16)
    ring = row.to(tl.int64) * capacity
    # the valid entries of [lo, hi) (see _split_run): all of them when the run does not
    # wrap, else all but the gap (final, gap_end) of entries older than the context
    final, oldest, lo, hi = _split_run(last, capacity, context, split, split_frames)
    unwrapped = oldest <= final
    gap_end = tl.where(unwrapped, final + 1, final + capacity - oldest)
    # the largest value scale among the valid entries, found once: each value's weight is
    # taken relative to it, so the fp16 weights stay in [0, 1] and their products with the
    # values within [0, 448] whatever the values' range; it multiplies the result at the end
    chunk = tl.arange(0, 1024)
    largest = tl.zeros((1024,), tl.float32)
    for begin in range(lo, hi, 1024):
        index = begin + chunk
        inside = (index < hi) & ((index <= final) | (index >= gap_end))
        scale = tl.load(v_scale_ptr + ring + index, mask=inside, other=0.0)
        largest = tl.maximum(largest, scale.to(tl.float32))
    value_ref = tl.maximum(tl.max(largest, axis=0), 1e-30)
    run_max = tl.full((groups,), empty, tl.float32)
    run_sum = tl.zeros((groups,), tl.float32)
    acc = tl.zeros((groups, head_dim), tl.float32)
    for start in range(lo, hi, block_n):
        index = start + tl.arange(0, block_n)
        valid = (index < hi) & ((index <= final) | (index >= gap_end))
        entries = ring + index.to(tl.int64)
        offsets = entries[:, None] * head_dim + dims[None, :]
        k = tl.load(k_ptr + offsets, mask=valid[:, None])  # masked rows: scores set to -inf
        # the load's layout puts a pass of the program over `groups` rows and the passes in
        # registers: split the tile's rows as (pass, group), so a thread's rows are one group's
        v = tl.load(v_ptr + offsets, mask=valid[:, None], other=0.0)
        v = tl.reshape(v, (rounds, groups, head_dim))
        valid_rows = tl.reshape(valid, (rounds, groups))
        entries_rows = tl.reshape(entries, (rounds, groups))
        if head_dim < 32:
            k = k.to(tl.float16)
        scores = tl.reshape(tl.sum(tl.dot(k, q_cols), axis=1), (rounds, groups))
        key_scale = tl.load(k_scale_ptr + entries_rows, mask=valid_rows, other=0.0)
        scores = scores * (key_scale.to(tl.float32) * qk_scale_log2)
        scores = tl.where(valid_rows, scores, float("-inf"))
        new_max = tl.maximum(run_max, tl.max(scores, axis=0))
        rescale = tl.exp2(run_max - new_max)
        weights = tl.exp2(scores - new_max[None, :])
        run_sum = run_sum * rescale + tl.sum(weights, axis=0)
        run_max = new_max
        value_scale = tl.load(v_scale_ptr + entries_rows, mask=valid_rows, other=0.0)
        weights = (weights * (value_scale.to(tl.float32) / value_ref)).to(tl.float16)
        # at most rounds x 448 in fp16: each thread's rows, summed in registers
        update = tl.sum(weights[:, :, None] * v.to(tl.float16), axis=0)
        acc = acc * rescale[:, None] + update.to(tl.float32)
    top = tl.max(run_max, axis=0)
    weight = tl.exp2(run_max - top)  # groups with no valid entry: empty, weight 0 (or 1, sum 0)
    total = tl.sum(run_sum * weight, axis=0)
    out = tl.sum(acc * weight[:, None], axis=0) * value_ref
    if direct:  # one split: the query's own entry is valid, so total > 0
        out = (out / total).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + row.to(tl.int64) * head_dim + dims, out)
    else:
        partial = row * splits + split
        tl.store(max_ptr + partial, top)
        tl.store(sum_ptr + partial, total)
        tl.store(acc_ptr + partial.to(tl.int64) * head_dim + dims, out)
        if last_to_arrive(arrived_ptr, row, splits):
            _merge_splits(
                max_ptr, sum_ptr, acc_ptr, out_ptr, row, splits, head_dim, splits_pow2, empty
            )


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _merge_splits(  # type: ignore[no-untyped-def,unused-ignore]
    max_ptr,
    sum_ptr,
    acc_ptr,
    out_ptr,
    row,
    splits,
    head_dim: tl.constexpr,
    splits_pow2: tl.constexpr,
    empty: tl.constexpr,
):
    """The row's output from its splits' partials, by the last of its programs to arrive
    (kernels/arrivals.py): rescaled to their common max and normalised."""
    parts = tl.arange(0, splits_pow2)
    present = parts < splits
    partial = row * splits + parts
    # .cg: the other programs' partials come from L2 (the L1 is not coherent)
    part_max = tl.load(max_ptr + partial, mask=present, other=empty, cache_modifier=".cg")
    part_sum = tl.load(sum_ptr + partial, mask=present, other=0.0, cache_modifier=".cg")
    dims = tl.arange(0, head_dim)
    part_acc = tl.load(
        acc_ptr + partial[:, None].to(tl.int64) * head_dim + dims[None, :],
        mask=present[:, None],
        other=0.0,
        cache_modifier=".cg",
    )
    # splits with no valid entry carry empty and a zero sum: their weight underflows to 0
    scale = tl.exp2(part_max - tl.max(part_max, axis=0))
    total = tl.sum(part_sum * scale, axis=0)
    out = tl.sum(part_acc * scale[:, None], axis=0) / total
    tl.store(out_ptr + row.to(tl.int64) * head_dim + dims, out.to(out_ptr.dtype.element_ty))


@dataclass(frozen=True)
class SplitWork:
    """How a launch cuts its rows' rings into splits, and the buffers its pass 1 writes:
    the partials (max, sum, acc) and arrival counts of a merge, and the output."""

    splits: int
    split_frames: int
    buffers: tuple[Tensor, Tensor, Tensor, Tensor, Tensor]  # max, sum, acc, arrived, out
    merge: dict[str, object]  # the kernels' splits_pow2 and direct
    qk_scale_log2: float
    precision: str | None  # the dot's: fp32 rings (tests, fp32 models) must not drop to tf32

    @staticmethod
    def of(
        slots: int,
        heads: int,
        head_dim: int,
        capacity: int,
        device: torch.device,
        dtype: torch.dtype,
        block_n: int,
        splits: int | None,
    ) -> "SplitWork":
        rows = slots * heads
        if splits is None:
            splits = default_splits(rows, capacity, device, block_n)
        split_frames = block_n * math.ceil(capacity / (splits * block_n))
        splits = math.ceil(capacity / split_frames)  # no split left empty by the rounding
        direct = splits == 1  # pass 1 writes the output; else a row's last split merges it
        partials = 1 if direct else rows * splits
        part_max = torch.empty(partials, device=device, dtype=torch.float32)
        part_sum = torch.empty(partials, device=device, dtype=torch.float32)
        part_acc = torch.empty(partials, head_dim, device=device, dtype=torch.float32)
        # one split counts nothing: part_max stands in
        arrived = part_max if direct else arrival_counts(device, rows)
        out = torch.empty(slots, heads, head_dim, device=device, dtype=dtype)
        return SplitWork(
            splits=splits,
            split_frames=split_frames,
            buffers=(part_max, part_sum, part_acc, arrived, out),
            merge={"splits_pow2": triton.next_power_of_2(splits), "direct": direct},
            qk_scale_log2=math.log2(math.e) / math.sqrt(head_dim),
            precision="ieee" if dtype == torch.float32 else None,
        )


def default_splits(rows: int, capacity: int, device: torch.device, block_n: int) -> int:
    """Splits per (slot, head) so that pass 1 has ~PROGRAMS_PER_SM programs per SM (read at
    each launch, like BLOCK_N)."""
    # off CUDA (the interpreter) 4: a few splits keep the merge exercised
    wanted = math.ceil(PROGRAMS_PER_SM * multiprocessors(device, off_cuda=4) / rows)
    return max(1, min(wanted, math.ceil(capacity / block_n)))


def pass1_program(rows: int, fp8: bool) -> tuple[int, int, int]:
    """The pass-1 program (block_n, num_warps, num_stages) for `rows` (slot, head) rows: the
    FP8_ one for fp8 rings, else FEW_ROWS_PROGRAM up to FEW_ROWS rows, else BLOCK_N,
    NUM_WARPS and NUM_STAGES (each read at each launch)."""
    if fp8:
        return FP8_BLOCK_N, FP8_NUM_WARPS, FP8_NUM_STAGES
    if rows <= FEW_ROWS:
        return FEW_ROWS_PROGRAM
    return BLOCK_N, NUM_WARPS, NUM_STAGES


def ring_attention(
    q: Tensor,
    keys: Tensor,
    values: Tensor,
    last: Tensor,
    context: int,
    splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    scales: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """Decode attention of q over the ring (module docstring); returns [slots, heads, head_dim]
    in q's dtype. `splits` overrides the split count (tests use it to force the merge);
    `block_n`, `num_warps` and `num_stages` shape the pass-1 program (None: the module's
    BLOCK_N, NUM_WARPS and NUM_STAGES, FEW_ROWS_PROGRAM for bf16 rings of few rows, or the
    FP8_ versions, read at each launch so that bench/kernels_ring_attention.py can run the
    model with the best of its sweep). fp8 rings
    come with their per-entry `scales` (key_scale, value_scale): bf16 [slots, heads,
    capacity] (attention.py's quantize_kv)."""
    fp8 = scales is not None
    slots, heads, head_dim = q.shape
    program = pass1_program(slots * heads, fp8)
    block_n = program[0] if block_n is None else block_n
    num_warps = program[1] if num_warps is None else num_warps
    num_stages = program[2] if num_stages is None else num_stages
    capacity = keys.shape[2]
    assert keys.shape == (slots, heads, capacity, head_dim), (keys.shape, q.shape)
    assert values.shape == keys.shape, (values.shape, keys.shape)
    assert keys.is_contiguous(), "the key ring must be contiguous"
    assert values.is_contiguous(), "the value ring must be contiguous"
    assert q.stride(2) == 1, f"q's head_dim must be unit-stride, strides {q.stride()}"
    assert q.dtype in (torch.float32, torch.float16, torch.bfloat16), q.dtype
    assert keys.dtype == values.dtype, (keys.dtype, values.dtype)
    assert last.shape == (slots,), (last.shape, slots)
    assert last.dtype == torch.int64, last.dtype
    assert q.device == keys.device == values.device == last.device, "tensors on one device"
    assert head_dim in (16, 32, 64, 128, 256), f"head_dim {head_dim} must be a power of two"
    assert 1 <= context <= capacity, (context, capacity)
    assert block_n in (16, 32, 64, 128, 256), f"block_n {block_n} must be a power of two"
    if scales is None:
        assert keys.dtype == q.dtype, (keys.dtype, q.dtype)
    else:
        assert keys.dtype == KV_FP8, keys.dtype
        for scale in scales:
            assert scale.shape == keys.shape[:3], (scale.shape, keys.shape)
            assert scale.dtype == KV_SCALE_DTYPE, scale.dtype
            assert scale.is_contiguous(), "scales must be contiguous"
            assert scale.device == q.device, "tensors on one device"
    work = SplitWork.of(slots, heads, head_dim, capacity, q.device, q.dtype, block_n, splits)
    splits, split_frames = work.splits, work.split_frames
    part_max, part_sum, part_acc, arrived, out = work.buffers
    merge = work.merge
    qk_scale_log2 = work.qk_scale_log2
    pdl = dependent(q, "ring_attention")
    if scales is None:
        _ring_split_kernel[(slots * heads, splits)](
            q,
            keys,
            values,
            last,
            out,
            part_max,
            part_sum,
            part_acc,
            arrived,
            q.stride(0),
            q.stride(1),
            heads,
            capacity,
            context,
            split_frames,
            splits,
            qk_scale_log2,
            head_dim=head_dim,
            block_n=block_n,
            **merge,
            empty=EMPTY_MAX,
            precision=work.precision,
            num_warps=num_warps,
            num_stages=num_stages,
            pdl=pdl,
            launch_pdl=pdl,
        )
    else:
        # a thread loads 16 bytes of an entry: one pass of the program over the tile covers
        # num_warps * 32 * 16 / head_dim entries, the softmax groups
        groups = min(block_n, num_warps * 32 * 16 // head_dim)
        _ring_split_fp8_kernel[(slots * heads, splits)](
            q,
            keys,
            values,
            scales[0],
            scales[1],
            last,
            out,
            part_max,
            part_sum,
            part_acc,
            arrived,
            q.stride(0),
            q.stride(1),
            heads,
            capacity,
            context,
            split_frames,
            splits,
            qk_scale_log2,
            head_dim=head_dim,
            block_n=block_n,
            groups=groups,
            **merge,
            empty=EMPTY_MAX,
            num_warps=num_warps,
            num_stages=num_stages,
            pdl=pdl,
            launch_pdl=pdl,
        )
    return out
