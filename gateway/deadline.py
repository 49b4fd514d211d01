"""One call's deadline statistics, for its live record and its end-of-call summary.

Fleet metrics average callers together; this block says how one caller fared: how many of
its frames the engine served, how many of its deadlines came late or not at all (a tick the
engine skipped while the call was live is a deadline of the call, and a miss, but serves no
frame: the miss ratio is over ticks run plus ticks skipped, so it never exceeds 1), how often
its uplink was missing when the tick ran, how much audio the jitter buffer made up, and how
much delay the server adds to its voice. The delay is an estimate from the parts of the path,
each its own term, so an operator sees which one grew:

    jitter buffer   played-out delay of its recent packets (median), else the buffer's target
    framing         a frame's first sample waits one tick period to fill the frame, then the
                    pump lead before the tick that takes it
    engine          one tick period: the step publishes by the tick's deadline
    send queue      audio waiting for its 20 ms packet instant, now

What the model itself delays (the echo model one tick, Moshi its acoustic delay) is the
model's, not the server's, and is left out.
"""

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

# the engine's per-slot counters a call record shows (engine/ring.py's control block)
ENGINE_COUNTERS = ("ticks", "skipped", "misses", "underruns", "overruns")


@dataclass(frozen=True)
class PathTiming:
    tick_s: float  # the engine's tick period
    pump_lead_s: float  # the frame-completing pump runs this long before the tick


def deadline_record(
    engine: dict[str, int],
    jitter_delays_s: NDArray[np.float64],
    jitter_target_s: float,
    concealed: int,
    send_queue_s: float,
    timing: PathTiming,
) -> dict[str, Any]:
    """The `deadline` block of a call record; engine counters are empty once the slot is gone."""
    ticks = engine.get("ticks", 0)
    skipped = engine.get("skipped", 0)
    missed = engine.get("misses", 0)
    underruns = engine.get("underruns", 0)
    jitter_s = _percentile(jitter_delays_s, 50)
    latency = {
        "jitter_buffer_s": round(jitter_target_s if jitter_s is None else jitter_s, 4),
        "framing_s": round(timing.tick_s + timing.pump_lead_s, 4),
        "engine_s": round(timing.tick_s, 4),
        "send_queue_s": round(send_queue_s, 4),
    }
    latency["total_s"] = round(sum(latency.values()), 4)
    return {
        "ticks": ticks,
        "skipped": skipped,
        "missed": missed,
        "miss_ratio": _ratio(missed, ticks + skipped),  # every deadline the call had
        "underruns": underruns,
        "underrun_ratio": _ratio(underruns, ticks),
        "concealed": concealed,
        "jitter_delay_p50_s": jitter_s,
        "jitter_delay_p95_s": _percentile(jitter_delays_s, 95),
        "jitter_delay_p99_s": _percentile(jitter_delays_s, 99),
        "server_latency_estimate": latency,
    }


def _ratio(part: int, whole: int) -> float | None:
    return None if whole == 0 else round(part / whole, 6)


def _percentile(values: NDArray[np.float64], q: float) -> float | None:
    return None if values.size == 0 else round(float(np.percentile(values, q)), 4)
