"""A linear layer for a few rows whose weight streams evenly over every multiprocessor
(stream-K): the temporal layer's GEMMs at one to a few calls.

    x:         [..., k]      unit-stride rows, evenly spaced; rows <= fused_linear.MAX_ROWS
    weight:    [n, k]        unit-stride rows; gated: [2 * n, k], rows [gate | up]
    alpha:     [k]           RMSNorm gain (optional), eps its epsilon
    residual:  [..., n]      unit-stride rows (optional; not with the gate)
    out:       [..., n]      contiguous, in x's dtype: as kernels/fused_linear.py's (same
                             rounding points, same reference: fused_linear_reference)

At one row these GEMMs read 33 to 185 MB of weight each and are bound by HBM, yet the tiled
kernels lose a share of it to the grid's shape: one program per column block (or per part of
one) leaves the last wave of programs on part of the multiprocessors (the qkv's 384 units of
the swapped tiles are 2.9 waves of 132), and each program ramps its pipeline up once per
unit. Here the grid is `programs_per_sm` programs per multiprocessor, and the weight's tiles,
[block_n rows, block_k of k] in column-block-major order (k fastest), are cut in as many
contiguous, equal runs:

    tile t = block * k_tiles + k_tile,   program p walks tiles [p T / P, (p + 1) T / P)

in one flat loop, Triton's pipeliner keeping `stages` tiles in flight through shared memory
across the column blocks' boundaries. A column block that one program covers whole is
finished by it (the epilogue of kernels/fused_linear.py's store_block); a block cut between
programs (at most the first and the last of each run) gets each program's fp32 part in the
workspace, and the program that arrives last (kernels/arrivals.py) adds the parts in program
order, whichever it is, and runs the epilogue. The products are fused_linear's swapped ones:
out^T = weight @ x^T on the tensor cores, the rows padded to 16.
"""

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor

from kernels.arrivals import last_to_arrive
from kernels.dependent_launch import dependent, wait_for_inputs
from kernels.device import multiprocessors
from kernels.fused_linear import (
    FLOAT_DTYPES,
    MAX_ROWS,
    NORM_K,
    Tiles,
    fitted_stages,
    inverse_rms,
    normed_rows,
    product_swapped,
    split_workspace,
    store_block,
    weight_tiles,
)

