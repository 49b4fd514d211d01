"""Mimi encode / decode on one GPU, eager against fused (kernels/mimi_*.py), per slot count.

    python3 bench/mimi_gpu.py --slots 1,128,300 --json bench/results/mimi_gpu.json

For each slot count it builds Moshi's Mimi (fp32, seeded random weights) twice on the same
weights, `fused=False` (the eager path, as it was before the kernels) and `fused=True`, and
measures `encode` (pcm [slots, 1920] -> codes [slots, 8]) and `decode` (codes -> pcm) exactly
as bench/engine_stages.py's mimi_encode / mimi_decode rows do: each stage captured as its own
CUDA graph, median and p99 ms of 50 replays after 5, and the kernels one eager run launches
(torch profiler). Also recorded: the first fused call's time (Triton's JIT compiles there,
before any capture) and, at the largest slot count, the fused stages' ten costliest kernels.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
from engine_stages import count_kernels, time_graph

from engine.models.moshi.config import moshiko
from engine.models.moshi.mimi.codec import MimiCodec
from engine.models.moshi.model import randomize

log = logging.getLogger("mimi_gpu")


def top_kernels(stage: Callable[[], object], count: int = 10) -> list[dict[str, Any]]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        stage()
        torch.cuda.synchronize()
    totals: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type.name == "CUDA":
            entry = totals.setdefault(event.name[:90], [0.0, 0])
            entry[0] += event.device_time
            entry[1] += 1
    ranked = sorted(totals.items(), key=lambda item: -item[1][0])[:count]
    return [{"kernel": name, "us": round(us, 1), "launches": n} for name, (us, n) in ranked]


def measure(slots: int, profile: bool) -> dict[str, Any]:
    config = moshiko().mimi
    device = torch.device("cuda")
    eager = MimiCodec(config, slots, device, fused=False)
    randomize(eager, 2)
    fused = MimiCodec(config, slots, device, fused=True)
    fused.load_state_dict(eager.state_dict())
    pcm = torch.randn(slots, config.frame_samples, device=device) * 0.1
    codes = torch.randint(0, config.bins, (slots, config.codebooks), device=device)
    row: dict[str, Any] = {"slots": slots}
    with torch.no_grad():
        begin = time.perf_counter()
        fused.decode(fused.encode(pcm))
        torch.cuda.synchronize()
        row["fused_first_call_s"] = round(time.perf_counter() - begin, 2)
        for path, codec in (("eager", eager), ("fused", fused)):
            plan: dict[str, Callable[[], object]] = {
                "encode": lambda codec=codec: codec.encode(pcm),  # type: ignore[misc]
                "decode": lambda codec=codec: codec.decode(codes),  # type: ignore[misc]
            }
            for stage, run in plan.items():
                key = f"{path}_{stage}"
                row[key] = time_graph(run) | {"kernels": count_kernels(run)}
                log.info("%d slots %s %s", slots, key, row[key])
                if profile and path == "fused":
                    row[f"{key}_top"] = top_kernels(run)
    for stage in ("encode", "decode"):
        eager_ms = row[f"eager_{stage}"]["median_ms"]
        row[f"{stage}_speedup"] = round(eager_ms / row[f"fused_{stage}"]["median_ms"], 2)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", default="1,128,300")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    counts = [int(s) for s in args.slots.split(",")]
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": {
            "gpu": torch.cuda.get_device_name(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "cuda": torch.version.cuda,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        },
        "model": "moshiko Mimi, fp32, random weights (seed 2), each stage its own CUDA graph",
        "rows": [],
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
