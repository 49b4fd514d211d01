"""Where the captured tick's time goes, kernel by kernel, on one GPU.

    python bench/tick_kernels.py --slots 1,128 [--kv-dtype fp8] --json OUT.json

For each slot count it builds Cadence's Moshi (7B shapes, random weights, every temporal ring
full), captures the whole step with the graph executor and profiles REPLAYS replays of that
graph (torch profiler, CUPTI records each kernel node of a replayed graph). Per tick it
reports the span from the first kernel's start to the last kernel's end, the kernels'
durations summed (busy), the rest (gaps between dependent kernels: launch latency inside the
graph; with programmatic dependent launch, kernels/dependent_launch.py, a kernel starts before
the one before it ends and its time includes that wait, so busy can exceed the span and the
gaps read negative), and the kernels grouped by a short name (Triton kernel, cuBLAS/CUTLASS
GEMM, torch elementwise ...) with their count and summed time, largest first, and how much
of the span they account for (`advance_us_per_tick`: each kernel's move of the latest end
seen so far, gpu_timing.frontier_advances; summed over every kernel of a tick it is the
span, first start to last end, with PDL's overlap and waits taken out). It answers
"launches or bytes?" for each slot count. `--ops` adds the torch ops of one eager step that
launch kernels themselves, each with the first line of Cadence's code on its stack
(`launching_ops`): where the torch launches left in the tick come from. (Results before the
commit that added the sentence on cuDNN's names named cuDNN's
`sm80_xmma_dgrad_implicit_gemm_...` kernels by their `gemm_...` tail only.)
"""

import argparse
import json
import logging
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
from engine_gpu import SAMPLES, build, fill_rings  # bench/, this folder
from gpu_timing import frontier_advances, machine, ranked

from engine.executors.graph import GraphExecutor
from engine.models.moshi.config import moshiko

log = logging.getLogger("tick_kernels")
REPLAYS = 5
TOP = 25
TOP_OPS = 40


def short_name(name: str) -> str:
    """A kernel's family: Triton kernels keep their function name, GEMMs and torch's
    elementwise/reduction kernels lose their template arguments."""
    if "gemm" in name.lower() or "gemv" in name.lower() or re.match(r"sm\d\d_", name):
        # cuDNN's and CUTLASS's names start with their family (sm80_xmma_dgrad_...): kept
        match = re.search(r"(sm\d\d_\w+|gemv\w*|gemm\w*)", name, re.IGNORECASE)
        return "gemm: " + (match.group(1)[:60] if match else name[:60])
    name = re.sub(r"<.*", "", name)  # template arguments
    name = re.sub(r"\(.*", "", name)  # argument lists
    return name.split("::")[-1][:80]


def launching_ops(model: Any, slots: int) -> list[dict[str, Any]]:
    """The torch ops of one eager step that launch kernels themselves (Triton's launches are
    not torch ops): per op and the first line of Cadence's code on its stack, the kernels
    launched, most first."""
    pcm = torch.randn(slots, SAMPLES, device="cuda") * 0.1
    reset = torch.zeros(slots, dtype=torch.bool, device="cuda")
    active = torch.ones(slots, dtype=torch.bool, device="cuda")
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, with_stack=True) as prof:
        model.device_step(pcm, reset, active)
        torch.cuda.synchronize()
    launched: Counter[tuple[str, str]] = Counter()
    for event in prof.events():
        if event.device_type.name == "CPU" and event.kernels:
            ours = (
                f
                for f in event.stack
                if f.startswith(("engine/", "kernels/")) or "/engine/" in f or "/kernels/" in f
            )
            launched[(event.name, next(ours, "?"))] += len(event.kernels)
    return [
        {"op": op, "where": where, "kernels": count}
        for (op, where), count in launched.most_common(TOP_OPS)
    ]


def profile_tick(slots: int, kv_dtype: torch.dtype | None, ops: bool) -> dict[str, Any]:
    model = build(moshiko(), slots, {}, kv_dtype)
    graph = GraphExecutor(model)
    pcm = (np.random.default_rng(0).standard_normal((slots, SAMPLES)) * 0.1).astype(np.float32)
    active = np.ones(slots, np.bool_)
    graph.run(pcm, active.copy(), active)
    fill_rings(model)
    reset = np.zeros(slots, np.bool_)
    for _ in range(3):
        graph.run(pcm, reset, active)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            graph.graph.replay()
            torch.cuda.synchronize()
    kernels = sorted(
        (
            (e.time_range.start, e.time_range.end, e.name)
            for e in prof.events()
            if e.device_type.name == "CUDA" and "memcpy" not in e.name.lower()
        ),
        key=lambda k: k[0],
    )
    per_tick = len(kernels) // REPLAYS
    ticks = [kernels[i * per_tick : (i + 1) * per_tick] for i in range(REPLAYS)]
    # first start to last end (under PDL the last kernel to start need not end last)
    spans = [max(end for _, end, _ in tick) - tick[0][0] for tick in ticks]
    busy = [sum(end - start for start, end, _ in tick) for tick in ticks]
    top = ranked(((short_name(name), end - start) for start, end, name in kernels), TOP)
    # each kernel's advance of the tick's latest end, summed by name over the replays
    advanced: dict[str, float] = {}
    for tick in ticks:
        advances = frontier_advances([(start, end) for start, end, _ in tick])
        for (_, _, name), advance in zip(tick, advances, strict=True):
            family = short_name(name)
            advanced[family] = advanced.get(family, 0.0) + advance
    row: dict[str, Any] = {
        "slots": slots,
        "kernels_per_tick": per_tick,
        "graph_kernel_nodes": graph.kernels_per_tick,
        "span_ms": round(float(np.median(spans)) / 1e3, 3),
        "busy_ms": round(float(np.median(busy)) / 1e3, 3),
        "gaps_ms": round(float(np.median(spans) - np.median(busy)) / 1e3, 3),
        "top": [
            {
                "kernel": name,
                "per_tick": round(count / REPLAYS, 1),
                "us_per_tick": round(total / REPLAYS, 1),
                # a name seen only past the whole ticks (a stray event) advanced nothing
                "advance_us_per_tick": round(advanced.get(name, 0.0) / REPLAYS, 1),
            }
            for name, count, total in top
        ],
    }
    if ops:
        row["launching_ops"] = launching_ops(model, slots)
    del graph, model
    torch.cuda.empty_cache()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", default="1,128")
    parser.add_argument("--kv-dtype", choices=["bf16", "fp8"], default="bf16")
    parser.add_argument(
        "--no-tf32",
        dest="tf32",
        action="store_false",
        help="Mimi's fp32 matmuls without TF32 (the engine runs them in TF32)",
    )
    parser.add_argument("--ops", action="store_true", help="also the torch ops that launch")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.backends.cuda.matmul.allow_tf32 = args.tf32  # the engine's setting (build_model)
    kv_dtype = torch.float8_e4m3fn if args.kv_dtype == "fp8" else None
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": machine(),
        "model": "moshiko 7B shapes, random weights, bf16, temporal rings full",
        "kv_dtype": args.kv_dtype,
        "tf32_matmul": args.tf32,
        "rows": [],
    }
    for slots in [int(s) for s in args.slots.split(",")]:
        row = profile_tick(slots, kv_dtype, args.ops)
        log.info("%s", json.dumps(row))
        result["rows"].append(row)
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
