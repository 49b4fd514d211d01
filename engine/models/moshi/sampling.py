"""Token sampling on device, without host sync: greedy, or temperature + top-k.

Top-k sampling is an exponential race: with E_i ~ Exp(1) drawn for every vocabulary entry,
the token is the argmax of p_i / E_i over the top-k set (the logits at or above the k-th
largest), which picks index i with its top-k softmax probability p_i and needs no
`torch.multinomial` (that one syncs on CUDA). p_i is taken up to the softmax's sum,
exp(l_i / T - max_j l_j / T): the sum does not change the argmax. Greedy decoding is the
argmax of the logits, as in Kyutai's reference; only greedy runs are comparable token for
token across implementations.

`choose` is the rule in torch ops (the CPU path, and the reference of kernels/sampling.py,
the one launch per stream that CUDA runs); `sample` draws the noise and chooses.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from engine.models.moshi.attention import fused_on


@dataclass(frozen=True)
class Sampling:
    greedy: bool
    temperature: float
    top_k: int

    def __post_init__(self) -> None:
        if not self.greedy and (self.temperature <= 0 or self.top_k < 1):
            raise ValueError("sampling needs temperature > 0 and top_k >= 1")


# Read at every `sample` call that would take the kernel: benches switch it off to time the
# torch ops against it; set it before a graph is captured.
KERNEL = True

TEXT_DEFAULT = Sampling(greedy=False, temperature=0.7, top_k=25)
AUDIO_DEFAULT = Sampling(greedy=False, temperature=0.8, top_k=250)


def draw_noise(
    shape: tuple[int, ...], device: torch.device, how: Sampling, generator: torch.Generator | None
) -> Tensor | None:
    """The race's Exp(1) draws, fp32 of `shape` (None for greedy: it draws nothing)."""
    if how.greedy:
        return None
    noise = torch.empty(shape, device=device, dtype=torch.float32)
    return noise.exponential_(1.0, generator=generator)


def choose(
    logits: Tensor,
    how: Sampling,
    noise: Tensor | None,
    forced: Tensor | None = None,
    forced_mask: Tensor | None = None,
) -> Tensor:
    """logits: [B, vocab] any float dtype; noise: fp32 [B, vocab] (draw_noise; None for
    greedy); forced: int64 [B] where forced_mask: bool [B] -> int64 [B] (module docstring)."""
    logits = logits.float()
    if how.greedy:
        token = logits.argmax(dim=-1)
    else:
        assert noise is not None, "top-k sampling needs its noise"
        kth = torch.topk(logits, min(how.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        scaled = logits / how.temperature
        weight = torch.exp(scaled - scaled.amax(dim=-1, keepdim=True))
        score = torch.where(logits >= kth, weight / noise, torch.full_like(weight, -1.0))
        token = score.argmax(dim=-1)
    if forced is not None and forced_mask is not None:
        token = torch.where(forced_mask, forced, token)
    return token


def sample(
    logits: Tensor,
    how: Sampling,
    generator: torch.Generator | None,
    forced: Tensor | None = None,
    forced_mask: Tensor | None = None,
    noise: Tensor | None = None,
    fused: bool | None = None,
) -> Tensor:
    """logits: [B, vocab] -> int64 [B]: `choose` with noise drawn from `generator` unless
    given. `fused` (None: on CUDA tensors): in one launch of kernels/sampling.py (while
    KERNEL)."""
    if noise is None:
        noise = draw_noise(tuple(logits.shape), logits.device, how, generator)
    if KERNEL and fused_on(logits, fused):
        # imported here: triton is absent from CPU-only installs, which never take this path
        from kernels.sampling import sample_tokens

        return sample_tokens(logits, how, noise, forced, forced_mask)
    return choose(logits, how, noise, forced, forced_mask)
