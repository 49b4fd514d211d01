"""The asyncio driver of the media clock: wake at each pump instant, pump every call."""

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
        if late > grid.step_s:  # the loop stalled; resume at the current instant
            log.warning("media clock stalled %.1f ms", late * 1e3)
            index = grid.index_at(now)
        try:
            calls.pump(index, now)
        except Exception:
            log.exception("media pump failed")
        index += 1
