"""Mimi encode / decode on one GPU, eager against fused (kernels/mimi_*.py), per slot count.

    python3 bench/mimi_gpu.py --slots 1,128,300 --json bench/results/mimi_gpu.json

For each slot count it builds Moshi's Mimi (fp32, seeded random weights) three times on the
same weights: `fused=False` (the eager path, as it was before the kernels, time-last SEANet
layout), `fused=True` with the time-last layout (`time_last`) and `fused=True` with the
default channels-last layout (mimi/seanet.py) with the glue kernels, as the engine serves it;
where the transformers' products take the
few-rows kernel (slots * 2 <= mimi/transformer.py's FEW_ROWS), a fourth time with them on
cuBLAS (`fused_cublas_products`). Matmuls run in TF32 as the engine runs them. It measures
`encode` (pcm [slots, 1920] -> codes [slots, 8]) and `decode` (codes -> pcm) exactly as
bench/engine_stages.py's mimi_encode / mimi_decode rows do: each stage captured as its own
CUDA graph, median and p99 ms of 50 replays after 5, and the kernels one eager run launches
(torch profiler). Also recorded: the first fused call's time (Triton's JIT compiles there,
before any capture) and, at the largest slot count, the fused stages' ten costliest kernels.
Every transformer starts at STEADY_POSITION, past its ring, so attention reads full rings.

First (unless --no-sweep) it times kernels/mimi_transformer.py's ring_attention_step alone,
per slot count and program shape (SHAPES: block, tiles per split, warps, pair;
`--sweep-only`: and stops there). The codec runs with the kernel's own choice per slot
count (mimi_transformer.step_shape, whose shapes are set from the committed sweeps by hand),
recorded as `attention_shapes`.
"""

import argparse
import functools
import json
import logging
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from gpu_timing import count_kernels, machine, ranked, replay_ms, summary

import kernels.mimi_transformer as step_kernel
from engine.models import ModelOptions
from engine.models.moshi.config import moshiko
from engine.models.moshi.mimi.codec import MimiCodec
from engine.models.moshi.mimi.transformer import FEW_ROWS
from engine.models.moshi.model import randomize

log = logging.getLogger("mimi_gpu")
# frames since reset that every transformer starts at: past the 250-frame ring, so each step
# attends a full ring (the steady state of a call older than 10 s), not a young call's few
STEADY_POSITION = 1000
# (block_n, tiles_per_split, num_warps, pair) of ring_attention_step; tiles_per_split 4 at
# block 64 is one program per (slot, head) over the whole 250-frame ring, as the first kernel
# was; `pair` the older entries through _attend_older_pair (served for T = 2) or not
SHAPES = [
    (16, 1, 4, False),
    (32, 2, 4, False),
    (64, 4, 4, False),
    (16, 1, 4, True),
    (32, 1, 4, True),
    (32, 2, 4, True),
    (64, 2, 4, True),
    (64, 4, 4, True),
    (32, 8, 4, True),
]
LAUNCHES = 20  # ring_attention_step launches per captured graph in the sweep


def time_launches(launch: Callable[[], object]) -> float:
    """us per call of `launch`: median of 10 replays of a graph of LAUNCHES calls."""
    times = replay_ms(launch, replays=10, repeats=LAUNCHES)
    return float(statistics.median(times)) * 1000 / LAUNCHES


