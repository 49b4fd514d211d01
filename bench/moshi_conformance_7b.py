"""Cadence's Moshi against Kyutai's `moshi` at the full 7B shapes, random weights, on a GPU.

    python bench/moshi_conformance_7b.py [--frames 20] [--json out.json] [--skip-fp32]

Checks, each printed and written as one JSON document:
- greedy fp32 tokens (text + 8 codebooks) of the LM fed random user codes, stepped against
  `LMGen`: identical for how many frames (`first_mismatch` null = all);
- bf16 teacher-forced text logits of the stepped LM against the reference's `forward_text`
  over the same tokens: max / mean absolute error relative to the largest logit, argmax
  agreement;
- Mimi (fp32, random weights, codebooks filled as in the tests): streaming codes identical,
  decoded audio relative error;
- median milliseconds per eager step of Cadence's LM and Mimi (no CUDA graphs yet).

Needs CUDA and the `moshi` package (0.2.13, `pip install --no-deps`; a test-only dependency).
The reference weights come from `torch.manual_seed` and are loaded into Cadence's model
through its checkpoint loader, by the reference's own tensor names.
"""

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("NO_TORCH_COMPILE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from moshi.models import loaders
from moshi.models.lm import LMGen, LMModel

from engine.models.moshi.checkpoint import (
    lm_sources,
    lm_unused,
    load_into,
    mimi_sources,
    mimi_unused,
)
from engine.models.moshi.config import MoshiConfig, moshiko
from engine.models.moshi.lm import MoshiLm
from engine.models.moshi.mimi.codec import MimiCodec
from engine.models.moshi.sampling import Sampling

logger = logging.getLogger("moshi_conformance_7b")
GREEDY = Sampling(greedy=True, temperature=1.0, top_k=1)
FRAME = 1920


def reference_lm(seed: int, dtype: torch.dtype, device: torch.device) -> LMModel:
    torch.manual_seed(seed)
    return loaders.get_moshi_lm(None, lm_kwargs=loaders._lm_kwargs, device=device, dtype=dtype)


def ours_lm(ref: LMModel, config: MoshiConfig, dtype: torch.dtype, device: torch.device) -> MoshiLm:
    lm = MoshiLm(config.lm, 1, device, dtype, GREEDY, GREEDY, None)
    load_into(lm, ref.state_dict(), lm_sources(config.lm), lm_unused(config.lm), "reference")
    return lm


def check_tokens(frames: int, seed: int, device: torch.device) -> dict[str, Any]:
    config = moshiko()
    ref = reference_lm(seed, torch.float32, device)
    ours = ours_lm(ref, config, torch.float32, device)
    user = torch.randint(0, 2048, (1, 8, frames), device=device)
    gen = LMGen(ref, use_sampling=False, support_out_of_sync=True)
    want = []
    with torch.no_grad(), gen.streaming(1):
        for t in range(frames):
            out = gen.step(user[:, :, t : t + 1])
            assert out is not None
            want.append(out[0, :9, 0])
    got, times = [], []
    reset = torch.ones(1, dtype=torch.bool, device=device)
    with torch.no_grad():
        for t in range(frames):
            torch.cuda.synchronize()
            start = time.perf_counter()
            frame, emitted = ours.step(user[:, :, t], reset)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            reset = torch.zeros_like(reset)
            got.append(torch.where(emitted[0], frame[0], torch.full_like(frame[0], -2)))
    equal = [bool(torch.equal(a, b)) for a, b in zip(got, want, strict=True)]
    first = next((t for t, same in enumerate(equal) if not same), None)
    return {
        "dtype": "float32",
        "frames": frames,
        "equal": first is None,
        "first_mismatch": first,
        "lm_ms_per_step_median": 1e3 * statistics.median(times[2:]),
    }


def check_logits(frames: int, seed: int, device: torch.device) -> dict[str, Any]:
    config = moshiko()
    ref = reference_lm(seed, torch.bfloat16, device)
    ours = ours_lm(ref, config, torch.bfloat16, device)
    tokens = torch.randint(0, 2048, (frames, 17), device=device)
    tokens[:, 0] = torch.randint(0, 32000, (frames,), device=device)
    delays = torch.tensor(config.lm.delays, device=device)
    initial = torch.tensor([32000] + [2048] * 16, device=device)
    tokens = torch.where(torch.arange(frames, device=device)[:, None] <= delays, initial, tokens)
    with torch.no_grad():
        _, want_logits = ref.forward_text(tokens.T[None])
        want = want_logits[0, 0].float()
        ours.reset(torch.ones(1, dtype=torch.bool, device=device))
        rows = []
        for t in range(frames):
            ours.delays.seed(0, t, tokens[t])
            rows.append(ours.advance()[2][0].float())
        got = torch.stack(rows)
    scale = want.abs().max().item()
    error = (got - want).abs()
    return {
        "dtype": "bfloat16",
        "frames": frames,
        "max_abs_error_rel": error.max().item() / scale,
        "mean_abs_error_rel": error.mean().item() / scale,
        "largest_logit": scale,
        "argmax_agreement": (got.argmax(-1) == want.argmax(-1)).float().mean().item(),
    }


def check_mimi(frames: int, seed: int, device: torch.device) -> dict[str, Any]:
    config = moshiko().mimi
    torch.manual_seed(seed)
    ref = loaders.get_mimi(None, device=device)
    quantizer: Any = ref.quantizer
    for half in (quantizer.rvq_first, quantizer.rvq_rest):
        for layer in half.vq.layers:
            layer._codebook.embedding_sum.normal_(std=0.02)
            layer._codebook.cluster_usage.fill_(1.0)
            layer._codebook._embedding = None
    ours = MimiCodec(config, 1, device)
    load_into(ours, ref.state_dict(), mimi_sources(ours, config), mimi_unused(config), "ref")
    generator = torch.Generator(device=device).manual_seed(seed)
    envelope = torch.rand(frames, generator=generator, device=device).repeat_interleave(FRAME)
    pcm = 0.5 * envelope * torch.randn(frames * FRAME, generator=generator, device=device)
    times = []
    with torch.no_grad():
        with ref.streaming(1):
            want_codes = torch.cat(
                [ref.encode(pcm[None, None, t * FRAME : (t + 1) * FRAME]) for t in range(frames)],
                dim=2,
            )[0]
        with ref.streaming(1):
            want_pcm = torch.cat(
                [ref.decode(want_codes[None, :, t : t + 1])[0, 0] for t in range(frames)]
            )
        every = torch.ones(1, dtype=torch.bool, device=device)
        ours.reset_encoder(every)
        ours.reset_decoder(every)
        codes, audio = [], []
        for t in range(frames):
            torch.cuda.synchronize()
            start = time.perf_counter()
            frame_codes = ours.encode(pcm[None, t * FRAME : (t + 1) * FRAME])
            audio.append(ours.decode(frame_codes)[0])
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            codes.append(frame_codes[0])
    got_codes = torch.stack(codes, dim=1)
    got_pcm = torch.cat(audio)
    return {
        "frames": frames,
        "codes_equal": bool(torch.equal(got_codes, want_codes)),
        "distinct_frames": int(torch.unique(want_codes, dim=1).shape[1]),
        "audio_rel_error": ((got_pcm - want_pcm).norm() / want_pcm.norm()).item(),
        "mimi_ms_per_step_median": 1e3 * statistics.median(times[2:]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--skip-fp32", action="store_true", help="skip the fp32 token check")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not torch.cuda.is_available():
        logger.error("needs CUDA")
        return 2
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "moshi": __import__("moshi").__version__,
    }
    results["mimi_fp32"] = check_mimi(args.frames, args.seed, device)
    torch.cuda.empty_cache()
    results["logits_bf16"] = check_logits(args.frames, args.seed, device)
    torch.cuda.empty_cache()
    if not args.skip_fp32:
        results["tokens_fp32"] = check_tokens(args.frames, args.seed, device)
    text = json.dumps(results, indent=2)
    sys.stdout.write(text + "\n")
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
