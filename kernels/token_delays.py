"""The LM's token delay bookkeeping (engine/models/moshi/delays.py) in two launches a step.

Per step the torch path runs ~33 small launches on the delay rings (`TokenDelays`: the
resets, the user's codes given at their delays, what the LM reads, the provided tokens of the
position it writes, then the sampled tokens stored, the offsets advanced and the emitted frame
read back). Here one program per slot holds that slot's whole ring ([streams, ring], 17 x 3 for
Moshi) in registers and runs the same steps in the same order:

    begin_step(reset [S] bool, user_codes [S, streams - model_streams] int64)
        -> tokens [S, streams] int64, forced [S, model_streams] int64, flags [S, model] bool
        (TokenDelays.reset, provide of the user's codes, inputs, targets)
    end_step(text [S] int64, audio [S, model_streams - 1] int64)
        -> frame [S, model_streams] int64, emitted [S] bool
        (TokenDelays.commit of [text | audio])

Integer work only: the results are the torch path's exactly (tests/kernels/
test_token_delays.py, many steps with resets and provided tokens, interpreted and compiled:
bench/results/gpu_tests_token_delays_c15711d.log; the engine's GPU tests with it served,
gpu_tests_engine_delays_b22fcce.log). Predicted before measuring (H200, CUDA graph, 1 call):
~33 launches of ~1.5-2 us against 2, ~50 us less per tick. Measured (`python3
bench/engine_delays.py --slots 1`, the two alternated in one process, 2 x 100 steps back to
back, every ring full; bench/results/engine_delays_1_c15711d.json): 5.925 ms median against
5.978 for the torch ops (p99 6.008 against 6.062), 800 kernels a tick against 832.
"""

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor

from kernels.dependent_launch import dependent, wait_for_inputs

__all__ = ["begin_step", "end_step"]


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _ring_state(  # type: ignore[no-untyped-def,unused-ignore]
    cache_ptr, provided_ptr, slot, streams, ring, block_k: tl.constexpr, block_r: tl.constexpr
):
    """A slot's [streams, ring] cache and provided flags, and their addresses and mask."""
    k = tl.arange(0, block_k)
    r = tl.arange(0, block_r)
    inside = (k < streams)[:, None] & (r < ring)[None, :]
    cell = (slot * streams + k[:, None]) * ring + r[None, :]
    cache = tl.load(cache_ptr + cell, mask=inside, other=0)
    provided = tl.load(provided_ptr + cell, mask=inside, other=0) != 0
    return cache, provided, cell, inside


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _at(cache, provided, position, r):  # type: ignore[no-untyped-def,unused-ignore]
    """Per stream, the token and the provided flag at ring position `position` ([streams])."""
    chosen = r[None, :] == position[:, None]
    token = tl.sum(tl.where(chosen, cache, 0), axis=1)
    flag = tl.sum(tl.where(chosen & provided, 1, 0), axis=1) > 0
    return token, flag


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _begin_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    cache_ptr,
    provided_ptr,
    offsets_ptr,
    delays_ptr,
    initial_ptr,
    reset_ptr,
    user_ptr,
    tokens_ptr,
    forced_ptr,
    flags_ptr,
    streams,
    model_streams,
    ring: tl.constexpr,
    block_k: tl.constexpr,
    block_r: tl.constexpr,
    pdl: tl.constexpr,
):
    slot = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, block_k)
    r = tl.arange(0, block_r)
    stream_in = k < streams
    delays = tl.load(delays_ptr + k, mask=stream_in, other=0)
    initial = tl.load(initial_ptr + k, mask=stream_in, other=0)
    wait_for_inputs(pdl)
    cache, provided, cell, inside = _ring_state(
        cache_ptr, provided_ptr, slot, streams, ring, block_k, block_r
    )
    offset = tl.load(offsets_ptr + slot)
    # reset: the row starts over (TokenDelays.reset)
    reset = tl.load(reset_ptr + slot) != 0
    offset = tl.where(reset, 0, offset)
    provided = provided & (reset == 0)
    # the user's codes land at offset + delay of their streams (TokenDelays.provide)
    user = (k >= model_streams) & stream_in
    codes = tl.load(user_ptr + slot * (streams - model_streams) + (k - model_streams), mask=user)
    given = ((r[None, :] == ((offset + delays) % ring)[:, None]) & user[:, None]) & inside
    cache = tl.where(given, codes[:, None], cache)
    provided = provided | given
    # what the LM reads: position offset, the initial token while offset <= delay (inputs)
    read, _ = _at(cache, provided, tl.zeros_like(delays) + offset % ring, r)
    tokens = tl.where(offset <= delays, initial, read)
    tl.store(tokens_ptr + slot * streams + k, tokens, mask=stream_in)
    # the provided model-stream tokens of the position this step writes (targets)
    model = k < model_streams
    forced, flag = _at(cache, provided, tl.zeros_like(delays) + (offset + 1) % ring, r)
    tl.store(forced_ptr + slot * model_streams + k, forced, mask=model)
    tl.store(flags_ptr + slot * model_streams + k, flag, mask=model)
    tl.store(cache_ptr + cell, cache, mask=inside)
    tl.store(provided_ptr + cell, provided, mask=inside)
    tl.store(offsets_ptr + slot, offset)


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _end_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    cache_ptr,
    provided_ptr,
    offsets_ptr,
    delays_ptr,
    text_ptr,
    audio_ptr,
    frame_ptr,
    emitted_ptr,
    streams,
    model_streams,
    max_delay,
    ring: tl.constexpr,
    block_k: tl.constexpr,
    block_r: tl.constexpr,
    pdl: tl.constexpr,
):
    slot = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, block_k)
    r = tl.arange(0, block_r)
    model = k < model_streams
    delays = tl.load(delays_ptr + k, mask=k < streams, other=0)
    wait_for_inputs(pdl)
    cache, provided, cell, inside = _ring_state(
        cache_ptr, provided_ptr, slot, streams, ring, block_k, block_r
    )
    offset = tl.load(offsets_ptr + slot)
    # the position just read is free again, for every stream (TokenDelays.commit)
    provided = provided & (r[None, :] != offset % ring)
    offset += 1
    # the sampled tokens stored where nothing was provided
    written = tl.zeros_like(delays) + offset % ring
    provided_token, flag = _at(cache, provided, written, r)
    text = tl.load(text_ptr + slot)
    audio = tl.load(audio_ptr + slot * (model_streams - 1) + (k - 1), mask=model & (k > 0))
    sampled = tl.where(k == 0, text, audio)
    kept = tl.where(flag, provided_token, sampled)
    store = (r[None, :] == written[:, None]) & model[:, None] & inside
    cache = tl.where(store, kept[:, None], cache)
    # the emitted frame: position offset - max_delay + delay of each model stream
    emit = ((offset - max_delay + delays) % ring + ring) % ring
    frame, _ = _at(cache, provided, emit, r)
    tl.store(frame_ptr + slot * model_streams + k, frame, mask=model)
    tl.store(emitted_ptr + slot, offset > max_delay)
    tl.store(cache_ptr + cell, cache, mask=inside)
    tl.store(provided_ptr + cell, provided, mask=inside)
    tl.store(offsets_ptr + slot, offset)


