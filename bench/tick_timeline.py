"""Where an armed 1-call step goes between the host's ring and its outputs, on one GPU.

    python bench/tick_timeline.py --slots 1 --json OUT.json

Builds Cadence's Moshi (7B shapes, random weights, every ring full) under the graph executor
and runs TICKS steps as the engine does on its clock: `arm` right after a step (the next one
queued behind the doorbell), a wait to the next 80 ms boundary (spun throughout, where the
engine sleeps and spins its last 0.3 ms), then `run` (the inputs written, the bell rung, one
host sync). The last PROFILED steps run under the torch profiler (kernels, copies and each
`run` in one timeline). Per profiled step it reports the host's time in `run` (ring to
outputs in hand), from its start to the doorbell kernel's end (the bell seen) and from the
outputs' landing to its end, and on the device from the bell seen to the first copy in, the
copies in, to the graph's first kernel, the graph's span, to the copies out and their end.
Medians over the profiled steps, and the host's time in `run` for the steps before them,
unprofiled.
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
RUN_MARK = "tick_timeline.run"


def phases(events: list[tuple[float, float, str]]) -> dict[str, float]:
    """One step's device events (start us, end us, name), in order of start -> its phases."""
    bell = next(i for i, (_, _, name) in enumerate(events) if name.startswith(BELL_KERNEL))
    after = events[bell + 1 :]
    copies_in = [e for e in after[:3] if "memcpy" in e[2].lower()]
    kernels = [e for e in after if "memcpy" not in e[2].lower()]
    bell_end = events[bell][1]
    graph_start, graph_end = kernels[0][0], max(end for _, end, _ in kernels)
    # the copies out start after the graph (it may hold copies of its own)
    copies_out = [e for e in after if "memcpy" in e[2].lower() and e[0] >= graph_end]
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
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    profiler = torch.profiler.profile(activities=activities)
    next_tick = time.perf_counter()
    for tick in range(TICKS):
        if tick == TICKS - PROFILED:
            torch.cuda.synchronize()
            profiler.start()
        graph.arm()
        next_tick += TICK_S
        while time.perf_counter() < next_tick:
            pass
        begin = time.perf_counter()
        with torch.profiler.record_function(RUN_MARK):
            graph.run(pcm, reset, active)
        host_us.append((time.perf_counter() - begin) * 1e6)
    graph.close()
    torch.cuda.synchronize()
    profiler.stop()
    events = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in profiler.events()
        if e.device_type.name == "CUDA"
    )
    # the host's `run` in the same timeline: before the bell is seen, after the outputs land
    runs = sorted(
        (e.time_range.start, e.time_range.end) for e in profiler.events() if e.name == RUN_MARK
    )
    # one step per doorbell kernel, each up to the next (the last to the end)
    starts = [i for i, (_, _, name) in enumerate(events) if name.startswith(BELL_KERNEL)]
    steps = [phases(events[a:b]) for a, b in itertools.pairwise([*starts, len(events)])]
    for step, (run_start, run_end), start in zip(steps, runs, starts, strict=True):
        step["run_start_to_bell_seen_us"] = events[start][1] - run_start
        step["outputs_to_run_end_us"] = run_end - (events[start][1] + step["bell_to_outputs_us"])
    keys = steps[0].keys()
    found = {key: round(statistics.median(step[key] for step in steps), 1) for key in keys}
    profiled = host_us[-PROFILED:]
    found["host_run_us"] = round(statistics.median(profiled), 1)
    found["host_less_device_us"] = round(found["host_run_us"] - found["bell_to_outputs_us"], 1)
    # the profiler's own cost on the host's side: the same steps unprofiled
    found["host_run_unprofiled_us"] = round(statistics.median(host_us[2:-PROFILED]), 1)
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": machine(),
        "model": "moshiko 7B shapes, random weights, bf16, temporal rings full",
        "slots": slots,
        "profiled_steps": len(steps),
        "median": found,
        "steps": steps,
        "host_run_us": [round(us, 1) for us in profiled],
    }
    text = json.dumps(result, indent=1)
    print(json.dumps(found))
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
