"""CPU per WebRTC call: a real `cadence serve` (echo model) and N real aiortc callers.

    python bench/gateway_cpu.py --calls 1,10 --seconds 8 --json bench/results/gateway_cpu.json

For each N it starts `cadence serve`, places N calls at once (each sends band-limited noise as
pre-encoded Opus and records what comes back), and reads the engine's and the gateway's CPU
time from /proc over the calls. Reported: percent of one core per process and per call, the
callers' own CPU (the test client, same process for all N), and each call's echo quality
(median windowed correlation) and server-side delay, with the engine's deadline counters.
"""

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.ice import restrict_host_candidates
from tests.support.caller import CallResult, band_limited_noise, measure_delay, place_call
from tests.support.server import children_of, start_serve, stop_serve


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def role_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[3].decode()


def run(calls: int, seconds: float, log_dir: Path) -> dict[str, Any]:
    served = start_serve(log_dir / f"serve-{calls}.log", f"--slots={max(calls, 1)}")
    try:
        roles = {role_of(pid): pid for pid in children_of(served.process.pid)}
        signal = band_limited_noise(seconds + 1.0)
        before = {role: cpu_seconds(pid) for role, pid in roles.items()}
        client_before = time.process_time()
        t0 = time.monotonic()

        async def together() -> list[CallResult]:
            return await asyncio.gather(
                *(place_call(served.url, signal, seconds) for _ in range(calls))
            )

        results = asyncio.run(together())
        wall = time.monotonic() - t0
        cpu = {role: (cpu_seconds(pid) - before[role]) / wall * 100 for role, pid in roles.items()}
        client = (time.process_time() - client_before) / wall * 100
        quality = [measure_delay(r, signal) for r in results]
        engines: list[dict[str, int]] = [r.record["engine"] for r in results]  # type: ignore[misc]
        return {
            "calls": calls,
            "seconds": seconds,
            "percent_of_a_core": {k: round(v, 1) for k, v in cpu.items()},
            "gateway_percent_per_call": round(cpu["gateway"] / calls, 2),
            "callers_percent_per_call": round(client / calls, 2),
            "echo_correlation_median": round(statistics.median(q[0] for q in quality), 3),
            "server_delay_ms_median": round(statistics.median(q[1] for q in quality) * 1e3, 1),
            "deadline_misses": sum(e["misses"] for e in engines),
            "underruns": sum(e["underruns"] for e in engines),
        }
    finally:
        stop_serve(served)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", default="1,10")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    restrict_host_candidates(["127.0.0.1"])
    result: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "runs": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(c) for c in args.calls.split(",")]:
            row = run(n, args.seconds, Path(tmp))
            result["runs"].append(row)
            sys.stdout.write(json.dumps(row) + "\n")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
