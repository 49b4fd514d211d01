"""The depth transformer's attention and its output projection + residual, as one launch.

At a few slots the depformer's layer step is a chain of dependent launches of a few
microseconds each, and its attention over the frame's steps (at most 8 entries of 16 heads)
was one of them (kernels/step_attention.py, 48 a tick). Here every program of the output
projection first attends itself, for all heads, then multiplies the result by its columns of
the projection:

    qkv:           [rows, 3 * dim]   in_proj's output, rows [q heads | k heads | v heads]
    keys, values:  [slots, heads, steps, head_dim]   this layer's scratch, contiguous; entries
                   < step hold this frame's earlier steps; entry `step` is written here
    weight:        [n, dim]          out_proj's weight, unit-stride rows
    residual:      [rows, n]         unit-stride rows
    out:           [rows, n]         residual + attention(q, keys, values) @ weight^T

    attention      softmax(q k^T / sqrt(head_dim)) v over entries 0..step, fp32, rounded to
                   the model dtype (as step_attention rounds it); the product summed in fp32,
                   rounded, then added to the residual and rounded (as fused_linear does)

Program 0 writes this step's key and value into the scratch (later steps' launches read them);
every program takes the current ones from qkv. A program reads the rows' q, k and v and all
the earlier entries at once (one round trip to L2; a first version read them entry by entry,
twice, and the 1-slot depformer stage ran 1.16 -> 1.21 ms, bench/results/
engine_stages_fusions_{old,new}.json): a few tens of KB, so the grid is kept small (BLOCK_N
columns each: 128 programs at dim 1024) rather than one program per pair of columns as
fused_linear's. A program's weight tile (all of its columns) is loaded before the wait for
the previous kernel (kernels/dependent_launch.py). Products on the CUDA cores, the rows at most
MAX_ROWS (the entries' and the broadcast product's registers; the warps grow with the rows).

Measured on one H200 (torch 2.11, Triton 3.6, bf16, 7B shapes, random weights): the 1-slot
depformer stage 1.10 ms and 218 kernels (`python3 bench/engine_stages.py --slots 1`,
bench/results/engine_stages_1_prefetch.json) against 1.16 ms and 266 kernels with
step_attention and fused_linear in an earlier run (engine_stages_fusions_old.json; not the
same run). With the Mimi change of the same commit, the 1-call tick on the 80 ms clock in one
run: step p50 6.84 -> 6.70 ms against commit c4f227d (bench_engine_bf16_1_attended_*.json).
Alone, at the depformer's shapes, us per layer step against the two launches it replaces (one
run, `python3 bench/kernels_layer.py --slots 1,2,3,4`,
bench/results/kernels_layer_attended_rows.json): 1 row 2.72 (3.40), 2 rows 3.50 (4.21),
3 rows 6.06 (4.91), 4 rows 6.20 (4.54). From 3 rows it lost (where it runs 16 warps a
program; why it loses there was not profiled), so MAX_ROWS is 2, down from the 4 it was
first built for: the depformer's 3- and 4-slot steps keep the attention apart.
The depformer stage, this limit against 4, two alternating pairs in one run (`python3
bench/engine_stages.py --slots 1,2,3,4 --stages depformer`, bench/results/
engine_stages_depformer_{old,new}_{1,2}.json), ms: 3 slots 1.62 / 1.60 -> 1.61 / 1.53, 4 slots
1.64 / 1.62 -> 1.62 / 1.55 (266 kernels against 218), 1 and 2 slots unchanged (1.00-1.01,
1.21-1.24): a small gain, at most about the run-to-run spread.
"""

import math

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor

from kernels.dependent_launch import dependent, wait_for_inputs
from kernels.fused_linear import STREAM, store_block

# measured faster than step_attention + fused_linear up to 2 rows only (module docstring)
MAX_ROWS = 2
BLOCK_N = 8  # output columns per program


