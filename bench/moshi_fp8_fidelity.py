"""fp8 KV rings against bf16 rings: same weights, same user audio, same tokens, long runs.

    python bench/moshi_fp8_fidelity.py --json OUT.json [--streams 4] [--frames 1600]
        [--config 7b --device cuda | --config tiny --device cpu]

Three Moshi LMs with the same seeded random weights run `--frames` greedy steps side by side on
the same random user codes (`--streams` calls, all started at frame 0; 1600 frames fill the
1500-frame rings and wrap them): bf16 rings through the served kernels (the reference), the
same bf16 rings through torch's SDPA (another valid bf16 computation: the noise floor), and
fp8 e4m3 rings with a bf16 scale per entry. The two others are teacher-forced on the
reference's tokens (its delay rings copied into theirs after every step), so at every frame
all three condition on the same past and differ only by what their KV rings hold; a free run
would follow the same tokens up to the first divergence reported here. Per stream, over all
frames and over those past the first wrap: the share of frames whose emitted tokens (text +
8 audio codes) equal the reference's, the same for the text token alone, and the text-logit
error (max |diff|, max |diff| / max |logit|, mean |diff|). On CUDA each LM's step is one CUDA
graph.

Random weights are not a trained model: a random 7B stack amplifies small differences (the
bf16 floor shows by how much) and its logits are flatter than a trained model's, so argmax
flips come easier; its K/V statistics are not a trained model's either.
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


def follow(run: Run, leader: Run) -> None:
    """Teacher forcing: `run` continues from `leader`'s tokens (the delay rings hold every
    token a step reads), so only the KV rings' contents differ between the two."""
    for name, buffer in leader.lm.delays.named_buffers():
        run.lm.delays.get_buffer(name).copy_(buffer)


def compare(
    runs: dict[str, Run], user_codes: Tensor, sync: Callable[[], None]
) -> dict[str, dict[str, Tensor]]:
    """Step every LM on the same user codes, the others teacher-forced on the bf16 run's
    tokens; per other run, frame and stream: emitted tokens equal, text argmax equal, text
    logit max |diff|, max |logit|, mean |diff| against the bf16 run."""
    frames, streams, _ = user_codes.shape
    device = user_codes.device
    leader = runs["bf16"]
    others = {name: run for name, run in runs.items() if run is not leader}

    def zeros(dtype: torch.dtype = torch.float32) -> Tensor:
        return torch.zeros(frames, streams, dtype=dtype, device=device)

    stats = {
        name: {
            "same": zeros(torch.bool),
            "same_text": zeros(torch.bool),
            "max_diff": zeros(),
            "max_logit": zeros(),
            "mean_diff": zeros(),
        }
        for name in others
    }
    for frame in range(frames):
        for run in runs.values():
            run.user.copy_(user_codes[frame])
            if frame == 0:
                run.start()
            else:
                run.step()
        for name, run in others.items():
            row = stats[name]
            row["same"][frame] = (run.frame == leader.frame).all(dim=1)
            row["same_text"][frame] = run.logits.argmax(dim=1) == leader.logits.argmax(dim=1)
            diff = (run.logits - leader.logits).abs()
            row["max_diff"][frame] = diff.amax(dim=1)
            row["mean_diff"][frame] = diff.mean(dim=1)
            row["max_logit"][frame] = leader.logits.abs().amax(dim=1)
            follow(run, leader)
        if frame % 200 == 199:
            sync()
            log.info("frame %d", frame + 1)
    return stats


def summarize(stats: dict[str, Tensor], context: int) -> dict[str, Any]:
    """Per stream, over all frames and over the frames past the first wrap of the ring."""
    host = {key: value.cpu() for key, value in stats.items()}
    relative = host["max_diff"] / host["max_logit"]
    streams = []
    for stream in range(host["same"].shape[1]):
        differs = (~host["same"][:, stream]).nonzero()
        row: dict[str, Any] = {
            "stream": stream,
            "first_divergence_frame": int(differs[0, 0]) if len(differs) else None,
        }
        for span, frames in (("all", slice(None)), ("wrapped", slice(context, None))):
            row[span] = {
                "frames": int(host["same"][frames, stream].shape[0]),
                "token_agreement": round(float(host["same"][frames, stream].float().mean()), 4),
                "text_agreement": round(float(host["same_text"][frames, stream].float().mean()), 4),
                "text_logit_max_abs_error": round(float(host["max_diff"][frames, stream].max()), 4),
                "text_logit_max_error_over_max_logit": round(
                    float(relative[frames, stream].max()), 4
                ),
                "text_logit_mean_abs_error": round(
                    float(host["mean_diff"][frames, stream].mean()), 5
                ),
            }
        streams.append(row)
    return {
        "token_agreement_mean": round(float(host["same"].float().mean()), 4),
        "text_agreement_mean": round(float(host["same_text"].float().mean()), 4),
        "text_logit_mean_abs_error": round(float(host["mean_diff"].mean()), 5),
        "text_logit_max_error_over_max_logit_median": round(float(relative.median()), 4),
        "per_stream": streams,
    }


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
        # bf16 (the served kernels), the same bf16 rings through torch's SDPA (an equally
        # valid bf16 computation: the floor fp8 is judged against), and fp8 rings
        for name, kv_dtype, decode_kernel in (
            ("bf16", None, None),
            ("bf16_sdpa", None, False),
            ("fp8", KV_FP8, None),
        ):
            lm = build(args.config, args.streams, device, kv_dtype)
            lm.transformer.decode_kernel = decode_kernel
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
        "reference": "the bf16 rings through the served kernels; the others follow its tokens",
        "context_frames": context,
        "frames": args.frames,
        "streams": args.streams,
        "seconds": round(time.perf_counter() - t0, 1),
        "fp8_vs_bf16": summarize(stats["fp8"], context),
        "bf16_sdpa_vs_bf16": summarize(stats["bf16_sdpa"], context),
    }
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
