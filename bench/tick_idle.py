"""Why a 1-call tick takes longer on the 80 ms clock than back to back: the graph executor's
step timed after different idle gaps, on one GPU.

    python bench/tick_idle.py --json OUT.json [--steps 40] [--modes sleep,presubmit,...]

Cadence's Moshi at 1 slot (bf16, random weights, every ring full), its whole step one CUDA
graph (engine/executors/graph.py). Each mode runs `steps` steps and reports the host's wall
time of a step (uplink copy in, replay, downlink copy out, the one sync: what the engine's
tick spends in its executor) and the GPU's time between CUDA events recorded around it:

- `back_to_back`: no gap between steps;
- `sleep`: the host sleeps (time.sleep) until the next 80 ms instant, as the engine's clock;
- `spin`: the host spins until that instant instead (its core never idles);
- `sleep_wake`: sleeps, but from `--wake-ms` before the instant queues small kernels until
  it, so the GPU is busy again when the step arrives (bench/results/tick_idle.json was taken
  by a first version that queued ~1 ms of them 3 ms before, leaving the GPU ~2 ms idle, so
  its `sleep_wake` does not show this; tick_idle_wake.json does). Those kernels add 1 to a
  4 MB tensor: a few multiprocessors, in L2;
- `sleep_wake_wide`: the same with a 16 MB tensor, every multiprocessor busy, still in L2;
- `sleep_wake_hbm`: the same with a 1 GB tensor, every multiprocessor and HBM busy;
- `presubmit`: the step is armed before the sleep (GraphExecutor.arm: queued behind a
  doorbell, kernels/doorbell.py) and rung at the instant, as the engine runs it. Where this
  is as fast as `back_to_back`, the time lost after a sleep is the host's submitting ~1,000
  kernels of the graph while the GPU already runs them. Wall time only (an event recorded
  after arming runs after the step). bench/results/tick_idle_presubmit.json was taken by a
  first version that queued the executor's copies and replay itself, behind its own copy of
  the doorbell, with CUDA events around them (GPU 6.98 ms, back to back 6.92 / 7.04).

Where `sleep` is slower than `back_to_back` in GPU time, the GPU itself is slower after
idling; where only in wall time, the host is.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
from engine_gpu import build, fill_rings  # bench/, this folder
from gpu_timing import machine  # bench/, this folder

from engine.executors.graph import GraphExecutor
from engine.models.moshi.config import moshiko

PERIOD_S = 0.080
MODES = (
    "back_to_back",
    "sleep",
    "spin",
    "sleep_wake",
    "sleep_wake_wide",
    "sleep_wake_hbm",
    "presubmit",
    "back_to_back",
)
WAKE_FLOATS = {"sleep_wake_wide": 1 << 22, "sleep_wake_hbm": 1 << 28}
SAMPLES = 1920


def until(instant: float, spin: bool) -> None:
    """Wait for perf_counter() to reach `instant`, sleeping or spinning."""
    while (left := instant - time.perf_counter()) > 0:
        if not spin:
            time.sleep(left)


def run_mode(graph: GraphExecutor, mode: str, steps: int, wake_s: float) -> dict[str, Any]:
    pcm = (np.random.default_rng(0).standard_normal((1, SAMPLES)) * 0.1).astype(np.float32)
    active, reset = np.ones(1, np.bool_), np.zeros(1, np.bool_)
    wake = torch.zeros(WAKE_FLOATS.get(mode, 1 << 20), device="cuda")
    wall, gpu = [], []
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call,unused-ignore]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call,unused-ignore]
    instant = time.perf_counter() + PERIOD_S
    for _ in range(steps):
        if mode.startswith("sleep_wake"):
            until(instant - wake_s, spin=False)
            while time.perf_counter() < instant:  # small kernels queued up to the instant
                wake.add_(1.0)
        if mode == "presubmit":
            graph.arm()  # an event recorded now would run after the step: no GPU time
        if mode != "back_to_back":
            until(instant, spin=mode == "spin")
        t0 = time.perf_counter()
        if mode != "presubmit":
            start.record()
        graph.run(pcm, reset, active)
        if mode != "presubmit":
            end.record()
        wall.append((time.perf_counter() - t0) * 1e3)
        if mode != "presubmit":
            end.synchronize()
            gpu.append(start.elapsed_time(end))
        instant += PERIOD_S
    return {
        "wall_median_ms": round(statistics.median(wall), 3),
        "wall_p99_ms": round(sorted(wall)[int(0.99 * (len(wall) - 1))], 3),
        "gpu_median_ms": round(statistics.median(gpu), 3) if gpu else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--wake-ms", type=float, default=3.0)
    parser.add_argument("--modes", default=",".join(MODES), help="in this order, repeats allowed")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True  # the engine's setting (build_model)
    with torch.no_grad():
        model = build(moshiko(), 1, {})
        graph = GraphExecutor(model)
        fill_rings(model)
        result: dict[str, Any] = {
            "command": " ".join(sys.argv),
            "machine": machine(),
            "model": "moshiko 7B shapes, random weights, bf16, 1 slot, rings full",
            "modes": {},
        }
        for mode in args.modes.split(","):
            key = mode if mode not in result["modes"] else mode + "_again"
            result["modes"][key] = run_mode(graph, mode, args.steps, args.wake_ms / 1e3)
            print(key, result["modes"][key], flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
