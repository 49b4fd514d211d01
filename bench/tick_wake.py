"""How late the engine's wait for a tick's release returns, sleeping all the way or spinning
the last stretch (engine/clock.py's sleep_until), on this machine's CPU.

    python bench/tick_wake.py --json OUT.json [--waits 200]

Each wait is for an instant 20 ms ahead (as the engine waits ~72 ms between 1-call ticks);
the lateness is the monotonic clock when the wait returns minus that instant. Every tick's
duration counts from its release, so this lateness is part of every tick.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cadence.bench import versions
from engine.clock import SPIN_NS, sleep_until

AHEAD_NS = 20_000_000


def lateness_us(spin_ns: int, waits: int) -> dict[str, float]:
    late = []
    for _ in range(waits):
        instant = time.monotonic_ns() + AHEAD_NS
        sleep_until(instant, spin_ns)
        late.append((time.monotonic_ns() - instant) / 1e3)
    late.sort()
    return {
        "median_us": round(statistics.median(late), 1),
        "p95_us": round(late[int(0.95 * (waits - 1))], 1),
        "max_us": round(late[-1], 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waits", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": versions(),
        "sleep": lateness_us(0, args.waits),
        f"spin_last_{SPIN_NS // 1000}_us": lateness_us(SPIN_NS, args.waits),
    }
    print(json.dumps(result), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
