"""The engine's host work per tick (gather the uplink, scatter the downlink), back to back
and after a sleep as long as the 80 ms clock leaves, on this machine's CPU.

    python bench/tick_host.py --slots 1,32 --json OUT.json [--ticks 60]

A real Engine over a real shared-memory ring, with the echo model (its step is a copy: the
host work around a model's step is what is timed). Every slot holds a call whose writer
puts one frame before each tick. Reported per mode: the mean gather, step and scatter of
`--ticks` ticks, from the engine's own phase histograms. `after_sleep` sleeps 72 ms before
each tick, as the engine does between ticks at one call; `back_to_back` does not.
"""

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from cadence.bench import versions
from engine.clock import TickClock
from engine.engine import Engine
from engine.executors import build_executor
from engine.metrics import PHASES, EngineMetrics
from engine.models.echo import EchoModel
from engine.ring import RingSpec, SharedRing, UplinkWriter
from engine.slots import SlotTable

SAMPLES = 1920
PERIOD_NS = 80_000_000
IDLE_S = 0.072  # what an 8 ms tick leaves of the 80 ms period
WARMUP_TICKS = 20


def phase_means_us(slots: int, ticks: int, idle_s: float) -> dict[str, float]:
    spec = RingSpec(slots, SAMPLES, 24000, 0, 4, PERIOD_NS)
    ring = SharedRing.create(f"cadence-tick-host-{time.monotonic_ns()}", spec)
    try:
        table = SlotTable(slots)
        metrics = EngineMetrics()
        engine = Engine(build_executor("eager", EchoModel(slots)), ring, table, metrics, PERIOD_NS)
        engine.clock = TickClock(time.monotonic_ns(), PERIOD_NS)
        writers = []
        for i in range(slots):
            admission = table.open(f"call-{i}", 0)
            engine.opened(f"call-{i}", admission)
            writers.append(UplinkWriter(ring, admission.slot, admission.generation))
        frame = np.zeros(SAMPLES, np.int16)
        for tick in range(WARMUP_TICKS + ticks):
            for writer in writers:
                writer.write(frame)
            if idle_s:
                time.sleep(idle_s)
            engine.tick(tick)
        # the last `ticks` of each phase: the warm-up's left out
        return {
            phase: round(1e6 * sum(list(spans)[-ticks:]) / ticks, 1)
            for phase, spans in engine.recent_phases_s.items()
        }
    finally:
        ring.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", default="1,32")
    parser.add_argument("--ticks", type=int, default=60)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": versions(),
        "phases": list(PHASES),
        "rows": [],
    }
    for slots in [int(s) for s in args.slots.split(",")]:
        row: dict[str, Any] = {"slots": slots}
        for mode, idle_s in (("back_to_back", 0.0), ("after_sleep", IDLE_S)):
            row[mode + "_us"] = phase_means_us(slots, args.ticks, idle_s)
        result["rows"].append(row)
        print(row, flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
