"""fp8 KV rings against bf16 rings: same weights, same user audio, long greedy runs.

    python bench/moshi_fp8_fidelity.py --json OUT.json [--streams 4] [--frames 1600]
        [--config 7b --device cuda | --config tiny --device cpu]

Two Moshi LMs with the same seeded random weights, one with bf16 temporal KV rings, one with
fp8 e4m3 rings (a bf16 scale per entry), run `--frames` greedy steps side by side on the same
random user codes (`--streams` calls, all started at frame 0; 1600 frames fill the 1500-frame
rings and wrap them). On CUDA each LM's step is one CUDA graph through the served kernels.
Per stream: the first frame whose emitted tokens (text + 8 audio codes) differ, the share of
frames whose tokens agree (after a divergence the two runs condition on different pasts, so
this is a drift measure, not an error rate), and the text-logit error (max |diff|, max |diff| /
max |logit|, mean |diff|) over the frames before the first divergence, where both runs saw the
same inputs. Random weights are not a trained model: their logits are flatter, so argmax
flips come easier than with real weights, and their K/V statistics are not a trained model's.
"""

import argparse
import json
import logging
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import Tensor

from engine.models.moshi.attention import KV_FP8
from engine.models.moshi.config import load_config
from engine.models.moshi.lm import MoshiLm
from engine.models.moshi.model import randomize
from engine.models.moshi.sampling import Sampling

log = logging.getLogger("moshi_fp8_fidelity")
GREEDY = Sampling(greedy=True, temperature=1.0, top_k=1)
WEIGHTS_SEED = 1


class Run:
    """One LM and its step, recording the emitted frame and the text logits of every step."""

    def __init__(self, lm: MoshiLm, user: Tensor) -> None:
        self.lm = lm
        streams = user.shape[0]
        self.user = user  # [streams, 8], the step's input (written before each step)
        self.logits = torch.zeros(streams, lm.config.text_card, device=user.device)
        codes = 1 + lm.config.audio_codebooks
        self.frame = torch.zeros(streams, codes, dtype=torch.long, device=user.device)
        lm.text_linear.register_forward_hook(self._keep_logits)
        self.no_reset = torch.zeros(streams, dtype=torch.bool, device=user.device)
        self.graph: torch.cuda.CUDAGraph | None = None

    def _keep_logits(self, module: torch.nn.Module, inputs: Any, output: Tensor) -> None:
        self.logits.copy_(output[:, 0].float())

    def _step(self, reset: Tensor) -> None:
        frame, _ = self.lm.step(self.user, reset)
        self.frame.copy_(frame)

    def start(self) -> None:
        """Every stream starts a call at this step (eager), then the graph takes over."""
        self._step(~self.no_reset)

    def capture(self) -> None:
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._step(self.no_reset)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._step(self.no_reset)

    def step(self) -> None:
        if self.graph is None:
            self._step(self.no_reset)
        else:
            self.graph.replay()


def build(config_name: str, streams: int, device: torch.device, kv_dtype: Any) -> MoshiLm:
    config = load_config(config_name)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    lm = MoshiLm(config.lm, streams, device, dtype, GREEDY, GREEDY, None, kv_dtype)
    randomize(lm, WEIGHTS_SEED)
    return lm.eval()


def compare(
    runs: dict[str, Run], user_codes: Tensor, sync: Callable[[], None]
) -> dict[str, Tensor]:
    """Run both LMs frame by frame on the same user codes; per frame and stream: tokens
    equal, text-logit max |diff|, max |logit|, mean |diff|."""
    frames, streams, _ = user_codes.shape
    device = user_codes.device
    same = torch.zeros(frames, streams, dtype=torch.bool, device=device)
    max_diff = torch.zeros(frames, streams, device=device)
    max_logit = torch.zeros(frames, streams, device=device)
    mean_diff = torch.zeros(frames, streams, device=device)
    for run in runs.values():
        run.user.copy_(user_codes[0])
        run.start()
    for frame in range(frames):
        if frame:
            for run in runs.values():
                run.user.copy_(user_codes[frame])
                run.step()
        bf16, fp8 = runs["bf16"], runs["fp8"]
        same[frame] = (bf16.frame == fp8.frame).all(dim=1)
        diff = (fp8.logits - bf16.logits).abs()
        max_diff[frame] = diff.amax(dim=1)
        mean_diff[frame] = diff.mean(dim=1)
        max_logit[frame] = bf16.logits.abs().amax(dim=1)
        if frame % 200 == 199:
            sync()
            log.info("frame %d", frame + 1)
    return {"same": same, "max_diff": max_diff, "max_logit": max_logit, "mean_diff": mean_diff}


def summarize(stats: dict[str, Tensor]) -> list[dict[str, Any]]:
    same = stats["same"].cpu()
    rows = []
    for stream in range(same.shape[1]):
        differs = (~same[:, stream]).nonzero()
        first = int(differs[0, 0]) if len(differs) else None
        clean = slice(0, (first + 1) if first is not None else same.shape[0])
        max_diff = stats["max_diff"][clean, stream].cpu()
        rows.append(
            {
                "stream": stream,
                "first_divergence_frame": first,
                "token_agreement": round(float(same[:, stream].float().mean()), 4),
                "frames_compared_for_logits": int(max_diff.shape[0]),
                "text_logit_max_abs_error": round(float(max_diff.max()), 5),
                "text_logit_max_error_over_max_logit": round(
                    float((max_diff / stats["max_logit"][clean, stream].cpu()).max()), 5
                ),
                "text_logit_mean_abs_error": round(
                    float(stats["mean_diff"][clean, stream].mean()), 6
                ),
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="7b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--frames", type=int, default=1600)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    device = torch.device(args.device)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    user_codes = torch.randint(0, 2048, (args.frames, args.streams, 8), device=device)
    runs: dict[str, Run] = {}
    with torch.no_grad():
        for name, kv_dtype in (("bf16", None), ("fp8", KV_FP8)):
            lm = build(args.config, args.streams, device, kv_dtype)
            user_codes.clamp_(max=lm.config.card - 1)
            runs[name] = Run(lm, torch.zeros_like(user_codes[0]))
            if device.type == "cuda":
                runs[name].capture()

        def sync() -> None:
            if device.type == "cuda":
                torch.cuda.synchronize()

        stats = compare(runs, user_codes, sync)
        sync()
    context = runs["bf16"].lm.config.context
    rows = summarize(stats)
    result = {
        "command": " ".join(sys.argv),
        "machine": {
            "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.machine(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
        },
        "model": f"{args.config}, random weights (seed {WEIGHTS_SEED}), greedy, "
        f"{'bf16' if device.type == 'cuda' else 'fp32'} weights",
        "kv": "bf16 rings vs fp8 e4m3 rings with a bf16 scale per (slot, head, position)",
        "context_frames": context,
        "frames": args.frames,
        "streams": args.streams,
        "seconds": round(time.perf_counter() - t0, 1),
        "per_stream": rows,
        "token_agreement_mean": round(sum(r["token_agreement"] for r in rows) / len(rows), 4),
    }
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
