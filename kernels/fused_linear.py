"""A linear layer for a few rows, with the RMSNorm in front of it or the residual add, the
SiLU gate or a GELU behind it in the same launch.

At one call the depformer's tick is launch-bound: its GEMMs have 1 to 16 rows (one per slot),
and a layer step was 8 launches (norm, qkv, attention, out, add + norm, linear_in, gate,
down). With this kernel a layer step is 5: [norm(+pending) + qkv], [attention],
[out + residual], [norm + gate/up + SiLU], [down + residual]; 4 since, up to 2 rows, with the
attention inside the out projection (kernels/attended_linear.py). For rows <= MAX_ROWS:

    x, pending:  [..., k]        unit-stride rows, evenly spaced (a column slice is fine)
    weight:      [n, k]          unit-stride rows; gated: [2 * n, k], rows [gate | up]
    alpha:       [k]             RMSNorm gain (any shape of k values), eps its epsilon
    residual:    [..., n]        unit-stride rows
    out:         [..., n]        contiguous, in x's dtype

    total  = x + pending                          rounded to x's dtype (add_fused_linear)
    normed = total * (alpha * rsqrt(eps + mean(total^2)))   fp32, rounded to x's dtype
    y      = normed @ weight^T                    fp32 accumulation, rounded to x's dtype
    out    = y | residual + y | silu(y_gate) * y_up | gelu(y)   rounded as torch's ops round
             (one epilogue or none: the gate and the residual together are refused, below;
             the GELU takes neither)
    gelu(y) = y / 2 * (1 + erf(y / sqrt(2)))     torch's exact default, fp32 on the rounded y

Every rounding point is torch's (kernels/rms_norm.py, kernels/gated_silu.py, a bf16
`residual + linear(...)` and `gelu(linear(...))`), so bf16 outputs differ from the torch ops
only where the fp32 sums, reduced in another order than cuBLAS's, round to the neighbouring
value. The GELU epilogue is Mimi's linear1 + GELU at a few rows (engine/models/moshi/mimi/
transformer.py), one launch instead of two.

A program computes BLOCK_N output columns at a time (gated: BLOCK_N gate and the matching
up columns) for every row: the weight is read once, the rows (a few KB) by every program from
L2. With `Tiles.programs_per_sm` the grid is capped and each program walks several column
blocks in one flat loop of weight tiles, so the norm's statistics (a first pass over the rows,
per program) are computed once for all of them; with `pending` the first program also writes
the sum. The first weight tile is loaded before the program waits for its inputs (under
programmatic dependent launch, kernels/dependent_launch.py, that load overlaps the kernel
before), each later one an iteration ahead. Products run on the tensor cores (`tl.dot`, rows
padded to 16) or on the CUDA cores (a broadcast product summed over k); `Tiles` picks which.
`Tiles.swap` runs _swapped_linear_kernel instead: out^T = weight @ x^T on the tensor cores
with the weight tile as the left operand and its loads left to Triton's software pipeliner,
`stages` tiles deep through shared memory (fitted to SHARED_BYTES by the launcher), and with
`Tiles.splits` each column block's k cut in parts that run as units of their own, added in
order by the last to finish (so a narrow output still streams on every multiprocessor).
Built for sm_90 with Triton 3.6 (`bench/kernels_fused_linear_sass.py`: wgmma and
asynchronous copies, no spills but the 128 x 128 gated tile's).

The temporal layer takes it for its two residual GEMMs at up to transformer.FEW_ROWS slots
(default_tiles from k = SWAP_K: 64 x 128, 6 stages, 2 splits), measured on one H200 (torch
2.11, Triton 3.6, bf16; `python3 bench/kernels_fused_linear.py --rows 1 --temporal`,
bench/results/kernels_fused_linear_split.json, us per call at one row, cuBLAS in brackets):
out + residual 11.5 (16.3), 61% of HBM, down + residual 26.1 (32.0), 74%; the splits gained
1-4% over none. With the norm as their prologue they lost: qkv 39.3 at best on the swapped
tiles, 36.7 on the CUDA-core ones (31.7 for the norm kernel + cuBLAS), gate/up 62.7 and 61.7
(51.3); those stay on cuBLAS. In the temporal stage
(`python3 bench/engine_stages.py --slots 1,4,16 --stages temporal --per-op`,
bench/results/engine_stages_residual_swap.json): 1 slot 4.53 -> 4.25 ms, 4 slots 5.10 ->
4.93, 16 slots 7.37 -> 7.33 (hence FEW_ROWS 4), in one run; the whole 1-call step 7.19 ms
back to back (bench/results/engine_gpu_few_rows.json; 7.36 in an earlier run,
engine_gpu.json) and 8.67 on the 80 ms clock (bench_engine_bf16_1_few_rows.json; 8.78
earlier, bench_engine_bf16_1.json), 64 kernels fewer a tick (1,119). All four temporal
GEMMs on the swapped tiles, with the first default (64 x 128 everywhere), ran the stage in
7.26 ms, with each GEMM's best tile in 5.50 (kernels_fused_linear_split.json's `temporal`).

Predicted before measuring (H200, bf16, CUDA graph): per layer step of the depformer at one
slot ~25 MB of weights are read by 5 launches of ~2-5 us instead of 8, so the stage goes from
466 to ~320 kernels and from 1.94 to ~1.3 ms; at 8 slots about the same. On the temporal
shapes (k 4096, n up to 22528) cuBLAS already streams at ~75% of HBM; this kernel should
be within 10% of it, so it is not wired there unless it measures faster (since wired for the
residual GEMMs on the swapped tiles, above).

Measured on one H200 (torch 2.11, Triton 3.6, bf16, random weights, CUDA graphs):
- the depformer stage, `python bench/engine_stages.py --slots 1,2,4,8,128 --stages
  temporal,depformer --per-op` (bench/results/engine_stages_fused_linear.json; before = the
  per-op kernels, `few_rows` 0, same run): 1 slot 1.89 -> 1.18 ms, 2 slots 1.90 -> 1.41,
  4 slots 1.91 -> 1.74, 466 -> 274 kernels; 8 and 128 slots keep the per-op kernels (1.80
  and 2.15 ms, 466 kernels). 192 launches fewer, 4 per layer step, not 3: likely the
  residual addmm that ends a per-op layer step, two kernels in the bench below
  (`before_kernels`; each linear is one).
- per GEMM at one row, `python bench/kernels_fused_linear.py --rows 1,2,4,8`
  (bench/results/kernels_fused_linear.json; the 8-row part was cut by the run's limit), us
  per call with the default tiles against cuBLAS and the per-op kernels: qkv (with the add and
  the norm) 5.69 vs 7.05, out + residual 3.73 vs 9.88, norm + gate/up + SiLU 6.79 vs 10.48,
  down + residual 5.70 vs 10.76, head 4.37 vs 5.69. The weights stream at only 12-35% of
  HBM (13-36% with each GEMM's best tile; 4 MB at 5 us: still launch- and latency-bound),
  against 4-23% before.
- tiles: at 1 to 4 rows two columns per program on the CUDA cores beat every tensor-core
  tile (dot 16 x 256: 9.5 us for the one-row qkv); four columns were 0-20% faster still at 2
  and 4 rows (the bench's `few_rows_best`: 1.69 vs 1.84 ms at 4 rows, depformer alone), not
  taken yet: not timed at the stage. At 8 rows the broadcast product outgrows the registers
  and the tensor cores win, but the stage is not faster than the per-op kernels (first run
  of the bench, tensor-core tiles: 1.86 / 1.84 ms against 1.80), so depformer.FEW_ROWS
  (engine/models/moshi/depformer.py) is 4.
- the temporal layer (k 4096) on the first tiles (not swapped): not wired then. At one row
  the fastest tile of the sweep against cuBLAS and the per-op kernels, us per call: qkv +
  norm 39.3 vs 30.6, out + residual 13.7 vs 15.6, norm + gate/up + SiLU 60.2 vs 52.8, down +
  residual 31.1 vs 31.4 (62% of HBM, as cuBLAS): 144 vs 130 us per layer, ~0.45 ms more
  over 32 layers. Wired with the first
  default tiles (tensor cores 16 x 256) the stage went 4.63 -> 6.50 ms at one slot. (The
  bench's first version, `--rows 1,8 --temporal`; it reported us per 20 calls: divided here.)
- correctness on the GPU: tests/kernels/test_fused_linear.py's 7B shapes at 1, 8 and 16 rows
  and every mode on both kinds of tile in fp32 and bf16 passed, but the gate with the
  residual on the CUDA cores in bf16 (now refused); the depformer's token test with this
  path (tests/kernels/test_layer_kernels.py) passes compiled (bench/results/
  gpu_tests_kernels.log).
- with PDL and the capped grid (`bench/engine_stages.py --tiles ...`,
  bench/results/engine_stages_tiles.json, engine_stages_pdl.json): the depformer at one slot
  1.29 -> 1.19 ms with PDL; at one row two columns and 8 programs per multiprocessor 1.17
  against 1.22 uncapped (engine_stages_late_sum.json: 1.17 against 1.24); at 4 rows four
  columns 1.65 against 1.79 for two. Hence default_tiles.
- at one row, one tile a program (commit cd1c0f2): the whole row of k (block_k the next power
  of two) in column blocks of RESIDENT_COLUMNS, doubled while the blocks outnumber the
  resident programs (RESIDENT_PER_SM a multiprocessor), so every program's weight slice is
  loaded before its PDL wait and no program waits for another's multiprocessor: the
  depformer stage at 1 slot 0.99 / 0.94 ms against 1.13 / 1.12 for the two-column tiles in one
  sweep (`bench/engine_stages.py --tiles served,...`, engine_stages_depformer_tiles_8223c89.json),
  0.88 against 1.00 once served (engine_stages_cd1c0f2.json against engine_stages_8223c89.json).
- the temporal layer through this kernel (seven launches a layer instead of twelve, swept with
  PDL and capped grids, run at commit 757c5b8 and reverted, bench/results/
  engine_stages_tiles.json and engine_stages_late_sum.json): at one slot the best tile (four
  columns, k 2048 a step, 4 programs per multiprocessor) ran the stage in 4.41-4.75 ms
  against cuBLAS's 4.40-4.56 in the same runs: no faster, so not wired; at 4 slots 8.68
  against 5.29. Summing products per element and reducing once per column block (instead of
  over k every iteration) was slower still (4.73 at best). Estimated, not timed alone: its
  13.1 GB of weights in the ~3.8 ms the stage's other kernels leave, ~3.4 TB/s, as cuBLAS; a
  GEMV that streams at >= 4 TB/s likely needs another structure (bulk tensor copies into
  shared memory, several stages deep), not other tiles.
- stream-K on the swapped tiles (commit 8c495db, reverted): one program per multiprocessor,
  the weight's tiles cut in equal runs walked in one flat loop, blocks cut between programs
  merged by the last to arrive. Slower everywhere, at one row with PDL as in a tick (us a
  call, `python3 bench/kernels_streamed_linear.py --rows 1,4` as it was, bench/results/
  kernels_streamed_linear_8c495db.json; its tb_per_s fields read 0, a rounding slip: divide
  weight_mb by us): out + residual 13.3-14.3 against 10.7 for these split tiles, down +
  residual 29.3-31.1 against 25.1, qkv with the norm as prologue 34.9 at best against 28.1
  for the norm kernel + cuBLAS, gate/up + norm + SiLU 60.4 at best against 51.2; a layer's
  four GEMMs 127 us with the norms apart, 197 as prologues, against 115; the temporal stage
  at 1 slot 4.58-4.63 ms (norms apart) and 6.71-6.73 (prologues) against 4.21
  (`bench/engine_stages.py --slots 1,4 --stages temporal --ab streamed` as it was,
  engine_stages_streamed_8c495db.json). The even split gains nothing where these tiles
  already fill 128 of 132 multiprocessors, and the flat loop with its epilogue inside
  streams slower than a plain k loop.
"""

