"""The 1-call step back to back with the token delay rings on TokenDelays' torch ops and on
kernels/token_delays.py's two launches, alternated in one process, on one GPU.

    python3 bench/engine_delays.py --json OUT.json [--slots 1] [--steps 100]

Builds Cadence's Moshi once (7B shapes, random weights, bf16, every temporal ring full),
captures the graph executor twice on it (`TokenDelays.fused` False, then None: the kernels
on CUDA), and times ROUNDS rounds of `--steps` steps of each in turn (the host's `run`, its
one sync included), with the kernels per tick of each graph. The first step of each round
starts every row over (as a call's join does), the rest do not.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from engine_gpu import SAMPLES, build, fill_rings  # bench/, this folder
from gpu_timing import machine

from engine.executors.graph import GraphExecutor
from engine.models.moshi.config import moshiko

ROUNDS = 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    slots = args.slots
    model = build(moshiko(), slots, {})
    executors = {}
    for name, fused in (("torch_ops", False), ("kernel", None)):
        model.lm.delays.fused = fused
        executors[name] = GraphExecutor(model)
    fill_rings(model)
    pcm = (np.random.default_rng(0).standard_normal((slots, SAMPLES)) * 0.1).astype(np.float32)
    active = np.ones(slots, np.bool_)
    keep = np.zeros(slots, np.bool_)
    times: dict[str, list[float]] = {name: [] for name in executors}
    for _ in range(ROUNDS):
        for name, graph in executors.items():
            graph.run(pcm, active.copy(), active)
            for _ in range(args.steps):
                began = time.perf_counter()
                graph.run(pcm, keep, active)
                times[name].append((time.perf_counter() - began) * 1e3)
    rows: dict[str, Any] = {}
    for name, graph in executors.items():
        ms = sorted(times[name])
        rows[name] = {
            "median_ms": round(statistics.median(ms), 4),
            "p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 4),
            "kernels_per_tick": graph.kernels_per_tick,
        }
        print(name, rows[name])
    result = {
        "command": " ".join(["python3", *sys.argv]),
        "machine": machine(),
        "model": "moshiko 7B shapes, random weights, bf16, temporal rings full, greedy",
        "slots": slots,
        "steps_per_round": args.steps,
        "rounds": ROUNDS,
        "rows": rows,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