def sweep_attention(counts: list[int]) -> list[dict[str, Any]]:
    """ring_attention_step alone on Moshi's Mimi shapes (8 heads x 64, 250-frame rings,
    T = 2, full rings), per slot count and program shape: us per launch and the K+V read
    rate (one layer's rings read once)."""
    config = moshiko().mimi
    heads = config.transformer_heads
    head_dim = config.seanet_dim // heads
    capacity = config.transformer_context
    device = torch.device("cuda")
    rows = []
    for slots in counts:
        qkv = torch.randn(slots, 2, 3 * heads * head_dim, device=device)
        keys = torch.randn(slots, heads, capacity, head_dim, device=device)
        values = torch.randn_like(keys)
        start = torch.full((slots,), STEADY_POSITION, device=device, dtype=torch.long)
        half = torch.arange(head_dim // 2, device=device, dtype=torch.float32)
        freqs = torch.exp(half * (-math.log(config.max_period) * 2 / head_dim))
        positions = start[:, None] + torch.arange(2, device=device)
        cos, sin = step_kernel.rope_tables(positions, freqs)
        inputs = (qkv, cos, sin, keys, values, start, capacity)
        read_bytes = 2 * keys.numel() * keys.element_size()
        for block_n, tiles, warps, pair in SHAPES:
            launch = functools.partial(
                step_kernel.ring_attention_step, *inputs, block_n, tiles, warps, pair
            )
            us = time_launches(launch)
            row = {
                "slots": slots,
                "block_n": block_n,
                "tiles_per_split": tiles,
                "num_warps": warps,
                "pair": pair,
                "us": round(us, 1),
                "read_tb_s": round(read_bytes / us / 1e6, 2),
            }
            log.info("attention %s", row)
            rows.append(row)
    return rows


def top_kernels(stage: Callable[[], object], count: int = 10) -> list[dict[str, Any]]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        stage()
        torch.cuda.synchronize()
    kernels = (
        (event.name[:90], event.device_time)
        for event in prof.events()
        if event.device_type.name == "CUDA"
    )
    return [
        {"kernel": name, "us": round(us, 1), "launches": n}
        for name, n, us in ranked(kernels, count)
    ]


def measure(slots: int, profile: bool) -> dict[str, Any]:
    config = moshiko().mimi
    device = torch.device("cuda")
    eager = MimiCodec(config, slots, device, fused=False, channels_last=False)
    randomize(eager, 2)
    fused = MimiCodec(config, slots, device, fused=True)
    fused.load_state_dict(eager.state_dict())
    glue = ModelOptions().mimi_glue_kernels  # as the engine serves it on CUDA
    fused.use_glue_kernels(glue)
    time_last = MimiCodec(config, slots, device, fused=True, channels_last=False)
    time_last.load_state_dict(eager.state_dict())
    paths = {"eager": eager, "time_last": time_last, "fused": fused}
    if slots * config.encoder_steps_per_frame <= FEW_ROWS:
        # the fused codec with every transformer product on cuBLAS, where the default takes
        # the few-rows kernel (mimi/transformer.py)
        cublas = MimiCodec(config, slots, device, fused=True)
        cublas.load_state_dict(eager.state_dict())
        cublas.use_glue_kernels(glue)
        for transformer in (cublas.encoder_transformer, cublas.decoder_transformer):
            transformer.few_rows = 0
        paths["fused_cublas_products"] = cublas
    pcm = torch.randn(slots, config.frame_samples, device=device) * 0.1
    codes = torch.randint(0, config.bins, (slots, config.codebooks), device=device)
    for codec in paths.values():
        for transformer in (codec.encoder_transformer, codec.decoder_transformer):
            transformer.positions.fill_(STEADY_POSITION)
    row: dict[str, Any] = {"slots": slots}
    with torch.no_grad():
        begin = time.perf_counter()
        fused.decode(fused.encode(pcm))
        torch.cuda.synchronize()
        row["fused_first_call_s"] = round(time.perf_counter() - begin, 2)
        for path, codec in paths.items():
            plan: dict[str, Callable[[], object]] = {
                "encode": lambda codec=codec: codec.encode(pcm),  # type: ignore[misc]
                "decode": lambda codec=codec: codec.decode(codes),  # type: ignore[misc]
            }
            for stage, run in plan.items():
                key = f"{path}_{stage}"
                row[key] = summary(replay_ms(run)) | {"kernels": count_kernels(run)}
                log.info("%d slots %s %s", slots, key, row[key])
                if profile and path == "fused":
                    row[f"{key}_top"] = top_kernels(run)
    for stage in ("encode", "decode"):
        fused_ms = row[f"fused_{stage}"]["median_ms"]
        row[f"{stage}_speedup"] = round(row[f"eager_{stage}"]["median_ms"] / fused_ms, 2)
        row[f"{stage}_channels_last_speedup"] = round(
            row[f"time_last_{stage}"]["median_ms"] / fused_ms, 2
        )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", default="1,128,300")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--no-sweep",
        action="store_true",
        help="time the codec only, not ring_attention_step's shapes first",
    )
    parser.add_argument(
        "--sweep-only", action="store_true", help="time ring_attention_step's shapes only"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.backends.cuda.matmul.allow_tf32 = True  # the engine's setting (build_model)
    counts = [int(s) for s in args.slots.split(",")]
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": machine()
        | {
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        },
        "model": "moshiko Mimi, fp32, random weights (seed 2), each stage its own CUDA graph",
        "steady_position": STEADY_POSITION,
        "rows": [],
    }
    if not args.no_sweep:
        result["attention_sweep"] = sweep_attention(counts)
        torch.cuda.empty_cache()
        if args.sweep_only:
            print(json.dumps(result["attention_sweep"]))
            if args.json:
                args.json.write_text(json.dumps(result, indent=1))
            return 0
    cuda = torch.device("cuda")
    # the codec runs with the kernel's own choice per slot count (step_shape)
    result["attention_shapes"] = {
        slots: step_kernel.step_shape(slots * moshiko().mimi.transformer_heads, cuda)
        for slots in counts
    }
    for slots in counts:
        result["rows"].append(measure(slots, profile=slots == max(counts)))
        torch.cuda.empty_cache()
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["rows"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