from dataclasses import dataclass

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor
from torch.nn import functional

from kernels.arrivals import last_to_arrive
from kernels.dependent_launch import dependent, wait_for_inputs
from kernels.device import multiprocessors

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_ROWS = 16  # rows of one program; more rows would re-read the weight per row block
STREAM = tl.constexpr("evict_first")  # the weights' cache policy (read once)
CUDA_CORE_ROWS = 4  # default_tiles: rows up to this many on the CUDA cores
# default_tiles at one row: programs per multiprocessor, and the narrowest column block
RESIDENT_PER_SM = 8
RESIDENT_COLUMNS = 4
# default_tiles: from this k (the temporal layer's residual GEMMs) the swapped, split tiles
SWAP_K = 4096
NORM_K = 512  # the swapped kernel's norm statistics: this much of k per iteration
SHARED_BYTES = 200 << 10  # the swapped kernel's pipeline stages: at most this much (228 KB/SM)
# per device: the split units' sums and arrival counts, the last the largest (_split_workspace)
_WORKSPACES: dict[torch.device, list[tuple[Tensor, Tensor]]] = {}


@dataclass(frozen=True)
class Tiles:
    """A program's shape: `block_n` output columns, `block_k` of the reduction per iteration,
    on the tensor cores (`dot`) or the CUDA cores."""

    block_n: int
    block_k: int
    dot: bool
    warps: int = 4
    stages: int = 3
    # at most this many programs per multiprocessor, each then taking several column blocks
    # (0: one program per block)
    programs_per_sm: int = 0
    # tensor cores with the weight as the left operand (_swapped_linear_kernel)
    swap: bool = False
    # swapped only: each column block's k in this many units of work (see the kernel)
    splits: int = 1


