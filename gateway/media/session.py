"""One call's media between its transport and its engine slot.

The transport (WebRTC or SIP) feeds RTP payloads into `uplink` and pulls paced packets from
`downlink`; the media clock calls `pump` on the engine's grid, which moves the finished frame
into the slot's uplink ring and the engine's output out of its downlink ring.
"""

import time
from dataclasses import dataclass

from engine.ring import DownlinkReader, SharedRing, UplinkWriter
from gateway.engine_client import SlotLease
from gateway.media.downlink import Downlink
from gateway.media.uplink import Uplink


@dataclass
class SessionCounters:
    frames_sent: int = 0  # uplink frames written to the ring
    stale_writes: int = 0  # the slot had moved on to another generation
    # frames written after their tick's release, or never (their pump skipped after a stall):
    # the engine finds no fresh frame at such a tick unless its own tick started late as well
    late_frames: int = 0


class MediaSession:
    def __init__(self, ring: SharedRing, lease: SlotLease, uplink: Uplink, downlink: Downlink):
        self.lease = lease
        self.uplink = uplink
        self.downlink = downlink
        self._writer = UplinkWriter(ring, lease.slot, lease.generation)
        self._reader = DownlinkReader(ring, lease.slot, lease.generation)
        self.counters = SessionCounters()
        self.closed = False

    def pump(self, now_s: float, release_s: float | None) -> None:
        """One pump instant; `release_s` is the release of the tick that takes the frame this
        pump completes, None where the pump completes none."""
        if self.closed:
            return
        self.uplink.pump(now_s)
        if release_s is not None:
            if self._writer.write(self.uplink.take_frame()):
                self.counters.frames_sent += 1
                if time.monotonic() > release_s:
                    self.counters.late_frames += 1
            else:
                self.counters.stale_writes += 1
        self.downlink.accept(self._reader.read())

    @property
    def downlink_skipped(self) -> int:
        return self._reader.skipped
