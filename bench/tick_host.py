"""The engine's host work per tick (gather the uplink, scatter the downlink), back to back
and after a sleep as long as the 80 ms clock leaves, on this machine's CPU.

    python bench/tick_host.py --slots 1,32 --json OUT.json [--ticks 60]

A real Engine over a real shared-memory ring, with the echo model (its step is a copy: the
host work around a model's step is what is timed). Every slot holds a call whose writer
puts one frame before each tick. Reported per mode: the mean gather, step and scatter of
`--ticks` ticks, from the engine's own phase histograms. The modes (MODES, `--modes`):

    back_to_back  no wait between ticks
    after_sleep   time.sleep(72 ms) before each tick, what an 8 ms tick leaves of 80
    spun          on the 80 ms clock, sleep_until the release (its last 0.3 ms spun): the
                  engine's wait before it rehearsed
    rehearsed     on the 80 ms clock, the engine's own wait (Engine.wait_for_release: the
                  gather and scatter rehearsed at its lead before the release, then spun to
                  it)
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
from engine.clock import TickClock, sleep_until
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
MODES = ("back_to_back", "after_sleep", "spun", "rehearsed")


def phase_means_us(slots: int, ticks: int, mode: str) -> dict[str, float]:
    spec = RingSpec(slots, SAMPLES, 24000, 0, 4, PERIOD_NS)
    ring = SharedRing.create(f"cadence-tick-host-{time.monotonic_ns()}", spec)
    try:
        table = SlotTable(slots)
        metrics = EngineMetrics()
        engine = Engine(build_executor("eager", EchoModel(slots)), ring, table, metrics, PERIOD_NS)
        engine.clock = TickClock(time.monotonic_ns() + PERIOD_NS, PERIOD_NS)
        writers = []
        for i in range(slots):
            admission = table.open(f"call-{i}", 0)
            engine.opened(f"call-{i}", admission)
            writers.append(UplinkWriter(ring, admission.slot, admission.generation))
        frame = np.zeros(SAMPLES, np.int16)
        for tick in range(WARMUP_TICKS + ticks):
            for writer in writers:
                writer.write(frame)
            if mode == "after_sleep":
                time.sleep(IDLE_S)
            elif mode == "spun":
                sleep_until(engine.clock.release_ns(tick))
            elif mode == "rehearsed":
                engine.wait_for_release(tick)
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
    parser.add_argument("--modes", default=",".join(MODES))
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
        for mode in args.modes.split(","):
            if mode not in MODES:
                parser.error(f"unknown mode {mode!r}: one of {', '.join(MODES)}")
            row[mode + "_us"] = phase_means_us(slots, args.ticks, mode)
        result["rows"].append(row)
        print(row, flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
