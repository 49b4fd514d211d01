"""Token sampling on device, without host sync: greedy, or temperature + top-k.

Top-k sampling draws with the exponential-race trick (argmax of p / E, E ~ Exp(1)), which
picks index i with probability p_i and needs no `torch.multinomial` (that one syncs on CUDA).
Greedy decoding is the argmax of the fp32 logits, as in Kyutai's reference; only greedy runs
are comparable token for token across implementations.
"""

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Sampling:
    greedy: bool
    temperature: float
    top_k: int

    def __post_init__(self) -> None:
        if not self.greedy and (self.temperature <= 0 or self.top_k < 1):
            raise ValueError("sampling needs temperature > 0 and top_k >= 1")


TEXT_DEFAULT = Sampling(greedy=False, temperature=0.7, top_k=25)
AUDIO_DEFAULT = Sampling(greedy=False, temperature=0.8, top_k=250)


def sample(logits: Tensor, how: Sampling, generator: torch.Generator | None) -> Tensor:
    """logits: [B, vocab] any float dtype -> int64 [B]."""
    logits = logits.float()
    if how.greedy:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / how.temperature, dim=-1)
    top_probs, top_index = torch.topk(probs, min(how.top_k, probs.shape[-1]), dim=-1)
    race = torch.empty_like(top_probs).exponential_(1.0, generator=generator)
    choice = (top_probs / race).argmax(dim=-1, keepdim=True)
    return top_index.gather(-1, choice)[:, 0]