@triton.jit(do_not_specialize=["rows", "step"])  # type: ignore[untyped-decorator,unused-ignore]
def _attended_linear_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    qkv_ptr,
    keys_ptr,
    values_ptr,
    weight_ptr,
    residual_ptr,
    out_ptr,
    rows,
    n,
    stride_qkv,
    stride_weight,
    stride_residual,
    steps,
    step,
    scale,
    heads: tl.constexpr,
    head_dim: tl.constexpr,
    steps_pow2: tl.constexpr,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
    pdl: tl.constexpr,
):
    dim: tl.constexpr = heads * head_dim
    program = tl.program_id(0)
    row = tl.arange(0, block_m)
    row_in = row < rows
    cols = tl.arange(0, dim)
    inside = row_in[:, None]
    col = program * block_n + tl.arange(0, block_n)
    w_offsets = col.to(tl.int64)[:, None] * stride_weight + cols[None, :]
    # weights are never written in a tick: loaded before the wait (module docstring)
    w = tl.load(weight_ptr + w_offsets, mask=(col < n)[:, None], other=0.0, eviction_policy=STREAM)
    wait_for_inputs(pdl)
    source = qkv_ptr + row[:, None].to(tl.int64) * stride_qkv + cols[None, :]
    q = tl.load(source, mask=inside, other=0.0).to(tl.float32)
    k_now = tl.load(source + dim, mask=inside, other=0.0)
    v_now = tl.load(source + 2 * dim, mask=inside, other=0.0)
    # [block_m, steps_pow2, dim]: entry e of the rows' heads side by side; all the earlier
    # entries in one load (one round trip to L2), the current one from qkv
    entries = tl.arange(0, steps_pow2)
    scratch = (row[:, None] * heads + (cols // head_dim)[None, :]) * (steps * head_dim)
    scratch = scratch + (cols % head_dim)[None, :]
    if program == 0:
        tl.store(keys_ptr + scratch + step * head_dim, k_now, mask=inside)
        tl.store(values_ptr + scratch + step * head_dim, v_now, mask=inside)
    at = scratch[:, None, :] + (entries * head_dim)[None, :, None]
    earlier = inside[:, :, None] & (entries < step)[None, :, None]
    current = (entries == step)[None, :, None]
    keys = tl.load(keys_ptr + at, mask=earlier, other=0.0)
    keys = tl.where(current, k_now[:, None, :], keys).to(tl.float32)
    values = tl.load(values_ptr + at, mask=earlier, other=0.0)
    values = tl.where(current, v_now[:, None, :], values).to(tl.float32)
    products = tl.reshape(q[:, None, :] * keys, [block_m, steps_pow2, heads, head_dim])
    scores = tl.sum(products, axis=3) * scale  # [block_m, steps_pow2, heads]
    scores = tl.where((entries <= step)[None, :, None], scores, float("-inf"))
    shares = tl.exp(scores - tl.max(scores, axis=1)[:, None, :])
    total = tl.sum(shares, axis=1)  # [block_m, heads]
    spread = tl.broadcast_to(shares[:, :, :, None], [block_m, steps_pow2, heads, head_dim])
    mixed = tl.sum(tl.reshape(spread, [block_m, steps_pow2, dim]) * values, axis=1)
    per_column = tl.broadcast_to(total[:, :, None], [block_m, heads, head_dim])
    dtype = out_ptr.dtype.element_ty
    attended = (mixed / tl.reshape(per_column, [block_m, dim])).to(dtype).to(tl.float32)
    acc = tl.sum(attended[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    # the residual epilogue (no gate, no GELU); the second sums are the gate's up half, unused
    store_block(
        acc, acc, residual_ptr, out_ptr, stride_residual, n, row, row_in, col, True, False, False
    )


def attended_linear_reference(
    qkv: Tensor, keys: Tensor, values: Tensor, step: int, weight: Tensor, residual: Tensor
) -> Tensor:
    """Writes step's key and value into the scratch (of exactly the rows' slots: pass
    keys[:rows], values[:rows]); residual + attention @ weight^T, rounded
    where the module docstring says (the attention as step_attention_reference's)."""
    # imported here: the reference is for tests and benches
    from kernels.step_attention import step_attention_reference

    attended = step_attention_reference(qkv, keys, values, step)
    product = torch.nn.functional.linear(attended.float(), weight.float()).to(qkv.dtype)
    return residual + product


def attended_linear(
    qkv: Tensor, keys: Tensor, values: Tensor, step: int, weight: Tensor, residual: Tensor
) -> Tensor:
    """qkv [rows, 3 * dim], scratch [slots >= rows, heads, steps, head_dim], weight [n, dim],
    residual [rows, n] -> [rows, n] (module docstring); writes the scratch's entry `step`."""
    rows, width = qkv.shape
    _, heads, steps, head_dim = keys.shape
    dim = heads * head_dim
    n = weight.shape[0]
    assert width == 3 * dim, (tuple(qkv.shape), tuple(keys.shape))
    assert 1 <= rows <= MAX_ROWS, f"{rows} rows: the kernel takes 1 to {MAX_ROWS}"
    assert rows <= keys.shape[0], (rows, tuple(keys.shape))
    assert dim & (dim - 1) == 0, f"width {dim} must be a power of two"
    assert head_dim & (head_dim - 1) == 0, f"head_dim {head_dim} must be a power of two"
    assert qkv.stride(-1) == 1, f"qkv rows must be unit-stride, strides {qkv.stride()}"
    assert keys.is_contiguous(), "the key scratch must be contiguous"
    assert values.is_contiguous(), "the value scratch must be contiguous"
    assert values.shape == keys.shape, (tuple(values.shape), tuple(keys.shape))
    assert weight.shape == (n, dim), (tuple(weight.shape), dim)
    assert weight.stride(1) == 1, f"weight rows must be unit-stride, strides {weight.stride()}"
    assert residual.shape == (rows, n), (tuple(residual.shape), rows, n)
    assert residual.stride(1) == 1, f"residual rows must be unit-stride, {residual.stride()}"
    assert qkv.dtype in (torch.float32, torch.float16, torch.bfloat16), qkv.dtype
    for tensor in (keys, values, weight, residual):
        assert tensor.dtype == qkv.dtype, (tensor.dtype, qkv.dtype)
        assert tensor.device == qkv.device, "tensors on one device"
    assert 0 <= step < steps, (step, steps)
    out = torch.empty(rows, n, device=qkv.device, dtype=qkv.dtype)
    pdl = dependent(qkv, "attended_linear")
    _attended_linear_kernel[(triton.cdiv(n, BLOCK_N),)](
        qkv,
        keys,
        values,
        weight,
        residual,
        out,
        rows,
        n,
        qkv.stride(0),
        weight.stride(0),
        residual.stride(0),
        steps,
        step,
        1.0 / math.sqrt(head_dim),
        heads=heads,
        head_dim=head_dim,
        steps_pow2=triton.next_power_of_2(steps),
        block_m=triton.next_power_of_2(rows),
        block_n=BLOCK_N,
        pdl=pdl,
        launch_pdl=pdl,
        # the entries' tiles hold rows * steps * dim values: at the 7B shapes (8 steps of
        # 1024) 64 a thread at any row count
        num_warps=4 * triton.next_power_of_2(rows),
    )
    return out
