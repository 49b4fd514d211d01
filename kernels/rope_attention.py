"""RoPE, the KV ring append and decode attention over the ring in one launch: the temporal
transformer's attention step for rings in the model's dtype.

The step is two launches a layer otherwise: kernels/kv_append.py rotates q and k and writes
k and v into the ring, then kernels/ring_attention.py attends over the ring (32 + 32 a tick at
7B; at one call each of those launches is ~2 us of a chain of ~800). Here every program of
the attention's grid (a split of a (slot, head) row's ring, ring_attention's pass 1) reads its
head's q, k and v from the projection itself and rotates q; the program whose split holds the
step's own entry (final = position mod capacity) also rotates k, writes k and v there, and
waits for its threads to have written them (a CTA barrier) before its loop reads the ring.
No other program reads that entry, so nothing waits across programs; then pass 1 and the
merge are ring_attention's (`attend_split`), unchanged:

    qkv:          [B, 1, 3, H, D]   in_proj's output viewed per part and head (D unit-stride)
    start:        int64 [B]         the step's position (frames since reset)
    freqs:        fp32 [D / 2]      attention.py's rope_frequencies
    keys, values: [B, H, capacity, D] this layer's ring, contiguous, qkv's dtype
    returns       [B, H, D]         the attention's output, qkv's dtype

The rotation is kv_append's arithmetic: the position in fp32, the angle one product,
libdevice's cos and sin, each product rounded before the sum (explicitly rounded multiplies
when compiled, where kv_append turns contraction off for its whole launch, which here would
change pass 1's own arithmetic; libdevice's mul_rn comes in its flush-to-zero form, so a
denormal product alone could differ), q and k rounded to the model's dtype. Each element is
rotated in place with its pair's partner loaded beside it, so q has the layout of pass 1's
plain load: built for sm_90 with Triton 3.6 (`bench/kernels_ring_sass.py --rope --block 16
--warps 1 --stages 3 --splits 16`) the loop is 486 instructions a tile against the plain
pass 1's 476, 177 registers against 179, no spills (32 bytes of stack: libdevice's trig
reduction). The ring entries and the output are those two launches' bit for bit in Triton's
interpreter (tests/kernels/test_rope_attention.py, tests/kernels/test_ring_attention_moshi.py),
and compiled on an H100. fp8 rings keep the two launches: their entries' scales and
quantization stay in kv_append.

Served on CUDA with bf16 rings (RingAttention.append_in_attention; the engine's
ModelOptions, off with --no-rope-in-attention): on an H100 it took 26 us off the 1-call
step's p50, three pairs alternated on the 80 ms clock (docs/gpu-log.md, 2026-12-07);
compiled tests pass there.
"""

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor
from triton.language.extra import libdevice  # type: ignore[import-not-found,import-untyped,unused-ignore]

