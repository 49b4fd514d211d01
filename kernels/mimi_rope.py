"""The RoPE tables of one Mimi transformer step in one launch.

Each step of Mimi's fused transformers (engine/models/moshi/mimi/transformer.py) feeds T
frames per slot at positions start + 0 .. T - 1 and rotates queries and keys by the angles
freqs * position (kernels/mimi_transformer.py's ring_attention_step reads them as tables).
In torch ops the tables are an arange, an add, the cast to fp32, a product, a cosine and a
sine, and the positions move on after the layers in a seventh launch: seven launches of a
few hundred bytes at one call, per direction of the codec. Here, in one:

    positions: int64 [slots]   freqs: fp32 [head_dim / 2]
    cos, sin: fp32 [slots, T, head_dim / 2] of angles freqs * float32(start + t),
    start: int64 [slots], the positions before this step (what the layers read)
    positions <- start + T

the same arithmetic (the position rounded to fp32, one product, then CUDA's cosf and sinf
through libdevice when compiled, which torch's CUDA kernels call too; numpy's in Triton's
interpreter, within a few ulp of torch's CPU ones). Triton links libdevice's flush-to-zero
variants (fma.rn.ftz in the sm_90 build, bench/kernels_glue_sass.py), so the bits can
differ from torch's only where a denormal arises, which angles of at least freqs[-1] * 1
(~1e-4) and their sines and cosines do not reach. One program per slot.

Served on CUDA with the other glue kernels (MimiCodec.use_glue_kernels; the engine's
ModelOptions, off with --no-mimi-glue-kernels): on an H100 they took 51 us off the 1-call
step's p50, three pairs alternated on the 80 ms clock (docs/gpu-log.md, 2026-12-07); compiled
tests pass there.
"""

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor
from triton.language.extra import libdevice  # type: ignore[import-not-found,import-untyped,unused-ignore]

from kernels.dependent_launch import dependent, wait_for_inputs
from kernels.mimi_transformer import rope_tables


def step_rope_tables_reference(
    positions: Tensor, steps: int, freqs: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The codec's torch ops: the tables of positions + arange(steps) (rope_tables), the
    positions before, and then the positions moved on."""
    start = positions.clone()
    cos, sin = rope_tables(start[:, None] + torch.arange(steps, device=start.device), freqs)
    positions.add_(steps)
    return cos, sin, start


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _rope_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    positions_ptr,
    freqs_ptr,
    cos_ptr,
    sin_ptr,
    start_ptr,
    steps,
    half,
    compiled: tl.constexpr,
    block_t: tl.constexpr,
    block_f: tl.constexpr,
    pdl: tl.constexpr,
):
    slot = tl.program_id(0).to(tl.int64)
    times = tl.arange(0, block_t)
    bands = tl.arange(0, block_f)
    freqs = tl.load(freqs_ptr + bands, mask=bands < half, other=0.0)  # fixed: before the wait
    wait_for_inputs(pdl)
    start = tl.load(positions_ptr + slot)
    tl.store(start_ptr + slot, start)
    tl.store(positions_ptr + slot, start + steps)  # this slot's program alone reads it
    position = start + times
    angles = freqs[None, :] * position.to(tl.float32)[:, None]
    if compiled:
        cos = libdevice.cos(angles)
        sin = libdevice.sin(angles)
    else:
        cos = tl.cos(angles)
        sin = tl.sin(angles)
    inside = (times < steps)[:, None] & (bands < half)[None, :]
    at = slot * steps * half + times[:, None] * half + bands[None, :]
    tl.store(cos_ptr + at, cos, mask=inside)
    tl.store(sin_ptr + at, sin, mask=inside)


def step_rope_tables(positions: Tensor, steps: int, freqs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """positions: int64 [slots] contiguous, moved on by `steps`; freqs: fp32 [head_dim / 2]
    contiguous -> (cos, sin, start): the tables, fp32 [slots, steps, head_dim / 2]
    contiguous, and the positions before, int64 [slots] (module docstring)."""
    assert positions.dim() == 1, tuple(positions.shape)
    assert positions.dtype == torch.int64, positions.dtype
    assert positions.is_contiguous(), positions.stride()
    assert freqs.dim() == 1, tuple(freqs.shape)
    assert freqs.dtype == torch.float32, freqs.dtype
    assert freqs.is_contiguous(), freqs.stride()
    assert positions.device == freqs.device, "tensors on one device"
    assert steps >= 1, steps
    slots, half = positions.shape[0], freqs.shape[0]
    cos = torch.empty(slots, steps, half, device=positions.device)
    sin = torch.empty_like(cos)
    start = torch.empty_like(positions)
    pdl = dependent(positions, "mimi_rope")
    _rope_kernel[(slots,)](
        positions,
        freqs,
        cos,
        sin,
        start,
        steps,
        half,
        compiled=positions.is_cuda,
        block_t=triton.next_power_of_2(steps),
        block_f=triton.next_power_of_2(half),
        pdl=pdl,
        launch_pdl=pdl,
        num_warps=1,
    )
    return cos, sin, start