# The tiles measured best at one row on the temporal shapes (bench/kernels_streamed_linear.py)
DEFAULT_TILES = Tiles(block_n=64, block_k=128, dot=True, stages=6, programs_per_sm=1, swap=True)


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _owner(tile, tiles, programs):  # type: ignore[no-untyped-def,unused-ignore]
    """The program whose run holds `tile`: the largest p with p * tiles // programs <= tile."""
    return ((tile + 1) * programs - 1) // tiles


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _merge_block(  # type: ignore[no-untyped-def,unused-ignore]
    partial_ptr,
    arrived_ptr,
    residual_ptr,
    out_ptr,
    stride_residual,
    n,
    row,
    row_in,
    lanes,
    part,
    block,
    k_tiles,
    tiles,
    programs,
    has_residual: tl.constexpr,
    gated: tl.constexpr,
):
    """Counts this program's part of a cut column block; the last to arrive adds every
    program's part, in program order, and stores the block."""
    block_n: tl.constexpr = lanes.shape[0]
    block_m: tl.constexpr = row.shape[0]
    first = _owner(block * k_tiles, tiles, programs)
    final = _owner(block * k_tiles + k_tiles - 1, tiles, programs)
    if last_to_arrive(arrived_ptr, block, final - first + 1):
        acc = tl.zeros([block_n, block_m], dtype=tl.float32)
        acc_up = tl.zeros([block_n, block_m], dtype=tl.float32)
        for owner in range(first, final + 1):
            # the block is the owner's first (slot 0) or its last (slot 1)
            later = (owner * tiles // programs) // k_tiles != block
            slot = 2 * owner + later.to(tl.int32)
            sums = partial_ptr + tl.cast(slot, tl.int64) * (2 * block_n * block_m) + part
            acc += tl.load(sums, cache_modifier=".cg")
            if gated:
                acc_up += tl.load(sums + block_n * block_m, cache_modifier=".cg")
        store_block(
            tl.trans(acc), tl.trans(acc_up), residual_ptr, out_ptr, stride_residual, n, row,
            row_in, block * block_n + lanes, has_residual, gated, False,
        )  # fmt: skip


@triton.jit(do_not_specialize=["rows"])  # type: ignore[untyped-decorator,unused-ignore]
def _streamed_linear_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    x_ptr,
    alpha_ptr,
    weight_ptr,
    residual_ptr,
    out_ptr,
    partial_ptr,
    arrived_ptr,
    rows,
    n,
    k,
    stride_x,
    stride_weight,
    stride_residual,
    eps,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
    block_k: tl.constexpr,
    norm_k: tl.constexpr,
    norm: tl.constexpr,
    has_residual: tl.constexpr,
    gated: tl.constexpr,
    widen: tl.constexpr,
    pdl: tl.constexpr,
):
    program = tl.program_id(0)
    programs = tl.num_programs(0)
    row = tl.arange(0, block_m)
    row_in = row < rows
    lanes = tl.arange(0, block_n)
    steps = tl.arange(0, block_k)
    k_tiles = tl.cdiv(k, block_k)
    tiles = tl.cdiv(n, block_n) * k_tiles
    begin = program * tiles // programs
    end = (program + 1) * tiles // programs
    first_block = begin // k_tiles
    last_block = (end - 1) // k_tiles
    # a part's sums in partial_ptr: [block_n, block_m], and the up half's after them
    part = lanes[:, None] * block_m + row[None, :]
    wait_for_inputs(pdl)
    inv = tl.zeros([block_m], dtype=tl.float32)  # read only when norm
    if norm:
        inv = inverse_rms(
            x_ptr, x_ptr, x_ptr, stride_x, stride_x, k, eps, row, row_in,
            tl.arange(0, norm_k), False, False,
        )  # fmt: skip
    acc = tl.zeros([block_n, block_m], dtype=tl.float32)
    acc_up = tl.zeros([block_n, block_m], dtype=tl.float32)
    for tile in range(begin, end):
        block = tile // k_tiles
        k_tile = tile % k_tiles
        col = block * block_n + lanes
        cols = k_tile * block_k + steps
        w, w_up = weight_tiles(weight_ptr, stride_weight, n, k, col, cols, gated)
        x = normed_rows(
            x_ptr, x_ptr, alpha_ptr, stride_x, stride_x, row, row_in, cols, k, inv, norm, False
        )
        acc = product_swapped(acc, w, x, widen)
        if gated:
            acc_up = product_swapped(acc_up, w_up, x, widen)
        if (k_tile == k_tiles - 1) | (tile == end - 1):  # this program's part of the block ends
            whole = (block * k_tiles >= begin) & (k_tile == k_tiles - 1)
            if whole:
                store_block(
                    tl.trans(acc), tl.trans(acc_up), residual_ptr, out_ptr, stride_residual, n,
                    row, row_in, col, has_residual, gated, False,
                )  # fmt: skip
            else:
                slot = 2 * program + (block != first_block).to(tl.int32)
                sums = partial_ptr + tl.cast(slot, tl.int64) * (2 * block_n * block_m) + part
                tl.store(sums, acc)
                if gated:
                    tl.store(sums + block_n * block_m, acc_up)
            acc = tl.zeros([block_n, block_m], dtype=tl.float32)
            acc_up = tl.zeros([block_n, block_m], dtype=tl.float32)
    # the cut blocks: at most this run's first and its last
    if (first_block * k_tiles < begin) | ((first_block + 1) * k_tiles > end):
        _merge_block(
            partial_ptr, arrived_ptr, residual_ptr, out_ptr, stride_residual, n, row, row_in,
            lanes, part, first_block, k_tiles, tiles, programs, has_residual, gated,
        )  # fmt: skip
    if (last_block != first_block) & ((last_block + 1) * k_tiles > end):
        _merge_block(
            partial_ptr, arrived_ptr, residual_ptr, out_ptr, stride_residual, n, row, row_in,
            lanes, part, last_block, k_tiles, tiles, programs, has_residual, gated,
        )  # fmt: skip


