"""The one-launch token sampler against its torch reference (engine/models/moshi/sampling.py's
`choose`), on the same logits and the same noise.

Greedy and the top-k set are exact (the k-th largest logit is found bit by bit), so the
tokens must be equal wherever the race has a clear winner. Triton's exp and division are
not torch's to the last bit, so a row whose two best race scores are within 1e-5 of each
other may go either way: those rows are left out, and there must be few of them.
"""

import pytest

pytest.importorskip("torch")

import torch

pytest.importorskip("triton", reason="triton is not installed (CPU torch does not bring it)")

from engine.models.moshi.sampling import Sampling, choose, draw_noise, sample
from kernels.sampling import sample_tokens

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
GREEDY = Sampling(greedy=True, temperature=1.0, top_k=1)
TEXT = Sampling(greedy=False, temperature=0.7, top_k=25)
AUDIO = Sampling(greedy=False, temperature=0.8, top_k=250)


def _logits(rows: int, vocab: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(rows, vocab, generator=generator)).to(DEVICE, dtype)


def _clear_winners(logits: torch.Tensor, how: Sampling, noise: torch.Tensor) -> torch.Tensor:
    """Rows whose best race score beats the second by more than 1e-5 (relative)."""
    x = logits.float()
    kth = torch.topk(x, min(how.top_k, x.shape[-1]), dim=-1).values[:, -1:]
    scaled = x / how.temperature
    weight = torch.exp(scaled - scaled.amax(dim=-1, keepdim=True))
    score = torch.where(x >= kth, weight / noise, torch.full_like(weight, -1.0))
    best, second = torch.topk(score, 2, dim=-1).values.unbind(-1)
    return (best - second) > 1e-5 * best


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    ("rows", "vocab", "how"),
    [(3, 2048, AUDIO), (2, 32000, TEXT), (5, 100, Sampling(False, 1.5, 7)), (4, 300, GREEDY)],
)
def test_sampled_tokens_match_the_torch_rule(
    rows: int, vocab: int, how: Sampling, dtype: torch.dtype
) -> None:
    logits = _logits(rows, vocab, dtype, seed=vocab + rows)
    generator = torch.Generator(DEVICE).manual_seed(rows)
    noise = draw_noise((rows, vocab), DEVICE, how, generator)
    got = sample_tokens(logits, how, noise)
    want = choose(logits, how, noise)
    assert got.dtype == torch.int64
    assert got.shape == (rows,)
    if how.greedy:
        assert torch.equal(got, want)
        return
    assert noise is not None
    clear = _clear_winners(logits, how, noise)
    assert int(clear.sum()) >= rows - 1, clear
    assert torch.equal(got[clear], want[clear])


def test_the_top_k_set_is_exact_at_its_edge() -> None:
    """Noise that makes the k-th largest logit win when it is in the set, and the (k+1)-th
    largest otherwise: the kernel must pick the k-th, for fp32 and bf16 logits, with the
    threshold anywhere in the key range (negative and positive logits)."""
    vocab, k = 128, 40
    how = Sampling(greedy=False, temperature=1.0, top_k=k)
    for dtype in (torch.float32, torch.bfloat16):
        for shift in (-50.0, 0.0, 50.0):
            generator = torch.Generator().manual_seed(k)
            distinct = torch.unique(
                (8 * torch.randn(4 * vocab, generator=generator) + shift).to(dtype)
            )
            pick = torch.randperm(distinct.numel(), generator=generator)[:vocab]
            logits = distinct[pick].to(DEVICE)[None]
            order = torch.argsort(logits.float(), dim=-1, descending=True)[0]
            noise = torch.full((1, vocab), 1e30, device=DEVICE)
            noise[0, order[k - 1]] = 1e-30  # the k-th: in the set, it wins
            noise[0, order[k]] = 1e-35  # the (k+1)-th: would win if let in
            got = sample_tokens(logits, how, noise)
            assert int(got[0]) == int(order[k - 1]), (dtype, shift)
            assert torch.equal(got, choose(logits, how, noise))


def test_forced_rows_take_the_forced_token_and_others_sample() -> None:
    logits = _logits(6, 2048, torch.bfloat16, seed=1)
    forced_all = torch.arange(60, device=DEVICE).view(6, 10)  # strided column views
    mask_all = torch.zeros(6, 3, dtype=torch.bool, device=DEVICE)
    mask_all[::2, 1] = True
    forced, mask = forced_all[:, 3], mask_all[:, 1]
    for how in (GREEDY, AUDIO):
        noise = draw_noise((6, 2048), DEVICE, how, torch.Generator(DEVICE).manual_seed(2))
        got = sample_tokens(logits, how, noise, forced, mask)
        free = sample_tokens(logits, how, noise)
        assert torch.equal(got[mask], forced[mask])
        assert torch.equal(got[~mask], free[~mask])
        assert torch.equal(got, choose(logits, how, noise, forced, mask))


def test_the_kernel_draws_the_top_k_distribution() -> None:
    """sample in one launch draws each token of the top-k set with its softmax probability:
    counts over many rows within 5 standard deviations, none outside the set."""
    rows, card = (40000 if DEVICE.type == "cuda" else 500), 16  # the interpreter: ~20 ms a row
    how = Sampling(greedy=False, temperature=1.5, top_k=6)
    base = torch.randn(card, generator=torch.Generator().manual_seed(5))
    logits = base.repeat(rows, 1).to(DEVICE)
    top = torch.topk(base, how.top_k).indices
    probs = torch.zeros(card)
    probs[top] = torch.softmax(base[top] / how.temperature, dim=-1)
    tokens = sample(logits, how, torch.Generator(DEVICE).manual_seed(6), fused=True)
    counts = torch.bincount(tokens.cpu(), minlength=card).double()
    spread = (rows * probs * (1 - probs)).double().sqrt()
    assert torch.all((counts - rows * probs).abs() <= 5 * spread + 1e-9), counts


def test_misuse_is_refused() -> None:
    logits = _logits(2, 64, torch.float32, seed=3)
    with pytest.raises(AssertionError, match="noise"):
        sample_tokens(logits, AUDIO, None)
    with pytest.raises(AssertionError, match="forced"):
        sample_tokens(logits, GREEDY, None, torch.zeros(2, dtype=torch.int64, device=DEVICE))
    with pytest.raises(AssertionError, match="unit-stride"):
        sample_tokens(logits.t(), GREEDY, None)
