"""How long a piece of the tick's host work takes against the time since it last ran, on
this machine's CPU: the engine's reason to rehearse its host work just before it runs.

    python3 bench/tick_gap.py --json OUT.json [--rounds 40] [--piece convert|no_grad]

The piece is the scatter's conversion of one call's frame (`convert`, engine/frames.py: clip
a float32 [1, 1920] in place, then scale it into int16), or a call of a function decorated
with torch.no_grad that does nothing else (`no_grad`: what the graph executor's `run` and the
model's `prepare` entered on every tick until 039d4fb). Each round sleeps 70 ms (what a 1-call tick
leaves of the 80 ms period), spins 0.5 ms, runs the piece once (the rehearsal), spins GAP
us, and times the piece once more; medians and p90 in us per gap (GAPS), and the piece back
to back (`hot`: the median of 2,000 runs in a row).
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


def convert() -> Callable[[], None]:
    """np.clip in place + np.multiply into int16, float32 [1, 1920]."""
    pcm = np.zeros((1, SAMPLES), np.float32)
    i16 = np.zeros((1, SAMPLES), np.int16)

    def run() -> None:
        np.clip(pcm, -1.0, 32767.0 / 32768.0, out=pcm)
        np.multiply(pcm, 32768.0, out=i16, casting="unsafe")

    return run


def no_grad() -> Callable[[], None]:
    """A call of a function that does nothing, decorated with torch.no_grad."""
    import torch

    @torch.no_grad()
    def run() -> None:
        pass

    return run


PIECES: dict[str, Callable[[], Callable[[], None]]] = {"convert": convert, "no_grad": no_grad}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--piece", choices=sorted(PIECES), default="convert")
    args = parser.parse_args()
    work = PIECES[args.piece]()

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
