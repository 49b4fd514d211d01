"""The depth transformer's attention for one step: append this step's key and value to the
frame's scratch and attend over steps 0..step, as one launch.

Inside a frame the depformer runs its steps one after the other; step s attends to the keys
and values of steps 0..s of this frame only (no mask: all earlier steps are visible):

    qkv:           [slots, 3 * dim]   in_proj's output, rows [q heads | k heads | v heads]
    keys, values:  [slots, heads, steps, head_dim]   scratch, contiguous; entries < step hold
                   this frame's earlier steps, entry `step` is written here
    out:           [slots, dim]       softmax(q k^T / sqrt(head_dim)) v, heads side by side

In torch that is two slice writes and an SDPA call. One program per (slot, head): with at most
16 steps of head_dim 64 the whole tile fits in registers, the products run on the CUDA cores in
fp32. The current step's key and value are used from registers, not read back after the store.

Predicted before measuring (H200, bf16, CUDA graph): ~2.5 us per launch, against ~3 for
the slice writes and SDPA; with the fused norms, gate and the one-GEMM input projection, the
depformer stage at 1 slot goes from 1497 to ~420 kernels and from 4.29 to ~1.5 ms.

Measured on one H200 (torch 2.11, triton 3.6; `python bench/kernels_layer.py --slots 1,128`,
bench/results/kernels_layer.json), bf16, 16 heads of 64, step 7 of 8, per call inside a CUDA
graph: 2.67 us at 1 slot and 3.48 us at 128 slots, against 8.09 and 17.62 us for the slice
writes and SDPA. The depformer stage (bench/engine_stages.py,
bench/results/engine_stages_layer_kernels.json) went from 1497 to 466 kernels, 4.29 to 1.90 ms
at 1 slot and 5.78 to 2.18 ms at 128 slots (in the same run with `fused` off: 4.13 and
5.40 ms). That is 48 launches more than predicted, one per layer and step, at 1 and at 128 slots:
not identified yet (the bench now records the most launched kernel names per stage; the run
that made the JSON predates that). Likely a second launch inside one of the four GEMMs of a
layer step (a split-K reduction): the count does not change with the slot count, and the
torch path's 1497 is about as far above its own launch tally. Since then: with
kernels/fused_linear.py (up to 4 slots) a layer step lost 4 launches, not the 3 planned, and
the residual addmm is two kernels in bench/kernels_fused_linear.py (`before_kernels`), the
linears one: likely that addmm. On the same GPU the fused model passed
tests/engine/test_graph_executor.py (graph tokens = eager tokens) and the 7B bf16 logits test
of tests/engine/models/moshi/test_gpu_7b.py; the fp32 7B token test was not run.
"""

import math

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor

from kernels.dependent_launch import dependent, wait_for_inputs


def step_attention_reference(qkv: Tensor, keys: Tensor, values: Tensor, step: int) -> Tensor:
    """Writes step's key and value into the scratch, returns fp32 attention in qkv's dtype."""
    slots, heads, _, head_dim = keys.shape
    q, k, v = qkv.view(slots, 3, heads, head_dim).unbind(1)  # each [slots, heads, head_dim]
    keys[:, :, step] = k
    values[:, :, step] = v
    scores = torch.einsum("bhd,bhnd->bhn", q.float(), keys[:, :, : step + 1].float())
    weights = torch.softmax(scores / math.sqrt(head_dim), dim=-1)
    out = torch.einsum("bhn,bhnd->bhd", weights, values[:, :, : step + 1].float())
    return out.reshape(slots, heads * head_dim).to(qkv.dtype)


# step is not specialised: values 0, 1 and 16k would each compile their own variant
@triton.jit(do_not_specialize=["step"])  # type: ignore[untyped-decorator,unused-ignore]
def _step_attention_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    qkv_ptr,
    keys_ptr,
    values_ptr,
    out_ptr,
    stride_qkv_row,
    heads,
    steps,
    step,
    scale,
    head_dim: tl.constexpr,
    steps_pow2: tl.constexpr,
    pdl: tl.constexpr,
):
    wait_for_inputs(pdl)
    row = tl.program_id(0)  # slot * heads + head
    slot = row // heads
    head = row % heads
    dim = heads * head_dim
    dims = tl.arange(0, head_dim)
    source = qkv_ptr + slot.to(tl.int64) * stride_qkv_row + head * head_dim + dims
    q = tl.load(source).to(tl.float32)
    k = tl.load(source + dim)
    v = tl.load(source + 2 * dim)
    scratch = row.to(tl.int64) * steps * head_dim
    tl.store(keys_ptr + scratch + step * head_dim + dims, k)
    tl.store(values_ptr + scratch + step * head_dim + dims, v)
    entries = tl.arange(0, steps_pow2)
    earlier = (entries < step)[:, None]
    current = (entries == step)[:, None]
    offsets = scratch + entries[:, None] * head_dim + dims[None, :]
    keys = tl.load(keys_ptr + offsets, mask=earlier, other=0.0).to(tl.float32)
    keys = tl.where(current, k.to(tl.float32)[None, :], keys)
    values = tl.load(values_ptr + offsets, mask=earlier, other=0.0).to(tl.float32)
    values = tl.where(current, v.to(tl.float32)[None, :], values)
    scores = tl.sum(keys * q[None, :], axis=1) * scale
    scores = tl.where(entries <= step, scores, float("-inf"))
    weights = tl.exp(scores - tl.max(scores, axis=0))
    out = tl.sum(weights[:, None] * values, axis=0) / tl.sum(weights, axis=0)
    tl.store(out_ptr + slot.to(tl.int64) * dim + head * head_dim + dims, out.to(k.dtype))


def step_attention(qkv: Tensor, keys: Tensor, values: Tensor, step: int) -> Tensor:
    """See the module docstring: qkv [slots, 3 * dim] -> [slots, dim]; writes the scratch."""
    slots, heads, steps, head_dim = keys.shape
    assert qkv.shape == (slots, 3 * heads * head_dim), (qkv.shape, keys.shape)
    assert qkv.stride(-1) == 1, f"qkv rows must be unit-stride, strides {qkv.stride()}"
    assert values.shape == keys.shape, (values.shape, keys.shape)
    assert keys.is_contiguous(), "the key scratch must be contiguous"
    assert values.is_contiguous(), "the value scratch must be contiguous"
    assert qkv.dtype == keys.dtype == values.dtype, (qkv.dtype, keys.dtype, values.dtype)
    assert qkv.dtype in (torch.float32, torch.float16, torch.bfloat16), qkv.dtype
    assert qkv.device == keys.device == values.device, "tensors on one device"
    assert head_dim in (16, 32, 64, 128), f"head_dim {head_dim} must be a power of two"
    assert 0 <= step < steps, (step, steps)
    out = torch.empty(slots, heads * head_dim, device=qkv.device, dtype=qkv.dtype)
    pdl = dependent(qkv, "step_attention")
    _step_attention_kernel[(slots * heads,)](
        qkv,
        keys,
        values,
        out,
        qkv.stride(0),
        heads,
        steps,
        step,
        1.0 / math.sqrt(head_dim),
        head_dim=head_dim,
        steps_pow2=triton.next_power_of_2(steps),
        num_warps=1,
        pdl=pdl,
        launch_pdl=pdl,
    )
    return out
