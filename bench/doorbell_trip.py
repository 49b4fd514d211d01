"""How long the host waits, around a step armed behind the doorbell, for nothing but the trip:
the ring's way to the GPU and the done's way back, on one GPU.

    python bench/doorbell_trip.py --json OUT.json

No model: the step is one tiny kernel. Each round queues kernels/doorbell.py's wait, then the
tiny kernel, then the done, waits `--idle-ms` (spun, as the engine's last stretch), rings and
times the host from the ring until it sees the done, in three ways of seeing it:

- `event`: a CUDA event recorded after the kernel, and `Event.synchronize()` (what the graph
  executor's `run` does);
- `event_query`: the same event, polled with `Event.query()` in a loop;
- `flag`: a kernel after the step stores the round's number into pinned host memory, and
  the host spins on that word.

Also `ack`: no step, the wait kernel's successor stores the number at once, the host spinning
on it: the ring's trip there and back. Medians and p99 over ROUNDS rounds, in microseconds.
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

import torch
import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,import-untyped,unused-ignore]
from gpu_timing import machine

from kernels.doorbell import wait_for_bell

ROUNDS = 60


@triton.jit(do_not_specialize=["value"])  # type: ignore[untyped-decorator,unused-ignore]
def _signal_kernel(flag_ptr, value):  # type: ignore[no-untyped-def,unused-ignore]
    tl.store(flag_ptr, value)


def _spin_until(idle_s: float) -> None:
    until = time.perf_counter() + idle_s
    while time.perf_counter() < until:
        pass


def rounds(mode: str, idle_s: float) -> list[float]:
    bell = torch.zeros(1, dtype=torch.int64).pin_memory()
    flag = torch.zeros(1, dtype=torch.int64).pin_memory()
    scratch = torch.zeros(1, dtype=torch.int64, device="cuda")
    _signal_kernel[(1,)](scratch, 0)  # loaded before any wait is queued (kernels/doorbell.py)
    wait_for_bell(bell, 0)
    torch.cuda.synchronize()
    bell_view, flag_view = bell.numpy(), flag.numpy()
    done = torch.cuda.Event()  # type: ignore[no-untyped-call]
    trips = []
    for number in range(1, ROUNDS + 1):
        wait_for_bell(bell, number)
        if mode != "ack":
            _signal_kernel[(1,)](scratch, number)  # the step
        if mode in ("flag", "ack"):
            _signal_kernel[(1,)](flag, number)
        done.record()
        _spin_until(idle_s)
        begin = time.perf_counter()
        bell_view[0] = number
        if mode == "event":
            done.synchronize()
        elif mode == "event_query":
            while not done.query():
                pass
        else:
            while flag_view[0] != number:
                pass
        trips.append((time.perf_counter() - begin) * 1e6)
        done.synchronize()
    return trips[2:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-ms", type=float, default=74.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result: dict[str, Any] = {"command": " ".join(sys.argv), "machine": machine(), "modes": {}}
    for mode in ("event", "event_query", "flag", "ack", "event"):
        trips = sorted(rounds(mode, args.idle_ms / 1e3))
        key = mode if mode not in result["modes"] else mode + "_again"
        result["modes"][key] = {
            "median_us": round(statistics.median(trips), 1),
            "p99_us": round(trips[int(0.99 * (len(trips) - 1))], 1),
            "max_us": round(trips[-1], 1),
        }
        print(key, result["modes"][key], flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
