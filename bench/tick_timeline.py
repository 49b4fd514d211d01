"""Where an armed 1-call step goes between the host's ring and its outputs, on one GPU.

    python bench/tick_timeline.py --slots 1 --json OUT.json

Builds Cadence's Moshi (7B shapes, random weights, every ring full) under the graph executor
and runs TICKS steps as the engine does on its clock: `arm` right after a step (the next one
queued behind the doorbell), a sleep to the next 80 ms boundary, then `run` (the inputs
written, the bell rung, one host sync). The last PROFILED steps run under the torch profiler
(CUDA activities: kernels and copies). Per profiled step it reports the host's time in `run`
(ring to outputs in hand) and, on the device, from the doorbell kernel's end (the bell seen)
to the first copy in, the copies in, to the graph's first kernel, the graph's span, to the
copies out and their end; the host's time less the device's is the ring's trip to the GPU
and the sync's return. Medians over the profiled steps.
"""

import argparse
import itertools
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
from engine_gpu import SAMPLES, build, fill_rings  # bench/, this folder
from gpu_timing import machine

from engine.executors.graph import GraphExecutor
from engine.models.moshi.config import moshiko

log = logging.getLogger("tick_timeline")
TICK_S = 0.08
TICKS = 30
PROFILED = 8
BELL_KERNEL = "_wait_kernel"  # kernels/doorbell.py's


def phases(events: list[tuple[float, float, str]]) -> dict[str, float]:
    """One step's device events (start us, end us, name), in order of start -> its phases."""
    bell = next(i for i, (_, _, name) in enumerate(events) if name.startswith(BELL_KERNEL))
    after = events[bell + 1 :]
    copies_in = [e for e in after[:3] if "memcpy" in e[2].lower()]
    kernels = [e for e in after if "memcpy" not in e[2].lower()]
    copies_out = [e for e in after if "memcpy" in e[2].lower()][len(copies_in) :]
    bell_end = events[bell][1]
    graph_start, graph_end = kernels[0][0], max(end for _, end, _ in kernels)
    return {
        "bell_to_copy_in_us": copies_in[0][0] - bell_end if copies_in else 0.0,
        "copies_in_us": (copies_in[-1][1] - copies_in[0][0]) if copies_in else 0.0,
        "copy_in_to_graph_us": graph_start - (copies_in[-1][1] if copies_in else bell_end),
        "graph_span_us": graph_end - graph_start,
        "graph_to_copy_out_us": copies_out[0][0] - graph_end,
        "copies_out_us": copies_out[-1][1] - copies_out[0][0],
        "bell_to_outputs_us": copies_out[-1][1] - bell_end,
        "kernels": len(kernels),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    slots = args.slots
    model = build(moshiko(), slots, {})
    graph = GraphExecutor(model)
    pcm = (np.random.default_rng(0).standard_normal((slots, SAMPLES)) * 0.1).astype(np.float32)
    active = np.ones(slots, np.bool_)
    graph.run(pcm, active.copy(), active)
    fill_rings(model)
    reset = np.zeros(slots, np.bool_)
    host_us: list[float] = []
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
    next_tick = time.perf_counter()
    for tick in range(TICKS):
        if tick == TICKS - PROFILED:
            torch.cuda.synchronize()
            profiler.start()
        graph.arm()
        next_tick += TICK_S
        while time.perf_counter() < next_tick:  # spun, as the engine's last stretch
            pass
        begin = time.perf_counter()
        graph.run(pcm, reset, active)
        if tick >= TICKS - PROFILED:
            host_us.append((time.perf_counter() - begin) * 1e6)
    graph.close()
    torch.cuda.synchronize()
    profiler.stop()
    events = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in profiler.events()
        if e.device_type.name == "CUDA"
    )
    # one step per doorbell kernel, each up to the next (the last to the end)
    starts = [i for i, (_, _, name) in enumerate(events) if name.startswith(BELL_KERNEL)]
    steps = [phases(events[a:b]) for a, b in itertools.pairwise([*starts, len(events)])]
    keys = steps[0].keys()
    found = {key: round(statistics.median(step[key] for step in steps), 1) for key in keys}
    found["host_run_us"] = round(statistics.median(host_us), 1)
    found["host_less_device_us"] = round(found["host_run_us"] - found["bell_to_outputs_us"], 1)
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": machine(),
        "model": "moshiko 7B shapes, random weights, bf16, temporal rings full",
        "slots": slots,
        "profiled_steps": len(steps),
        "median": found,
        "steps": steps,
        "host_run_us": [round(us, 1) for us in host_us],
    }
    text = json.dumps(result, indent=1)
    print(json.dumps(found))
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
