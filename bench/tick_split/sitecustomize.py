"""Where the host's time in a tick goes: timers around the methods a tick calls, in the
engine process of a real `cadence bench engine` run (a diagnostic: it changes no behaviour,
though each wrapper's own call is in what it times).

    CADENCE_DIAG=OUT_DIR PYTHONPATH=bench/tick_split:$PYTHONPATH python3 -m cadence bench \\
        engine --model moshi --random-weights --device cuda --executor graph --metrics-port 0 \\
        --full-context --slots 1 --seconds 15 --json OUT_DIR/bench.json

Python imports this `sitecustomize` at the start of every process on that path; with
CADENCE_DIAG set it wraps the slot table's snapshot, the gather's take and account, the
scatter's stage and publish, the ring's reads and writes, the graph executor's run (and its
stretch up to the ring), check, the model's prepare and the sync, and times the device's
span from the bell seen to the step's end (CUDA events with timing), then writes
OUT_DIR/diag_<pid>.json every 50 ticks and at exit: medians and p90 per piece over the ticks
after the first 20, in microseconds (bench/results/tick_host_split_*.json).
"""

import atexit
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

WARM_UP_TICKS = 20
DUMP_EVERY = 50

ticks: list[dict[str, float]] = []  # per tick: piece -> us
current: dict[str, float] = {}


def timed(label: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter_ns()
        try:
            return method(*args, **kwargs)
        finally:
            current[label] = current.get(label, 0.0) + (time.perf_counter_ns() - began) / 1e3

    return wrapper


def dump() -> None:
    import numpy as np

    kept = ticks[WARM_UP_TICKS:]
    if not kept:
        return
    labels = sorted({label for tick in kept for label in tick})

    def stat(label: str, q: float) -> float:
        return round(float(np.percentile([t[label] for t in kept if label in t], q)), 1)

    found = {
        "ticks": len(kept),
        "median_us": {label: stat(label, 50) for label in labels},
        "p90_us": {label: stat(label, 90) for label in labels},
    }
    path = os.path.join(os.environ["CADENCE_DIAG"], f"diag_{os.getpid()}.json")
    with open(path, "w") as out:
        json.dump(found, out, indent=1)


def install() -> None:
    sys.path.insert(0, os.getcwd())  # the repository root, where `python3 -m cadence` runs
    from engine import engine, frames, ring, slots

    pieces = [
        (slots.SlotTable, "snapshot", "snapshot"),
        (engine.Engine, "_reset_rows", "reset_rows"),
        (frames.UplinkGather, "take", "take"),
        (ring.SharedRing, "gather_uplink", "take.ring"),
        (frames.UplinkGather, "account", "meanwhile.account"),
        (frames.DownlinkScatter, "stage", "meanwhile.stage"),
        (frames.DownlinkScatter, "publish", "publish"),
        (ring.SharedRing, "scatter_downlink", "publish.ring"),
        (engine.Engine, "_observe", "observe"),
    ]
    for owner, name, label in pieces:
        if hasattr(owner, name):  # earlier code has fewer pieces
            setattr(owner, name, timed(label, getattr(owner, name)))
    try:
        import torch

        from engine.executors import graph
    except ImportError:  # a CPU-only install: the echo model's ticks, no device span
        pass
    else:
        from engine.models.moshi.model import MoshiModel

        graph.check_step_inputs = timed("run.check", graph.check_step_inputs)
        MoshiModel.prepare = timed("run.prepare", MoshiModel.prepare)  # type: ignore[method-assign]
        run, ring_bell = timed("run", graph.GraphExecutor.run), graph.GraphExecutor._ring

        def marked_run(self: Any, *args: Any, **kwargs: Any) -> Any:
            current["_run_began"] = time.perf_counter_ns()
            return run(self, *args, **kwargs)

        def marked_ring(self: Any) -> None:
            # from run's start to the ring: the check, prepare and the copies into the pinned
            # buffers (and no_grad's entry)
            current["run.to_ring"] = (time.perf_counter_ns() - current["_run_began"]) / 1e3
            ring_bell(self)

        graph.GraphExecutor.run = marked_run  # type: ignore[method-assign]
        graph.GraphExecutor._ring = marked_ring  # type: ignore[method-assign]

        class TimedEvent(torch.cuda.Event):
            def synchronize(self) -> None:
                began = time.perf_counter_ns()
                super().synchronize()
                current["run.sync"] = (time.perf_counter_ns() - began) / 1e3

        submit = graph.GraphExecutor._submit

        def timed_submit(self: Any) -> None:
            if not hasattr(self, "_began"):
                self._began = torch.cuda.Event(enable_timing=True)
                self._done = TimedEvent(enable_timing=True)
            self._began.record()  # behind the doorbell's wait: done when the bell is seen
            submit(self)
            self._spanned = True

        graph.GraphExecutor._submit = timed_submit  # type: ignore[method-assign]

    tick = engine.Engine.tick

    def timed_tick(self: Any, number: int) -> Any:
        current.clear()
        current["wake"] = (time.monotonic_ns() - self.clock.release_ns(number)) / 1e3
        report = tick(self, number)
        current["tick"] = report.duration_s * 1e6
        executor = self.executor
        if getattr(executor, "_spanned", False):
            span_ms = executor._began.elapsed_time(executor._done)
            current["gpu_bell_to_done"] = span_ms * 1e3
        ticks.append({label: us for label, us in current.items() if not label.startswith("_")})
        if len(ticks) % DUMP_EVERY == 0:
            dump()
        return report

    engine.Engine.tick = timed_tick  # type: ignore[method-assign]
    atexit.register(dump)


if os.environ.get("CADENCE_DIAG"):
    install()
