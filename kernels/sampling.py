"""One sampled token per row of logits, in one launch: greedy, or temperature + top-k.

The rule is engine/models/moshi/sampling.py's (`choose`, the torch reference), per row:

    greedy   the first index of the largest logit
    top-k    kth = the k-th largest logit; among the logits at or above it, the argmax of
             exp(l_i / T - max_j l_j / T) / E_i, the E_i ~ Exp(1) drawn per vocabulary entry
             before the launch (the exponential race: index i wins with its top-k softmax
             probability)
    forced   where forced_mask is set, the forced token instead

torch runs that as ~14 launches per sampled stream (float, softmax, topk, the race, the
gather, the forcing: 131 for a tick's nine in bench/kernels_sampling.py), nine streams a tick
(text, then 8 depth steps, each waiting on the one before). Here each stream is one program
per row, after one launch that draws its noise.

The k-th largest logit is found exactly and without a sort. Logits map to unsigned keys in
the same order (the IEEE bits; a negative value's bits flipped, a positive value's sign bit
set), and the threshold key is built from the top bit down: a bit stays set while at least
k keys are at or above the threshold. A bf16 logit has 16 significant bits, so 16 rounds
over the row; an fp32 one takes 32. Keys equal to the threshold are all in the set: where
the k-th and (k+1)-th logits are equal the set holds more than k, where torch.topk would
keep k of them (an exact tie; not seen with real logits, whose top values are distinct).
Logits must be finite: +inf and NaN are not ordered as torch orders them.

Predicted before measuring (H200): ~3 us a stream at 1 call against ~25 us for the torch ops
(one text row of 32000 in 16 rounds, 8 audio rows of 2048), ~0.2 ms less per tick.
Measured (one H200, Triton 3.6, `python3 bench/kernels_sampling.py`,
bench/results/kernels_sampling.json; the nine streams of a tick with their two noise draws,
in one CUDA graph): 0.088 ms against 0.552 at 1 call (12 launches against 131), 0.116 / 0.827
at 128, 0.199 / 1.336 at 300, every token equal on the same noise; the whole step, sampling
as served, 0.29 ms faster at 1 call and 0.73 at 128 (engine_gpu_sampling_top_k*.json).
"""

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor

from engine.models.moshi.sampling import Sampling, choose
from kernels.dependent_launch import dependent, wait_for_inputs

__all__ = ["choose", "sample_tokens"]

SIGN = tl.constexpr(-(2**31))  # int32 with only the sign bit set
# a row's block width -> warps (wider rows: 16). The text's 32768 spill 48 bytes of registers
# a thread at 16 warps on sm_90 (Triton 3.6), 128 at 32, 152 at 8; the audio's 2048 none
# (`python3 bench/kernels_sampling_sass.py`)
ROW_WARPS = ((2048, 4), (8192, 8))


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _row(logits_ptr, offset, cols, inside):  # type: ignore[no-untyped-def,unused-ignore]
    """One row of logits in fp32, -inf past the vocabulary."""
    logits = tl.load(logits_ptr + offset + cols, mask=inside, other=float("-inf"))
    return logits.to(tl.float32)


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def ordered_key(logits):  # type: ignore[no-untyped-def,unused-ignore]
    """fp32 -> uint32 in the same order: a negative value's bits flipped, a positive one's
    sign bit set."""
    bits = logits.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, ~bits, bits ^ SIGN).to(tl.uint32, bitcast=True)


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def key_value(key):  # type: ignore[no-untyped-def,unused-ignore]
    """ordered_key's inverse."""
    bits = key.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ SIGN, ~bits).to(tl.float32, bitcast=True)


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _sample_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    logits_ptr,
    noise_ptr,
    forced_ptr,
    forced_mask_ptr,
    out_ptr,
    vocab,
    logits_stride,
    noise_stride,
    forced_stride,
    forced_mask_stride,
    temperature,
    top_k,
    block: tl.constexpr,
    key_bits: tl.constexpr,
    greedy: tl.constexpr,
    has_forced: tl.constexpr,
    pdl: tl.constexpr,
):
    wait_for_inputs(pdl)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, block)
    inside = cols < vocab
    if greedy:
        logits = _row(logits_ptr, row * logits_stride, cols, inside)
        token = tl.argmax(logits, axis=0, tie_break_left=True).to(tl.int64)
    else:
        # only the keys stay in registers: the logits are read back from them
        key = ordered_key(_row(logits_ptr, row * logits_stride, cols, inside))
        kth = tl.full((), 0, tl.uint32)
        bit = tl.full((), 1 << 31, tl.uint32)
        for _ in range(key_bits):  # a loop, not unrolled: fewer registers live
            candidate = kth | bit
            above = tl.sum((key >= candidate).to(tl.int32), axis=0)
            kth = tl.where(above >= top_k, candidate, kth)
            bit = bit >> 1
        # max(l / T) = max(l) / T: dividing by T > 0 keeps the order, rounding included
        peak = key_value(tl.max(key, axis=0)) / temperature
        top = (key >= kth) & inside  # kth is -inf, the padding's, where < k logits exceed it
        race = tl.load(noise_ptr + row * noise_stride + cols, mask=top, other=1.0)
        score = tl.where(top, tl.exp(key_value(key) / temperature - peak) / race, -1.0)
        token = tl.argmax(score, axis=0, tie_break_left=True).to(tl.int64)
    if has_forced:
        given = tl.load(forced_ptr + row * forced_stride)
        token = tl.where(tl.load(forced_mask_ptr + row * forced_mask_stride) != 0, given, token)
    tl.store(out_ptr + row, token)