from kernels.dependent_launch import dependent, wait_for_inputs
from kernels.ring_attention import EMPTY_MAX, SplitWork, attend_split, pass1_program


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _rotated(x_ptr, dims, cos, sin, compiled: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
    """The head_dim elements at x_ptr rotated pairwise, in their own (interleaved) order and
    fp32: an even element is the pair's real part, real cos - imag sin, an odd one its
    imaginary part, real sin + imag cos (cos, sin: each element's pair's), each product
    rounded before the sum, as kv_append rounds them."""
    x = tl.load(x_ptr + dims).to(tl.float32)
    partner = tl.load(x_ptr + (dims ^ 1)).to(tl.float32)  # the pair's other element
    real = (dims % 2) == 0
    if compiled:
        x_cos = libdevice.mul_rn(x, cos)
        partner_sin = libdevice.mul_rn(partner, sin)
    else:  # the interpreter never contracts
        x_cos = x * cos
        partner_sin = partner * sin
    return tl.where(real, x_cos - partner_sin, partner_sin + x_cos)


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _rope_split_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    qkv_ptr,
    freqs_ptr,
    k_ptr,
    v_ptr,
    start_ptr,
    out_ptr,
    max_ptr,
    sum_ptr,
    acc_ptr,
    arrived_ptr,
    stride_batch,
    stride_part,
    stride_head,
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
    compiled: tl.constexpr,
    pdl: tl.constexpr,
):
    dims = tl.arange(0, head_dim)
    freqs = tl.load(freqs_ptr + dims // 2)  # each element's pair's; fixed: before the wait
    wait_for_inputs(pdl)
    row = tl.program_id(0)  # slot * heads + head
    slot = row // heads
    head = row % heads
    last = tl.load(start_ptr + slot)  # this step's position, int64
    source = qkv_ptr + slot.to(tl.int64) * stride_batch + head * stride_head
    dtype = qkv_ptr.dtype.element_ty
    angle = freqs * last.to(tl.float32)
    cos = tl.cos(angle)  # libdevice cosf on CUDA, as kv_append
    sin = tl.sin(angle)
    # q in the layout of a plain load, as ring_attention's pass 1 has it
    q = _rotated(source, dims, cos, sin, compiled).to(dtype)
    final = last % capacity
    if tl.program_id(1) == (final // split_frames).to(tl.int32):  # the split holding it
        entry = (row.to(tl.int64) * capacity + final) * head_dim + dims
        k = _rotated(source + stride_part, dims, cos, sin, compiled)
        tl.store(k_ptr + entry, k.to(dtype))
        tl.store(v_ptr + entry, tl.load(source + 2 * stride_part + dims))
        # the entry is written by this program's threads before any of them reads the ring
        tl.debug_barrier()
    attend_split(
        q, k_ptr, v_ptr, out_ptr, max_ptr, sum_ptr, acc_ptr, arrived_ptr, row, last, capacity,
        context, split_frames, splits, qk_scale_log2, head_dim, block_n, splits_pow2, direct,
        empty, precision,
    )  # fmt: skip


def rope_ring_attention(
    qkv: Tensor,
    start: Tensor,
    keys: Tensor,
    values: Tensor,
    freqs: Tensor,
    context: int,
    splits: int | None = None,
) -> Tensor:
    """The step's attention with RoPE and the ring append (module docstring): qkv [B, 1, 3,
    H, D] -> [B, H, D]; `splits` as ring_attention's (tests force the merge with it)."""
    batch, steps, parts, heads, head_dim = qkv.shape
    capacity = keys.shape[2]
    assert steps == 1, f"one frame per slot, got {steps}"
    assert parts == 3, f"qkv must be [B, 1, 3, H, D], got {tuple(qkv.shape)}"
    assert qkv.stride(4) == 1, f"qkv's head_dim must be unit-stride, strides {qkv.stride()}"
    assert qkv.dtype in (torch.float32, torch.float16, torch.bfloat16), qkv.dtype
    assert head_dim in (16, 32, 64, 128, 256), f"head_dim {head_dim} must be a power of two"
    assert keys.shape == (batch, heads, capacity, head_dim), (keys.shape, qkv.shape)
    assert values.shape == keys.shape, (values.shape, keys.shape)
    assert keys.is_contiguous(), "the key ring must be contiguous"
    assert values.is_contiguous(), "the value ring must be contiguous"
    assert keys.dtype == values.dtype == qkv.dtype, (keys.dtype, values.dtype, qkv.dtype)
    assert start.shape == (batch,), (start.shape, batch)
    assert start.dtype == torch.int64, start.dtype
    assert freqs.shape == (head_dim // 2,), (freqs.shape, head_dim)
    assert freqs.dtype == torch.float32, freqs.dtype
    assert freqs.is_contiguous(), "freqs must be contiguous"
    for t in (keys, values, start, freqs):
        assert t.device == qkv.device, "tensors on one device"
    assert 1 <= context <= capacity, (context, capacity)
    block_n, num_warps, num_stages = pass1_program(batch * heads, fp8=False)
    work = SplitWork.of(batch, heads, head_dim, capacity, qkv.device, qkv.dtype, block_n, splits)
    part_max, part_sum, part_acc, arrived, out = work.buffers
    pdl = dependent(qkv, "ring_attention")
    _rope_split_kernel[(batch * heads, work.splits)](
        qkv,
        freqs,
        keys,
        values,
        start,
        out,
        part_max,
        part_sum,
        part_acc,
        arrived,
        qkv.stride(0),
        qkv.stride(2),
        qkv.stride(3),
        heads,
        capacity,
        context,
        work.split_frames,
        work.splits,
        work.qk_scale_log2,
        head_dim=head_dim,
        block_n=block_n,
        **work.merge,
        empty=EMPTY_MAX,
        precision=work.precision,
        compiled=qkv.is_cuda,
        num_warps=num_warps,
        num_stages=num_stages,
        pdl=pdl,
        launch_pdl=pdl,
    )
    return out