def default_tiles(rows: int, n: int, k: int, resident: int) -> Tiles:
    """The tiles the launcher takes when given none (measured: see the module docstring);
    `resident`: how many programs of the CUDA-core tiles the device holds at once
    (RESIDENT_PER_SM a multiprocessor).

    From k = SWAP_K (the temporal layer's residual GEMMs, its only callers there) the
    swapped tiles, 2 splits; measured only in that mode: with the norm as prologue at those
    shapes they are slower than cuBLAS (module docstring), so such a caller passes its tiles.
    At one row on the CUDA cores, one tile a program: the whole row of k (its weight slice
    loaded before the PDL wait, nothing loaded after it but the row), in column blocks of at
    least RESIDENT_COLUMNS, wider while there would be more blocks than resident programs
    (no program waits for another's multiprocessor). At two to four rows whole 1024-wide
    slices of k at a time, four columns per program. More rows, the broadcast product
    outgrows the registers: the tensor cores."""
    if k >= SWAP_K:
        return Tiles(block_n=64, block_k=128, dot=True, stages=6, swap=True, splits=2)
    if rows == 1:
        block_n = RESIDENT_COLUMNS
        while triton.cdiv(n, block_n) > resident:
            block_n *= 2
        block_k = triton.next_power_of_2(k)
        return Tiles(block_n, block_k, dot=False, programs_per_sm=RESIDENT_PER_SM)
    if rows <= CUDA_CORE_ROWS:
        return Tiles(block_n=4, block_k=1024, dot=False)
    return Tiles(block_n=16, block_k=512, dot=True)


