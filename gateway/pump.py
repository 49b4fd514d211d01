"""The asyncio driver of the media clock: wake at each pump instant, pump every call.

After a stall of the event loop (a burst of call setups, say), the missed instants of the
last tick are pumped at once, so the jitter buffers drain on schedule and no delay stays
behind; a longer stall resumes at the current instant.
"""

import asyncio
import logging
import time

from gateway.calls import CallRegistry

log = logging.getLogger(__name__)


async def run_media_clock(calls: CallRegistry) -> None:
    grid, lag = calls.grid, calls.metrics.loop_lag
    index = grid.index_at(time.monotonic()) + 1
    while True:
        due = grid.instant(index)
        now = time.monotonic()
        if due > now:
            await asyncio.sleep(due - now)
            now = time.monotonic()
        late = now - due
        lag.observe(max(late, 0.0))
        current = grid.index_at(now)
        if current - index >= grid.per_tick:
            log.warning("media clock stalled %.1f ms", late * 1e3)
            calls.skip(index, current)
            index = current
        while index <= current:
            try:
                calls.pump(index, now)
            except Exception:
                log.exception("media pump failed")
            index += 1
