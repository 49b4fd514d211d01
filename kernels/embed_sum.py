"""The LM's input embedding, the sum of one row from each stream's table, as one launch.

Moshi's temporal transformer reads, per slot and frame, the sum of 17 embeddings: one per
audio stream (8 of the model's codebooks, 8 of the user's) and the text token's:

    tokens:  int64 [rows, 1 + audio]       text token, then audio stream k at 1 + k
    audio:   [audio, card + 1, dim]        one table per audio stream (lm.py's `emb`)
    text:    [text_card + 1, dim]
    out:     [rows, dim] = ((a_0 + a_1) + ... + a_{audio-1}) + t, in the tables' dtype

torch runs it as 17 gathers and 16 adds (33 launches per tick); here one program per (row,
column block) gathers every row and adds them in the same order, rounding to the tables'
dtype after each add as torch's adds do, so the result is the torch path's bit for bit.

Predicted before measuring (H200, bf16, CUDA graph): one launch of ~3 us at 1 and 128 slots
(17 rows of 8 KB per slot: 18 MB at 128) against 33 launches, ~0.1 ms less per tick at 1 call.
Not timed alone (the session's device time ran out): it is compiled and checked bit for bit on
an H200 (tests/kernels/test_embed_sum.py) and part of every tick measured since.
"""

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from torch import Tensor

from engine.models.moshi.lm import embed_streams as embed_sum_reference
from kernels.dependent_launch import dependent, wait_for_inputs

__all__ = ["embed_sum", "embed_sum_reference"]

BLOCK = 1024  # columns per program


@triton.jit  # type: ignore[untyped-decorator,unused-ignore]
def _embed_sum_kernel(  # type: ignore[no-untyped-def,unused-ignore]
    tokens_ptr,
    audio_ptr,
    text_ptr,
    out_ptr,
    table_rows,
    dim,
    streams: tl.constexpr,
    block: tl.constexpr,
    pdl: tl.constexpr,
):
    wait_for_inputs(pdl)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * block + tl.arange(0, block)
    inside = cols < dim
    token = tl.load(tokens_ptr + row * (streams + 1) + 1)
    first = tl.load(audio_ptr + token * dim + cols, mask=inside, other=0.0)
    dtype = first.dtype
    total = first.to(tl.float32)
    for k in tl.static_range(1, streams):
        token = tl.load(tokens_ptr + row * (streams + 1) + 1 + k)
        entry = tl.load(audio_ptr + (k * table_rows + token) * dim + cols, mask=inside, other=0.0)
        total = (total + entry.to(tl.float32)).to(dtype).to(tl.float32)
    token = tl.load(tokens_ptr + row * (streams + 1))
    entry = tl.load(text_ptr + token * dim + cols, mask=inside, other=0.0)
    tl.store(out_ptr + row * dim + cols, (total + entry.to(tl.float32)).to(dtype), mask=inside)


def embed_sum(tokens: Tensor, audio: Tensor, text: Tensor) -> Tensor:
    """tokens: int64 [..., 1 + audio streams] -> [..., dim] (module docstring), one launch.
    Tokens are not range-checked (the delay rings hold only valid ones)."""
    streams, table_rows, dim = audio.shape
    assert tokens.shape[-1] == 1 + streams, (tokens.shape, audio.shape)
    assert tokens.dtype == torch.int64, tokens.dtype
    assert audio.is_contiguous(), "the audio tables must be contiguous"
    assert text.is_contiguous(), "the text table must be contiguous"
    assert text.shape[1] == dim, (text.shape, audio.shape)
    assert text.dtype == audio.dtype, (text.dtype, audio.dtype)
    assert tokens.device == audio.device == text.device, "tensors on one device"
    rows = tokens.reshape(-1, 1 + streams).contiguous()
    out = torch.empty(*tokens.shape[:-1], dim, device=audio.device, dtype=audio.dtype)
    grid = (rows.shape[0], triton.cdiv(dim, BLOCK))
    pdl = dependent(out, "embed_sum")
    _embed_sum_kernel[grid](
        rows,
        audio,
        text,
        out,
        table_rows,
        dim,
        streams=streams,
        block=BLOCK,
        num_warps=4,
        pdl=pdl,
        launch_pdl=pdl,
    )
    return out