def fused_linear_reference(
    x: Tensor,
    weight: Tensor,
    *,
    alpha: Tensor | None = None,
    eps: float = 0.0,
    pending: Tensor | None = None,
    residual: Tensor | None = None,
    gated: bool = False,
    gelu: bool = False,
) -> tuple[Tensor, Tensor]:
    """(x + pending or x, out) in torch ops, rounded where the module docstring says."""
    total = x if pending is None else x + pending
    normed = total
    if alpha is not None:
        total_f32 = total.float()
        var = eps + torch.mean(total_f32**2, dim=-1, keepdim=True)
        normed = (total_f32 * (alpha.reshape(-1).to(var) * torch.rsqrt(var))).to(x.dtype)
    # fp32 products and sums, rounded once, as the kernel (cuBLAS's bf16 GEMMs may reduce
    # partial sums in bf16: its outputs can be further from the exact sum than the kernel's)
    y = functional.linear(normed.float(), weight.float()).to(x.dtype)
    if gated:
        gate, up = y.view(*y.shape[:-1], 2, -1).unbind(-2)
        y = functional.silu(gate) * up
    if gelu:
        y = functional.gelu(y)
    if residual is not None:
        y = residual + y
    return total, y


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _load_rows(  # type: ignore[no-untyped-def,unused-ignore]
    x_ptr,
    pending_ptr,
    stride_x,
    stride_pending,
    rows,
    cols,
    inside,
    has_pending: tl.constexpr,
):
    """[block_m, block_k] of x (+ pending, rounded to x's dtype)."""
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=inside, other=0.0)
    if has_pending:
        pending = tl.load(
            pending_ptr + rows[:, None] * stride_pending + cols[None, :], mask=inside, other=0.0
        )
        x = (x.to(tl.float32) + pending.to(tl.float32)).to(x.dtype)
    return x


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _weight_tiles(weight_ptr, stride_weight, n, k, col, cols, gated: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
    """The [block_n, block_k] weight tile of output columns `col` at reduction columns `cols`
    (and its up tile when gated; else the same tile again, unused). Each weight is read once:
    it need not stay in L2, the rows do."""
    tile = (col < n)[:, None] & (cols < k)[None, :]
    offsets = col.to(tl.int64)[:, None] * stride_weight + cols[None, :]
    w = tl.load(weight_ptr + offsets, mask=tile, other=0.0, eviction_policy=STREAM)
    w_up = w
    if gated:
        up = (col + n).to(tl.int64)[:, None] * stride_weight + cols[None, :]
        w_up = tl.load(weight_ptr + up, mask=tile, other=0.0, eviction_policy=STREAM)
    return w, w_up


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _inverse_rms(  # type: ignore[no-untyped-def,unused-ignore]
    x_ptr,
    pending_ptr,
    total_ptr,
    stride_x,
    stride_pending,
    k,
    eps,
    row,
    row_in,
    steps,
    writer,
    has_pending: tl.constexpr,
):
    """[block_m] 1 / rms of each row of x (+ pending), a first pass over the rows; with
    `pending` the `writer` program also stores the sum (the others only read it)."""
    block_m: tl.constexpr = row.shape[0]
    block_k: tl.constexpr = steps.shape[0]
    sum_sq = tl.zeros([block_m], dtype=tl.float32)
    for start in range(0, k, block_k):
        cols = start + steps
        inside = row_in[:, None] & (cols < k)[None, :]
        total = _load_rows(
            x_ptr, pending_ptr, stride_x, stride_pending, row, cols, inside, has_pending
        )
        # two ifs: the first is resolved at compile time, the second at run time
        if has_pending:  # noqa: SIM102
            if writer:
                tl.store(total_ptr + row[:, None] * k + cols[None, :], total, mask=inside)
        total_f32 = total.to(tl.float32)
        sum_sq += tl.sum(total_f32 * total_f32, axis=1)
    return tl.rsqrt(eps + sum_sq / k)


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _normed_rows(  # type: ignore[no-untyped-def,unused-ignore]
    x_ptr,
    pending_ptr,
    alpha_ptr,
    stride_x,
    stride_pending,
    row,
    row_in,
    cols,
    k,
    inv,
    norm: tl.constexpr,
    has_pending: tl.constexpr,
):
    """[block_m, block_k] of x (+ pending) at columns `cols`, RMS-normed with `inv`
    (_inverse_rms) and the gain when `norm`, rounded to x's dtype."""
    cols_in = cols < k
    inside = row_in[:, None] & cols_in[None, :]
    x = _load_rows(x_ptr, pending_ptr, stride_x, stride_pending, row, cols, inside, has_pending)
    if norm:
        alpha = tl.load(alpha_ptr + cols, mask=cols_in, other=0.0).to(tl.float32)
        x = (x.to(tl.float32) * (alpha[None, :] * inv[:, None])).to(x.dtype)
    return x


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _product(acc, x, w, dot: tl.constexpr, widen: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
    """acc [block_m, block_n] + x [block_m, block_k] @ w [block_n, block_k]^T, in fp32;
    `widen`: fp32 operands, full-precision products (no TF32)."""
    if dot and widen:
        acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
    elif dot:
        acc = tl.dot(x, tl.trans(w), acc)
    else:
        acc += tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    return acc


# the row count is not specialised: 1 and 16 would each compile their own variant
@triton.jit(do_not_specialize=["rows"])  # type: ignore[untyped-decorator,unused-ignore]
def _fused_linear_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    x_ptr,
    pending_ptr,
    alpha_ptr,
    weight_ptr,
    residual_ptr,
    total_ptr,
    out_ptr,
    rows,
    n,
    k,
    stride_x,
    stride_pending,
    stride_weight,
    stride_residual,
    eps,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
    norm: tl.constexpr,
    has_pending: tl.constexpr,
    has_residual: tl.constexpr,
    gated: tl.constexpr,
    gelu: tl.constexpr,
    dot: tl.constexpr,
    widen: tl.constexpr,
    pdl: tl.constexpr,
):
    program = tl.program_id(0)
    programs = tl.num_programs(0)
    row = tl.arange(0, block_m)
    row_in = row < rows
    lanes = tl.arange(0, block_n)
    steps = tl.arange(0, block_k)
    # this program's column blocks are program, program + programs, ... (the grid may be
    # smaller than the block count: then the norm below is computed once for several blocks);
    # its tiles are walked in one flat loop, block after block, k fastest
    k_tiles = tl.cdiv(k, block_k)
    tiles = tl.cdiv(tl.cdiv(n, block_n) - program, programs) * k_tiles
    # the first weight tile is loaded before the wait: weights are never written in a tick,
    # so under PDL this load overlaps the kernel before. Each later tile is loaded one
    # iteration ahead (a tile past the last is fully masked: no load is issued)
    w, w_up = _weight_tiles(
        weight_ptr, stride_weight, n, k, program * block_n + lanes, steps, gated
    )
    wait_for_inputs(pdl)
    inv = tl.zeros([block_m], dtype=tl.float32)  # read only when norm
    if norm:
        inv = _inverse_rms(
            x_ptr, pending_ptr, total_ptr, stride_x, stride_pending, k, eps, row, row_in,
            steps, program == 0, has_pending,
        )  # fmt: skip
    acc = tl.zeros([block_m, block_n], dtype=tl.float32)
    acc_up = tl.zeros([block_m, block_n], dtype=tl.float32)
    for tile in range(0, tiles):
        k_tile = tile % k_tiles
        col = (program + (tile // k_tiles) * programs) * block_n + lanes
        after = tile + 1
        next_col = (program + (after // k_tiles) * programs) * block_n + lanes
        next_col = tl.where(after < tiles, next_col, n)  # past the last tile: masked out
        w_next, w_up_next = _weight_tiles(
            weight_ptr, stride_weight, n, k, next_col, (after % k_tiles) * block_k + steps, gated
        )
        x = _normed_rows(
            x_ptr, pending_ptr, alpha_ptr, stride_x, stride_pending, row, row_in,
            k_tile * block_k + steps, k, inv, norm, has_pending,
        )  # fmt: skip
        acc = _product(acc, x, w, dot, widen)
        if gated:
            acc_up = _product(acc_up, x, w_up, dot, widen)
        w, w_up = w_next, w_up_next
        if k_tile == k_tiles - 1:
            store_block(
                acc,
                acc_up,
                residual_ptr,
                out_ptr,
                stride_residual,
                n,
                row,
                row_in,
                col,
                has_residual,
                gated,
                gelu,
            )
            acc = tl.zeros([block_m, block_n], dtype=tl.float32)
            acc_up = tl.zeros([block_m, block_n], dtype=tl.float32)


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def store_block(  # type: ignore[no-untyped-def,unused-ignore]
    acc,
    acc_up,
    residual_ptr,
    out_ptr,
    stride_residual,
    n,
    row,
    row_in,
    col,
    has_residual: tl.constexpr,
    gated: tl.constexpr,
    gelu: tl.constexpr,
):
    """The epilogue of one column block: rounding, the gate, the GELU or the residual, the
    store (also kernels/attended_linear.py's, with the residual)."""
    dtype = out_ptr.dtype.element_ty
    out = acc.to(dtype)
    if gated:
        gate = out.to(tl.float32)
        silu = (gate / (1.0 + tl.exp(-gate))).to(dtype)
        out = (silu.to(tl.float32) * acc_up.to(dtype).to(tl.float32)).to(dtype)
    if gelu:
        # torch's exact GELU (approximate="none"), in fp32 on the rounded product
        y = out.to(tl.float32)
        out = (y * 0.5 * (1.0 + tl.math.erf(y * 0.7071067811865476))).to(dtype)
    written = row_in[:, None] & (col < n)[None, :]
    if has_residual:
        residual = tl.load(
            residual_ptr + row[:, None] * stride_residual + col[None, :], mask=written, other=0.0
        )
        out = (residual.to(tl.float32) + out.to(tl.float32)).to(dtype)
    tl.store(out_ptr + row[:, None] * n + col[None, :], out, mask=written)


@triton.jit(do_not_specialize=["rows"])  # type: ignore[untyped-decorator,unused-ignore]
def _swapped_linear_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    x_ptr,
    pending_ptr,
    alpha_ptr,
    weight_ptr,
    residual_ptr,
    total_ptr,
    out_ptr,
    partial_ptr,
    arrived_ptr,
    rows,
    n,
    k,
    stride_x,
    stride_pending,
    stride_weight,
    stride_residual,
    eps,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
    norm_k: tl.constexpr,
    splits: tl.constexpr,
    norm: tl.constexpr,
    has_pending: tl.constexpr,
    has_residual: tl.constexpr,
    gated: tl.constexpr,
    gelu: tl.constexpr,
    widen: tl.constexpr,
    pdl: tl.constexpr,
):
    """Tiles.swap: out^T = weight @ x^T on the tensor cores, the weight tile the left operand
    (block_n of its rows fill the product's M), the rows the right one (padded to block_m
    columns). The weight loads feed the products directly, so Triton's software pipeliner can
    keep `stages` tiles of each in flight through shared memory (cuBLAS's few-row kernels
    are shaped so: nvjet ..._256x8_64x6 is 256 weight rows by 8 by 64 of k, 6 stages).

    With `splits` > 1 each column block's k is cut in that many parts, each a unit of work of
    its own, so that narrow outputs still stream on every multiprocessor: a unit stores its
    fp32 sums in `partial_ptr` and counts itself in `arrived_ptr` (one int32 per column block,
    zero between launches); the unit that arrives last (kernels/arrivals.py's last_to_arrive,
    which also sets the count back to zero) adds the parts in their order (the sums do not
    depend on which unit is last) and runs the epilogue."""
    program = tl.program_id(0)
    programs = tl.num_programs(0)
    row = tl.arange(0, block_m)
    row_in = row < rows
    lanes = tl.arange(0, block_n)
    wait_for_inputs(pdl)
    inv = tl.zeros([block_m], dtype=tl.float32)  # read only when norm
    if norm:
        inv = _inverse_rms(
            x_ptr, pending_ptr, total_ptr, stride_x, stride_pending, k, eps, row, row_in,
            tl.arange(0, norm_k), program == 0, has_pending,
        )  # fmt: skip
    part_k = tl.cdiv(tl.cdiv(k, block_k), splits) * block_k  # the k of one unit
    # one unit's sums in partial_ptr: [block_n, block_m], and the up half's after them
    part = lanes[:, None] * block_m + row[None, :]
    for unit in range(program, tl.cdiv(n, block_n) * splits, programs):
        block = unit // splits
        col = block * block_n + lanes
        acc = tl.zeros([block_n, block_m], dtype=tl.float32)
        acc_up = tl.zeros([block_n, block_m], dtype=tl.float32)
        first_k = unit % splits * part_k
        for start in range(first_k, tl.minimum(k, first_k + part_k), block_k):
            cols = start + tl.arange(0, block_k)
            w, w_up = _weight_tiles(weight_ptr, stride_weight, n, k, col, cols, gated)
            x = _normed_rows(
                x_ptr, pending_ptr, alpha_ptr, stride_x, stride_pending, row, row_in, cols,
                k, inv, norm, has_pending,
            )  # fmt: skip
            acc = _product_swapped(acc, w, x, widen)
            if gated:
                acc_up = _product_swapped(acc_up, w_up, x, widen)
        last = True
        if splits > 1:
            unit_sums = partial_ptr + tl.cast(unit, tl.int64) * (2 * block_n * block_m) + part
            tl.store(unit_sums, acc)
            if gated:
                tl.store(unit_sums + block_n * block_m, acc_up)
            last = last_to_arrive(arrived_ptr, block, splits)
            if last:
                acc = tl.zeros([block_n, block_m], dtype=tl.float32)
                acc_up = tl.zeros([block_n, block_m], dtype=tl.float32)
                block_sums = partial_ptr + tl.cast(block * splits, tl.int64) * (
                    2 * block_n * block_m
                )
                for index in range(0, splits):
                    sums = block_sums + index * (2 * block_n * block_m) + part
                    acc += tl.load(sums, cache_modifier=".cg")
                    if gated:
                        acc_up += tl.load(sums + block_n * block_m, cache_modifier=".cg")
        if last:
            store_block(
                tl.trans(acc), tl.trans(acc_up), residual_ptr, out_ptr, stride_residual, n, row,
                row_in, col, has_residual, gated, gelu,
            )  # fmt: skip


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _product_swapped(acc, w, x, widen: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
    """acc [block_n, block_m] + w [block_n, block_k] @ x [block_m, block_k]^T, in fp32."""
    if widen:
        acc = tl.dot(w.to(tl.float32), tl.trans(x.to(tl.float32)), acc, input_precision="ieee")
    else:
        acc = tl.dot(w, tl.trans(x), acc)
    return acc


def _rows(x: Tensor, width: int, name: str) -> Tensor:
    """[..., width] as [rows, width] without a copy: rows unit-stride and evenly spaced."""
    assert x.shape[-1] == width, f"{name}: {tuple(x.shape)}, last dimension must be {width}"
    assert x.stride(-1) == 1, f"{name} rows must be unit-stride, strides {x.stride()}"
    return x.view(-1, width)


def _split_workspace(device: torch.device, sums: int, blocks: int) -> tuple[Tensor, Tensor]:
    """The split units' fp32 sums (at least `sums`) and the int32 arrival counts (at least
    `blocks`, zero between launches) on `device`: one pair for every launch there, as the
    kernels of a tick run one after another on one stream. A launch that needs more gets a
    larger pair; the smaller ones are kept, since a captured graph may still use them. A
    pair is never made during a graph capture (run each shape once before capturing, as the
    graph executor's warm-up does)."""
    kept = _WORKSPACES.setdefault(device, [])
    if not kept or kept[-1][0].numel() < sums or kept[-1][1].numel() < blocks:
        # under capture the counts' zeroing would be recorded, not run: warm up first
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        assert not capturing, "split tiles need their workspace before a graph is captured"
        sums = max(sums, kept[-1][0].numel() if kept else 0)
        blocks = max(blocks, kept[-1][1].numel() if kept else 0)
        partial = torch.empty(sums, device=device, dtype=torch.float32)
        kept.append((partial, torch.zeros(blocks, device=device, dtype=torch.int32)))
    return kept[-1]


def fitted_stages(
    tiles: Tiles, block_m: int, gated: bool, pending: bool, norm: bool, item_bytes: int
) -> int:
    """The swapped kernel's pipeline stages: at most `tiles.stages`, as many as fit in
    SHARED_BYTES; the pipeliner keeps that many of each loaded tile in shared memory (weight
    and up, rows and pending, the norm's gain). It needs two."""
    weight_rows = tiles.block_n * (2 if gated else 1)
    stage_bytes = (weight_rows + block_m * (2 if pending else 1) + norm) * tiles.block_k
    stage_bytes *= item_bytes
    fitted = min(tiles.stages, SHARED_BYTES // stage_bytes)
    assert fitted >= 2, f"two stages of {stage_bytes} bytes exceed {SHARED_BYTES}: smaller tiles"
    return fitted


def _launch(
    x: Tensor,
    weight: Tensor,
    alpha: Tensor | None,
    eps: float,
    pending: Tensor | None,
    residual: Tensor | None,
    gated: bool,
    gelu: bool,
    tiles: Tiles | None,
) -> tuple[Tensor, Tensor]:
    k = x.shape[-1]
    rows = _rows(x, k, "x")
    count = rows.shape[0]
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    assert x.dtype in FLOAT_DTYPES, x.dtype
    assert 1 <= count <= MAX_ROWS, f"{count} rows: the kernel takes 1 to {MAX_ROWS}"
    assert weight.dim() == 2, tuple(weight.shape)
    assert weight.shape[1] == k, (tuple(weight.shape), k)
    assert weight.stride(1) == 1, f"weight rows must be unit-stride, strides {weight.stride()}"
    assert not gated or weight.shape[0] % 2 == 0, f"gated: {weight.shape[0]} rows must be even"
    # the pair failed the compiled bf16 test on the CUDA cores (passed interpreted and on the
    # tensor cores), cause not found; no layer needs it
    assert not (gated and residual is not None), "the gate and the residual are not combined"
    # no layer needs either pair; refused rather than left untested
    assert not (gelu and gated), "the GELU and the gate are not combined"
    assert not (gelu and residual is not None), "the GELU and the residual are not combined"
    assert weight.dtype == x.dtype, (weight.dtype, x.dtype)
    assert weight.device == x.device, "tensors on one device"
    out = torch.empty(*x.shape[:-1], n, device=x.device, dtype=x.dtype)
    total = x
    pending_rows = rows
    if pending is not None:
        assert alpha is not None, "pending is added in the norm's prologue: give alpha"
        assert pending.shape == x.shape, (tuple(pending.shape), tuple(x.shape))
        assert pending.dtype == x.dtype, (pending.dtype, x.dtype)
        assert pending.device == x.device, "tensors on one device"
        pending_rows = _rows(pending, k, "pending")
        total = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    if alpha is not None:
        assert alpha.numel() == k, (tuple(alpha.shape), k)
        assert alpha.is_contiguous(), "alpha must be contiguous"
        assert alpha.device == x.device, "tensors on one device"
    residual_rows = out.view(-1, n)
    if residual is not None:
        assert residual.shape == out.shape, (tuple(residual.shape), tuple(out.shape))
        assert residual.dtype == x.dtype, (residual.dtype, x.dtype)
        assert residual.device == x.device, "tensors on one device"
        residual_rows = _rows(residual, n, "residual")
    if tiles is None:
        # off CUDA (the interpreter) 1 multiprocessor
        resident = RESIDENT_PER_SM * multiprocessors(x.device, off_cuda=1)
        tiles = default_tiles(count, n, k, resident)
    block_m = triton.next_power_of_2(count)
    if tiles.dot:
        block_m = max(16, block_m)  # the tensor cores' smallest tile
        assert min(tiles.block_n, tiles.block_k) >= 16, tiles
    assert tiles.splits == 1 or tiles.swap, f"splits take swapped tiles, {tiles}"
    blocks = triton.cdiv(n, tiles.block_n)
    programs = blocks * tiles.splits  # one a unit of work (a column block, or its part)
    if tiles.programs_per_sm:
        # off CUDA (the interpreter) 1: the cap is then the programs in all
        programs = min(programs, tiles.programs_per_sm * multiprocessors(x.device, off_cuda=1))
    pdl = dependent(x, "fused_linear")
    stages = tiles.stages
    if tiles.swap:
        assert tiles.dot, f"swap takes tensor-core tiles, {tiles}"
        assert tiles.splits >= 1, tiles
        kernel = _swapped_linear_kernel
        # per unit, [block_n, block_m] fp32 sums of the product and as many of the up half
        sums = blocks * tiles.splits * 2 * tiles.block_n * block_m
        workspace = list(_split_workspace(x.device, sums, blocks))
        stages = fitted_stages(
            tiles, block_m, gated, pending is not None, alpha is not None, x.element_size()
        )
        modes = {"norm_k": min(NORM_K, triton.next_power_of_2(k)), "splits": tiles.splits}
    else:
        kernel = _fused_linear_kernel
        workspace = []
        modes = {"dot": tiles.dot}
    kernel[(programs,)](
        rows,
        pending_rows,
        rows if alpha is None else alpha,
        weight,
        residual_rows,
        total,
        out,
        *workspace,
        count,
        n,
        k,
        rows.stride(0),
        pending_rows.stride(0),
        weight.stride(0),
        residual_rows.stride(0),
        eps,
        block_m=block_m,
        block_n=tiles.block_n,
        block_k=tiles.block_k,
        norm=alpha is not None,
        has_pending=pending is not None,
        has_residual=residual is not None,
        gated=gated,
        gelu=gelu,
        **modes,
        # torch's fp32 linear is full fp32 (no TF32), and Triton's interpreter (3.9) gets
        # 16-bit tl.dot wrong: there 16-bit operands go in as fp32 (exact products, same sums)
        widen=x.dtype == torch.float32 or not x.is_cuda,
        pdl=pdl,
        launch_pdl=pdl,
        num_warps=tiles.warps,
        num_stages=stages,
    )
    return total, out


def fused_linear(
    x: Tensor,
    weight: Tensor,
    *,
    alpha: Tensor | None = None,
    eps: float = 0.0,
    residual: Tensor | None = None,
    gated: bool = False,
    gelu: bool = False,
    tiles: Tiles | None = None,
) -> Tensor:
    """x: [..., k] -> [..., n]: linear(rms_norm(x) if alpha is given), then silu(gate) * up
    if `gated`, gelu if `gelu`, plus `residual` if given (module docstring), one launch."""
    return _launch(x, weight, alpha, eps, None, residual, gated, gelu, tiles)[1]


def add_fused_linear(
    x: Tensor,
    pending: Tensor,
    weight: Tensor,
    *,
    alpha: Tensor,
    eps: float,
    gated: bool = False,
    tiles: Tiles | None = None,
) -> tuple[Tensor, Tensor]:
    """x, pending: [..., k] -> (x + pending, linear(rms_norm(x + pending))), one launch."""
    return _launch(x, weight, alpha, eps, pending, None, gated, False, tiles)