def streamed_linear(
    x: Tensor,
    weight: Tensor,
    *,
    alpha: Tensor | None = None,
    eps: float = 0.0,
    residual: Tensor | None = None,
    gated: bool = False,
    tiles: Tiles = DEFAULT_TILES,
    programs: int | None = None,
) -> Tensor:
    """x: [..., k] -> [..., n]: linear(rms_norm(x) if alpha is given), then silu(gate) * up
    if `gated`, or plus `residual` if given (module docstring), one launch. `programs`: the
    grid (tests; default `tiles.programs_per_sm` per multiprocessor, at most one per tile)."""
    k = x.shape[-1]
    assert x.dtype in FLOAT_DTYPES, x.dtype
    assert x.stride(-1) == 1, f"x rows must be unit-stride, strides {x.stride()}"
    rows = x.view(-1, k)
    count = rows.shape[0]
    assert 1 <= count <= MAX_ROWS, f"{count} rows: the kernel takes 1 to {MAX_ROWS}"
    assert weight.dim() == 2, tuple(weight.shape)
    assert weight.shape[1] == k, (tuple(weight.shape), k)
    assert weight.stride(1) == 1, f"weight rows must be unit-stride, strides {weight.stride()}"
    assert weight.dtype == x.dtype, (weight.dtype, x.dtype)
    assert weight.device == x.device, "tensors on one device"
    assert not gated or weight.shape[0] % 2 == 0, f"gated: {weight.shape[0]} rows must be even"
    assert not (gated and residual is not None), "the gate and the residual are not combined"
    assert tiles.dot, f"tensor-core tiles only, {tiles}"
    assert min(tiles.block_n, tiles.block_k) >= 16, tiles
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    out = torch.empty(*x.shape[:-1], n, device=x.device, dtype=x.dtype)
    residual_rows = out.view(-1, n)
    if residual is not None:
        assert residual.shape == out.shape, (tuple(residual.shape), tuple(out.shape))
        assert residual.dtype == x.dtype, (residual.dtype, x.dtype)
        assert residual.device == x.device, "tensors on one device"
        assert residual.stride(-1) == 1, f"residual rows unit-stride, {residual.stride()}"
        residual_rows = residual.view(-1, n)
    if alpha is not None:
        assert alpha.numel() == k, (tuple(alpha.shape), k)
        assert alpha.is_contiguous(), "alpha must be contiguous"
        assert alpha.device == x.device, "tensors on one device"
    block_m = max(16, triton.next_power_of_2(count))  # the tensor cores' smallest tile
    blocks = triton.cdiv(n, tiles.block_n)
    tile_count = blocks * triton.cdiv(k, tiles.block_k)
    if programs is None:
        # off CUDA (the interpreter) 1 multiprocessor: tests pass `programs`
        programs = tiles.programs_per_sm * multiprocessors(x.device, off_cuda=1)
    programs = max(1, min(programs, tile_count))
    # two parts per program, [block_n, block_m] fp32 sums of the product and of the up half
    partial, arrived = split_workspace(x.device, programs * 2 * 2 * tiles.block_n * block_m, blocks)
    stages = fitted_stages(tiles, block_m, gated, False, alpha is not None, x.element_size())
    pdl = dependent(x, "streamed_linear")
    _streamed_linear_kernel[(programs,)](
        rows,
        rows if alpha is None else alpha,
        weight,
        residual_rows,
        out,
        partial,
        arrived,
        count,
        n,
        k,
        rows.stride(0),
        weight.stride(0),
        residual_rows.stride(0),
        eps,
        block_m=block_m,
        block_n=tiles.block_n,
        block_k=tiles.block_k,
        norm_k=min(NORM_K, triton.next_power_of_2(k)),
        norm=alpha is not None,
        has_residual=residual is not None,
        gated=gated,
        # as fused_linear: fp32 exact, and the interpreter's 16-bit tl.dot is wrong
        widen=x.dtype == torch.float32 or not x.is_cuda,
        pdl=pdl,
        launch_pdl=pdl,
        num_warps=tiles.warps,
        num_stages=stages,
    )
    return out