def _check_state(cache: Tensor, provided: Tensor, offsets: Tensor, delays: Tensor) -> None:
    slots, streams, _ = cache.shape
    assert cache.dtype == torch.int64, cache.dtype
    assert cache.is_contiguous(), cache.stride()
    assert provided.shape == cache.shape, (provided.shape, cache.shape)
    assert provided.dtype == torch.bool, provided.dtype
    assert provided.is_contiguous(), provided.stride()
    assert offsets.shape == (slots,), offsets.shape
    assert offsets.dtype == torch.int64, offsets.dtype
    assert delays.shape == (streams,), delays.shape
    assert delays.dtype == torch.int64, delays.dtype
    assert cache.device == provided.device == offsets.device == delays.device, "one device"


def _blocks(cache: Tensor) -> dict[str, int]:
    _, streams, ring = cache.shape
    return {
        "ring": ring,
        "block_k": triton.next_power_of_2(streams),
        "block_r": triton.next_power_of_2(ring),
    }


def begin_step(
    cache: Tensor,
    provided: Tensor,
    offsets: Tensor,
    delays: Tensor,
    initial: Tensor,
    model_streams: int,
    reset: Tensor,
    user_codes: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """The delay rings' work before a step, one launch (module docstring); the rings
    (cache, provided, offsets) are updated in place."""
    _check_state(cache, provided, offsets, delays)
    slots, streams, _ = cache.shape
    assert initial.shape == delays.shape, initial.shape
    assert initial.dtype == torch.int64, initial.dtype
    assert reset.shape == (slots,), reset.shape
    assert reset.dtype == torch.bool, reset.dtype
    assert user_codes.shape == (slots, streams - model_streams), user_codes.shape
    assert user_codes.dtype == torch.int64, user_codes.dtype
    user_codes = user_codes.contiguous()
    device = cache.device
    tokens = torch.empty(slots, streams, device=device, dtype=torch.int64)
    forced = torch.empty(slots, model_streams, device=device, dtype=torch.int64)
    flags = torch.empty(slots, model_streams, device=device, dtype=torch.bool)
    pdl = dependent(cache, "token_delays")
    _begin_kernel[(slots,)](
        cache, provided, offsets, delays, initial, reset, user_codes, tokens, forced, flags,
        streams, model_streams, **_blocks(cache), pdl=pdl, launch_pdl=pdl, num_warps=1,
    )  # fmt: skip
    return tokens, forced, flags


def end_step(
    cache: Tensor,
    provided: Tensor,
    offsets: Tensor,
    delays: Tensor,
    model_streams: int,
    max_delay: int,
    text: Tensor,
    audio: Tensor,
) -> tuple[Tensor, Tensor]:
    """The delay rings' work after a step, one launch (module docstring); the rings are
    updated in place."""
    _check_state(cache, provided, offsets, delays)
    slots = cache.shape[0]
    assert text.shape == (slots,), text.shape
    assert text.dtype == torch.int64, text.dtype
    assert audio.shape == (slots, model_streams - 1), audio.shape
    assert audio.dtype == torch.int64, audio.dtype
    audio = audio.contiguous()
    device = cache.device
    frame = torch.empty(slots, model_streams, device=device, dtype=torch.int64)
    emitted = torch.empty(slots, device=device, dtype=torch.bool)
    pdl = dependent(cache, "token_delays")
    _end_kernel[(slots,)](
        cache, provided, offsets, delays, text, audio, frame, emitted,
        cache.shape[1], model_streams, max_delay, **_blocks(cache), pdl=pdl, launch_pdl=pdl,
        num_warps=1,
    )  # fmt: skip
    return frame, emitted
