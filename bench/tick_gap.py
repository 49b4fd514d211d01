"""How long a piece of the tick's host work takes against the time since it last ran, on
this machine's CPU: the engine's reason to rehearse its host work just before it runs.

    python3 bench/tick_gap.py --json OUT.json [--rounds 40] [--piece convert|no_grad|stage]
        [--slots 1]

The piece is the scatter's conversion of the calls' frames (`convert`, engine/frames.py: clip
a float32 [slots, 1920] in place, then scale it into int16), a call of a function decorated
with torch.no_grad that does nothing else (`no_grad`: what the graph executor's `run` and the
model's `prepare` entered on every tick until 039d4fb), or the graph executor's copy of the
uplink frames, float32 [slots, 1920], into its staging (`stage`: what its `run` did at every
tick before the engine's gather wrote into the staging itself). Each round sleeps 70 ms
(what a 1-call tick leaves of the 80 ms period), spins 0.5 ms, runs the piece once (the
rehearsal), spins GAP us, and times the piece once more; medians and p90 in us per gap
(GAPS), and the piece back to back (`hot`: the median of 2,000 runs in a row).
"""

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

GAPS_US = (0, 20, 50, 100, 200, 500, 1000, 2000, 6000)
IDLE_S = 0.07
SAMPLES = 1920


def convert(slots: int) -> Callable[[], None]:
    """np.clip in place + np.multiply into int16, float32 [slots, 1920]."""
    pcm = np.zeros((slots, SAMPLES), np.float32)
    i16 = np.zeros((slots, SAMPLES), np.int16)

    def run() -> None:
        np.clip(pcm, -1.0, 32767.0 / 32768.0, out=pcm)
        np.multiply(pcm, 32768.0, out=i16, casting="unsafe")

    return run


def stage(slots: int) -> Callable[[], None]:
    """One float32 [slots, 1920] array assigned into another (random audio)."""
    source = np.random.default_rng(0).standard_normal((slots, SAMPLES)).astype(np.float32)
    staging = np.zeros_like(source)

    def run() -> None:
        staging[:] = source

    return run


def no_grad(slots: int) -> Callable[[], None]:
    """A call of a function that does nothing, decorated with torch.no_grad (`slots`
    unused)."""
    import torch

    @torch.no_grad()
    def run() -> None:
        pass

    return run


PIECES: dict[str, Callable[[int], Callable[[], None]]] = {
    "convert": convert,
    "no_grad": no_grad,
    "stage": stage,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--piece", choices=sorted(PIECES), default="convert")
    parser.add_argument("--slots", type=int, default=1, help="calls whose frames the piece takes")
    args = parser.parse_args()
    work = PIECES[args.piece](args.slots)

    def piece() -> int:
        began = time.perf_counter_ns()
        work()
        return time.perf_counter_ns() - began

    def spin(us: float) -> None:
        until = time.perf_counter() + us / 1e6
        while time.perf_counter() < until:
            pass

    rows: list[dict[str, Any]] = []
    for gap in GAPS_US:
        took = []
        for _ in range(args.rounds):
            time.sleep(IDLE_S)
            spin(500)
            piece()
            spin(gap)
            took.append(piece() / 1e3)
        row = {
            "gap_us": gap,
            "median_us": round(statistics.median(took), 1),
            "p90_us": round(float(np.percentile(took, 90)), 1),
        }
        print(row)
        rows.append(row)
    hot = round(statistics.median(piece() / 1e3 for _ in range(2000)), 2)
    result = {
        "command": " ".join(["python3", *sys.argv]),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "processor": platform.processor(),
        },
        "piece": args.piece,
        "slots": args.slots,
        "rounds": args.rounds,
        "hot_us": hot,
        "rows": rows,
    }
    print({"hot_us": hot})
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
