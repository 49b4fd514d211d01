"""The one-launch input embedding against the LM's torch path (lm.embed_streams).

fp32 tables are summed in the same order by both, so they must agree bit for bit anywhere;
bf16 too when compiled on a GPU. Triton's interpreter on CPU rounds fp32 to bf16 by
truncation, so there each of the 16 roundings may land one unit lower and the sums drift.
"""

import pytest

pytest.importorskip("torch")

import torch

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

from engine.models.moshi.config import tiny
from engine.models.moshi.lm import MoshiLm
from engine.models.moshi.model import randomize
from engine.models.moshi.sampling import Sampling
from kernels.embed_sum import embed_sum, embed_sum_reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
COMPILED = DEVICE.type == "cuda"


def _tables(
    streams: int, card: int, text_card: int, dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(streams * dim)
    audio = torch.randn(streams, card + 1, dim, generator=generator).to(DEVICE, dtype)
    text = torch.randn(text_card + 1, dim, generator=generator).to(DEVICE, dtype)
    return audio, text


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "streams", "dim"), [(1, 16, 64), (5, 16, 1500), (3, 2, 32)])
def test_embed_sum_matches_the_torch_path(
    rows: int, streams: int, dim: int, dtype: torch.dtype
) -> None:
    card, text_card = 20, 30
    audio, text = _tables(streams, card, text_card, dim, dtype)
    generator = torch.Generator().manual_seed(rows)
    tokens = torch.cat(
        [
            torch.randint(0, text_card + 1, (rows, 2, 1), generator=generator),
            torch.randint(0, card + 1, (rows, 2, streams), generator=generator),
        ],
        dim=-1,
    ).to(DEVICE)
    got = embed_sum(tokens, audio, text)
    want = embed_sum_reference(tokens, audio, text)
    assert got.shape == want.shape == (rows, 2, dim)
    if dtype == torch.float32 or COMPILED:
        assert torch.equal(got, want)
        return
    # truncating sums drift low by ~0.07 on average (measured); one wrong row or stream
    # moves the sum by ~1 on average (unit-variance tables)
    assert float((got.float() - want.float()).abs().mean()) < 0.2


def test_lm_embeds_the_same_fused_or_not() -> None:
    """The LM's own embed through the kernel and through torch (fp32: bit for bit)."""
    config = tiny().lm
    greedy = Sampling(greedy=True, temperature=1.0, top_k=1)
    lm = MoshiLm(config, 2, DEVICE, torch.float32, greedy, greedy, None)
    randomize(lm, 3)
    streams = 1 + 2 * config.audio_codebooks
    tokens = torch.randint(0, config.card + 1, (2, 1, streams), device=DEVICE)
    lm.fused = True
    fused = lm.embed(tokens)
    lm.fused = False
    assert torch.equal(fused, lm.embed(tokens))
