"""The per-layer kernels at Moshi 7B shapes: each against its torch ops, and the temporal and
depformer stages with them (fused) and without (torch ops on CUDA), on one GPU.

    python bench/kernels_layer.py --slots 1,128 --json OUT.json

Per kernel (kernels/rms_norm.py, kernels/gated_silu.py, kernels/step_attention.py), bf16:
microseconds per call of the kernel and of the torch ops it replaces, each captured 20 times
in one CUDA graph (so launch gaps count as they do in the engine's graph), and the kernel's
bytes moved per second against the device's HBM ceiling. Up to attended_linear's MAX_ROWS
slots also kernels/attended_linear.py against the two launches it replaces (step_attention,
then fused_linear with the residual) in the `torch_us` column (run at 1-4 rows when MAX_ROWS
was 4: bench/results/kernels_layer_attended_rows.json).

Per stage, defined as in bench/engine_stages.py (`temporal`: embedding, 32 layers with every
ring full, out norm, text head, text sampling; `depformer`: 8 steps x 6 layers with
sampling), built once with random weights: median / p99 ms per CUDA-graph replay and the
kernels one eager run launches (torch profiler; the most launched by name), with `fused` off
and on.
"""

import argparse
import json
import logging
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("NO_TORCH_COMPILE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from gpu_timing import count_kernels, kernel_names, machine, replay_ms, summary
from torch import nn
from torch.nn import functional

from engine.models.moshi.attention import RmsNorm
from engine.models.moshi.config import moshiko
from engine.models.moshi.depformer import Depformer
from engine.models.moshi.lm import MoshiLm
from engine.models.moshi.model import randomize
from engine.models.moshi.sampling import Sampling, sample
from engine.models.moshi.transformer import TemporalLayer
from kernels.attended_linear import MAX_ROWS as ATTENDED_ROWS
from kernels.attended_linear import attended_linear
from kernels.fused_linear import fused_linear
from kernels.gated_silu import gated_silu, gated_silu_reference
from kernels.rms_norm import add_rms_norm, rms_norm, rms_norm_reference
from kernels.step_attention import step_attention

log = logging.getLogger("kernels_layer")
REPEATS = 20  # calls per captured graph in the kernel timings
HBM_BYTES_PER_S = 4.8e12  # H200 HBM3e peak
EPS = 1e-8
GREEDY = Sampling(greedy=True, temperature=1.0, top_k=1)


def step_attention_torch(
    qkv: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, step: int
) -> torch.Tensor:
    """The depformer's torch path: slice writes of this step's key and value, then SDPA."""
    slots, heads, _, head_dim = keys.shape
    q, k, v = qkv.view(slots, 3, heads, 1, head_dim).unbind(1)
    keys[:, :, step : step + 1] = k
    values[:, :, step : step + 1] = v
    return functional.scaled_dot_product_attention(
        q, keys[:, :, : step + 1], values[:, :, : step + 1]
    )


def kernel_row(
    name: str, fused: Callable[[], object], torch_ops: Callable[[], object], moved: int
) -> dict[str, Any]:
    fused_us = 1e3 * statistics.median(replay_ms(fused, repeats=REPEATS)) / REPEATS
    torch_us = 1e3 * statistics.median(replay_ms(torch_ops, repeats=REPEATS)) / REPEATS
    return {
        "kernel": name,
        "fused_us": round(fused_us, 2),
        "torch_us": round(torch_us, 2),
        "fused_kernels": count_kernels(fused),
        "torch_kernels": count_kernels(torch_ops),
        "bytes": moved,
        "fused_hbm_share": round(moved / (fused_us * 1e-6) / HBM_BYTES_PER_S, 3),
    }


def kernels(slots: int) -> list[dict[str, Any]]:
    config = moshiko().lm
    cuda = torch.device("cuda")
    bf16 = torch.bfloat16
    dim, hidden, dep = config.dim, config.ffn_hidden, config.depformer_dim
    x = torch.randn(slots, 1, dim, device=cuda, dtype=bf16)
    residual = torch.randn_like(x)
    alpha = torch.rand(1, 1, dim, device=cuda, dtype=bf16)
    h = torch.randn(slots, 1, 2 * hidden, device=cuda, dtype=bf16)
    heads, steps = config.depformer_num_heads, config.audio_codebooks
    qkv = torch.randn(slots, 3 * dep, device=cuda, dtype=bf16)
    scratch = (slots, heads, steps, dep // heads)
    keys = torch.randn(scratch, device=cuda, dtype=bf16)
    values = torch.randn(scratch, device=cuda, dtype=bf16)
    row = 2 * dim  # bytes of one bf16 row of the temporal width
    last = steps - 1  # the step that reads the whole scratch
    out_proj = torch.randn(dep, dep, device=cuda, dtype=bf16) * dep**-0.5
    stream = torch.randn(slots, dep, device=cuda, dtype=bf16)  # the residual
    # up to its MAX_ROWS: attended_linear against the two launches it replaces
    attended = []
    if slots <= ATTENDED_ROWS:
        attended.append(
            kernel_row(
                "attended_linear",
                lambda: attended_linear(qkv, keys, values, last, out_proj, stream),
                lambda: fused_linear(
                    step_attention(qkv, keys, values, last), out_proj, residual=stream
                ),
                2 * (4 * slots * dep + 2 * keys.numel() + out_proj.numel()),
            )
        )
    return [
        *attended,
        kernel_row(
            "rms_norm",
            lambda: rms_norm(x, alpha, EPS),
            lambda: rms_norm_reference(x, alpha, EPS),
            2 * slots * row + row,
        ),
        kernel_row(
            "add_rms_norm",
            lambda: add_rms_norm(x, residual, alpha, EPS),
            lambda: rms_norm_reference(x + residual, alpha, EPS),
            4 * slots * row + row,
        ),
        kernel_row(
            "gated_silu",
            lambda: gated_silu(h),
            lambda: gated_silu_reference(h),
            3 * slots * hidden * 2,
        ),
        kernel_row(
            "step_attention",
            lambda: step_attention(qkv, keys, values, last),
            lambda: step_attention_torch(qkv, keys, values, last),
            2 * (4 * slots * dep + 2 * keys.numel()),
        ),
    ]


def set_fused(model: nn.Module, fused: bool) -> None:
    for module in model.modules():
        if isinstance(module, RmsNorm | TemporalLayer | Depformer):
            module.fused = fused


def stages(slots: int) -> dict[str, Any]:
    config = moshiko()
    cuda = torch.device("cuda")
    generator = torch.Generator(device=cuda).manual_seed(0)
    lm = MoshiLm(config.lm, slots, cuda, torch.bfloat16, GREEDY, GREEDY, generator)
    randomize(lm, 1)
    lm.eval()
    lm.transformer.positions.fill_(2 * config.lm.context)  # every ring full
    tokens = torch.zeros(slots, 1, lm.delays.delays.shape[0], device=cuda, dtype=torch.long)
    hidden = torch.randn(slots, 1, config.lm.dim, device=cuda, dtype=torch.bfloat16)
    text = torch.zeros(slots, device=cuda, dtype=torch.long)

    def temporal() -> None:
        out = lm.out_norm(lm.transformer.step(lm.embed(tokens)))
        text.copy_(sample(lm.text_linear(out)[:, 0].float(), GREEDY, generator))

    def depformer() -> None:
        lm.depformer(hidden, text, GREEDY, generator)

    row: dict[str, Any] = {"slots": slots}
    for name, stage in (("temporal", temporal), ("depformer", depformer)):
        for fused in (False, True):
            set_fused(lm, fused)
            key = f"{name}_{'fused' if fused else 'torch'}"
            names = kernel_names(stage)
            row[key] = summary(replay_ms(stage)) | {
                "kernels": sum(names.values()),
                # launches per kernel name, the 12 most frequent (names truncated)
                "most_launched": {name[:80]: n for name, n in names.most_common(12)},
            }
            log.info("%d slots %s %s", slots, key, row[key])
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", default="1,128")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": machine(),
        "model": "moshiko 7B shapes, random weights, bf16, context 1500 frames, rings full",
        "kernels": [],
        "stages": [],
    }
    with torch.no_grad():
        for slots in [int(s) for s in args.slots.split(",")]:
            result["kernels"].append({"slots": slots, "rows": kernels(slots)})
            log.info("%d slots kernels %s", slots, result["kernels"][-1])
            result["stages"].append(stages(slots))
            torch.cuda.empty_cache()
            if args.json:
                args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
