"""One call's media between its transport and its engine slot.

The transport (WebRTC or SIP) feeds RTP payloads into `uplink` and pulls paced packets from
`downlink`; the media clock calls `pump` on the engine's grid, which moves the finished frame
into the slot's uplink ring and the engine's output out of its downlink ring.
"""

from dataclasses import dataclass

from engine.ring import DownlinkReader, SharedRing, UplinkWriter
from gateway.engine_client import SlotLease
from gateway.media.downlink import Downlink
from gateway.media.uplink import Uplink


@dataclass
class SessionCounters:
    frames_sent: int = 0  # uplink frames written to the ring
    stale_writes: int = 0  # the slot had moved on to another generation


class MediaSession:
    def __init__(self, ring: SharedRing, lease: SlotLease, uplink: Uplink, downlink: Downlink):
        self.lease = lease
        self.uplink = uplink
        self.downlink = downlink
        self._writer = UplinkWriter(ring, lease.slot, lease.generation)
        self._reader = DownlinkReader(ring, lease.slot, lease.generation)
        self.counters = SessionCounters()
        self.closed = False

    def pump(self, completes_frame: bool, now_s: float) -> None:
        if self.closed:
            return
        self.uplink.pump(now_s)
        if completes_frame:
            if self._writer.write(self.uplink.take_frame()):
                self.counters.frames_sent += 1
            else:
                self.counters.stale_writes += 1
        self.downlink.accept(self._reader.read())

    @property
    def downlink_skipped(self) -> int:
        return self._reader.skipped
