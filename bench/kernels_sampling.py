"""Token sampling on one GPU: one launch (kernels/sampling.py) against the torch ops.

    python bench/kernels_sampling.py --json OUT.json [--slots 1,128,300]

A tick samples nine streams one after another: the text token from [B, 32000] logits
(temperature 0.7, top-k 25), then each of the 8 depth steps' audio token from [B, 2048]
(temperature 0.8, top-k 250), each waiting on the one before. Per slot count B this captures
those nine `sample` calls (bf16 logits, the noise drawn as the model draws it: one launch for
the text, one for all 8 audio steps) in one CUDA graph, both ways, and times replays; also
greedy (an argmax each). Tokens of both ways are compared on the same noise.
"""

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from gpu_timing import count_kernels, machine, replay_ms, summary  # bench/, this folder
from torch import Tensor

from engine.models.moshi import sampling
from engine.models.moshi.sampling import AUDIO_DEFAULT, TEXT_DEFAULT, Sampling, draw_noise

TEXT_CARD, CARD, STEPS = 32000, 2048, 8
GREEDY = Sampling(greedy=True, temperature=1.0, top_k=1)


def tick_sampling(slots: int, text_how: Sampling, audio_how: Sampling) -> Callable[[], Tensor]:
    device = torch.device("cuda")
    generator = None  # the default generator: a captured graph advances it by itself
    torch.manual_seed(slots)
    text_logits = (3 * torch.randn(slots, TEXT_CARD, device=device)).bfloat16()
    audio_logits = (3 * torch.randn(STEPS, slots, CARD, device=device)).bfloat16()

    def run() -> Tensor:
        tokens = [sampling.sample(text_logits, text_how, generator)]
        noise = draw_noise((slots, STEPS, CARD), device, audio_how, generator)
        for step in range(STEPS):
            race = None if noise is None else noise[:, step]
            # one stream: each launch waits for the one before, as the depth steps do
            tokens.append(sampling.sample(audio_logits[step], audio_how, generator, noise=race))
        return torch.stack(tokens, dim=1)

    return run


def row(slots: int) -> dict[str, Any]:
    out: dict[str, Any] = {"slots": slots}
    for name, text_how, audio_how in (
        ("top_k", TEXT_DEFAULT, AUDIO_DEFAULT),
        ("greedy", GREEDY, GREEDY),
    ):
        run = tick_sampling(slots, text_how, audio_how)
        for kernel in (True, False):
            sampling.KERNEL = kernel
            key = f"{name}_{'kernel' if kernel else 'torch'}"
            out[key] = {**summary(replay_ms(run, replays=100)), "kernels": count_kernels(run)}
        sampling.KERNEL = True
    out["agreement"] = agreement(slots)
    return out


def agreement(slots: int) -> float:
    """Share of equal tokens, kernel vs torch ops, on the same logits and noise (top-k)."""
    device = torch.device("cuda")
    generator = torch.Generator(device).manual_seed(7)
    logits = (3 * torch.randn(64 * slots, CARD, device=device, generator=generator)).bfloat16()
    noise = draw_noise(tuple(logits.shape), device, AUDIO_DEFAULT, generator)
    got = sampling.sample(logits, AUDIO_DEFAULT, None, noise=noise, fused=True)
    want = sampling.sample(logits, AUDIO_DEFAULT, None, noise=noise, fused=False)
    return round(float((got == want).float().mean()), 6)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", default="1,128,300")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result: dict[str, Any] = {"command": " ".join(sys.argv), "machine": machine(), "rows": []}
    for slots in [int(s) for s in args.slots.split(",")]:
        result["rows"].append(row(slots))
        print(json.dumps(result["rows"][-1]), flush=True)
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