def sample_tokens(
    logits: Tensor,
    how: Sampling,
    noise: Tensor | None,
    forced: Tensor | None = None,
    forced_mask: Tensor | None = None,
) -> Tensor:
    """logits: [B, vocab] (unit-stride rows, any float dtype); noise: fp32 [B, vocab] Exp(1)
    draws (None only for greedy); forced: int64 [B] with forced_mask: bool [B], or neither
    -> int64 [B]: `choose`'s tokens, one launch."""
    assert logits.dim() == 2, logits.shape
    assert logits.stride(-1) == 1, f"rows must be unit-stride, strides {logits.stride()}"
    assert logits.dtype in (torch.float32, torch.float16, torch.bfloat16), logits.dtype
    batch, vocab = logits.shape
    if how.greedy:
        noise = logits  # not read: one signature for both ways to choose
    else:
        assert noise is not None, "top-k sampling needs its noise"
        assert noise.shape == logits.shape, (noise.shape, logits.shape)
        assert noise.dtype == torch.float32, noise.dtype
        assert noise.stride(-1) == 1, f"noise rows must be unit-stride, strides {noise.stride()}"
        assert noise.device == logits.device, "noise on the logits' device"
    assert (forced is None) == (forced_mask is None), "forced needs forced_mask and back"
    if forced is not None and forced_mask is not None:
        assert forced.shape == forced_mask.shape == (batch,), (forced.shape, forced_mask.shape)
        assert forced.dtype == torch.int64, forced.dtype
        assert forced_mask.dtype == torch.bool, forced_mask.dtype
        assert forced.device == forced_mask.device == logits.device, "forced on one device"
        forced_ptr, mask_ptr = forced, forced_mask
        forced_strides = (forced.stride(0), forced_mask.stride(0))
    else:
        forced_ptr, mask_ptr = logits, logits  # not read
        forced_strides = (0, 0)
    out = torch.empty(batch, device=logits.device, dtype=torch.int64)
    if batch == 0:
        return out
    block = triton.next_power_of_2(vocab)
    warps = next((w for width, w in ROW_WARPS if block <= width), 16)
    pdl = dependent(out, "sampling")
    _sample_kernel[(batch,)](
        logits, noise, forced_ptr, mask_ptr, out,
        vocab, logits.stride(0), noise.stride(0), *forced_strides,
        float(how.temperature), min(how.top_k, vocab),
        block=block,
        key_bits=16 if logits.dtype == torch.bfloat16 else 32,
        greedy=how.greedy,
        has_forced=forced is not None,
        num_warps=warps,
        pdl=pdl,
        launch_pdl=pdl,
    )  # fmt: skip
    return out
