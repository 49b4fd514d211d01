"""Live calls of one gateway: admission, media, per-call records, and the end of a call.

A call is admitted by the engine (a slot lease) before its transport is answered, and every
way a call ends (hang-up API, peer gone, engine gone, gateway stopping) goes through `end`,
which releases the slot once and logs one JSON summary line.
"""

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from aiortc import RTCDataChannel, RTCPeerConnection

from engine.ring import SharedRing
from gateway.captions import Captioner, CaptionStream, send_captions
from gateway.config import GatewayConfig
from gateway.deadline import ENGINE_COUNTERS, PathTiming, deadline_record
from gateway.engine_client import EngineClient, EngineRefused, EngineUnavailable, SlotLease
from gateway.media.clock import PumpGrid
from gateway.media.downlink import Downlink
from gateway.media.jitter import JitterCounters
from gateway.media.opus import OpusDecoder
from gateway.media.session import MediaSession
from gateway.media.uplink import AudioDecoder, Uplink
from gateway.metrics import GatewayMetrics
from gateway.webrtc import OPUS_CLOCK, PACKET_TICKS, answer, opus_decode_rate

log = logging.getLogger(__name__)

COMPLETED = ("hangup", "peer_closed", "peer_hangup")  # end reasons that are not failures
ENDED_KEPT = 256  # final records kept, so a page polling its call learns why it ended
LONGEST_SIP_PACKET_S = 0.06  # G.711 packets may be 10, 20, 30 or 60 ms, whatever was offered
LONGEST_OPUS_PACKET_S = 0.12  # RFC 7587: an Opus packet holds up to 120 ms (browsers send 20)


# seconds a refused caller is told to wait before trying again (HTTP and SIP 503 Retry-After)
RETRY_AFTER_S = {"full": 5, "draining": 30, "starting": 5, "unavailable": 10}


class CallRefused(Exception):
    """No call was set up; `reason` is full, draining, starting or unavailable (the keys of
    RETRY_AFTER_S)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass
class Call:
    id: str
    transport: str
    lease: SlotLease
    session: MediaSession
    started_wall_s: float = field(default_factory=time.time)
    started_s: float = field(default_factory=time.monotonic)
    state: str = "connecting"
    end_reason: str | None = None
    pc: RTCPeerConnection | None = None
    reported: JitterCounters = field(default_factory=JitterCounters)
    captions: CaptionStream | None = None  # when the gateway has a captioner
    caption_channel: RTCDataChannel | None = None  # once the peer's channel opens
    on_end: Callable[[str], Awaitable[None]] | None = None  # the transport's own goodbye
    describe: Callable[[], dict[str, Any]] | None = None  # transport details for the record


class CallRegistry:
    def __init__(
        self,
        config: GatewayConfig,
        engine: EngineClient,
        ring: SharedRing,
        grid: PumpGrid,
        metrics: GatewayMetrics,
        captioner: Captioner | None = None,
    ) -> None:
        self.config = config
        self.captioner = captioner
        self.engine = engine
        self.ring = ring
        self.grid = grid
        self.metrics = metrics
        self.calls: dict[str, Call] = {}
        self._ending: set[asyncio.Task[dict[str, Any] | None]] = set()  # see _end_soon
        self.ended: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.stopping = False  # set once the gateway stops: no call is admitted after that

    # -- lifecycle ---------------------------------------------------------------------------

    async def start_webrtc(self, offer_sdp: str) -> tuple[Call, str]:
        t0 = time.monotonic()
        call_id = uuid.uuid4().hex[:16]
        lease = await self._admit(call_id)
        spec = self.ring.spec
        uplink = Uplink(
            OpusDecoder(opus_decode_rate(spec.sample_rate)),
            self.config.jitter,
            model_rate=spec.sample_rate,
            frame_samples=spec.frame_samples,
            pump_period_s=self.grid.step_s,
            longest_packet_s=LONGEST_OPUS_PACKET_S,
        )
        downlink = Downlink(
            spec.sample_rate, OPUS_CLOCK, PACKET_TICKS, self.config.send_queue_max_s
        )
        call = Call(call_id, "webrtc", lease, MediaSession(self.ring, lease, uplink, downlink))
        if self.captioner is not None:
            call.captions = CaptionStream(self.captioner)

        async def on_state(state: str) -> None:
            if state == "connected":
                call.state = "live"
            elif state in ("failed", "closed"):
                await self.end(call_id, f"peer_{state}")

        def on_captions(channel: RTCDataChannel) -> None:
            call.caption_channel = channel

        try:
            call.pc, answer_sdp = await answer(
                offer_sdp, uplink, downlink, self.grid, on_state, on_captions
            )
            self._refuse_if_stopping(call_id)  # the gateway may have begun to stop meanwhile
            self._refuse_if_engine_changed(call_id, lease)  # or the engine gone meanwhile
        except BaseException:
            if call.pc is not None:
                await call.pc.close()
            await self._release(lease)
            raise
        self._register(call, t0)
        asyncio.get_running_loop().call_later(
            self.config.webrtc_setup_timeout_s, self._end_if_connecting, call
        )
        log.info("call %s answered on slot %d gen %d", call_id, lease.slot, lease.generation)
        return call, answer_sdp

    def _end_if_connecting(self, call: Call) -> None:
        if self.calls.get(call.id) is call and call.state == "connecting":
            log.warning("call %s: the peer never connected; ending it", call.id)
            self._end_soon(call, "setup_timeout")

    def _end_soon(self, call: Call, reason: str) -> None:
        """End a call from a callback that cannot wait for it."""
        ending = asyncio.get_running_loop().create_task(self.end(call.id, reason))
        self._ending.add(ending)
        ending.add_done_callback(self._ending.discard)

    async def start_sip(self, decoder: AudioDecoder, packet_samples: int) -> Call:
        """Admit a phone call and build its media; the SIP bridge answers and attaches RTP.

        `packet_samples` is the negotiated packet time at the codec's rate: the jitter buffer's
        first guess (it learns the real one from timestamps) and the send packet size.
        """
        t0 = time.monotonic()
        call_id = uuid.uuid4().hex[:16]
        lease = await self._admit(call_id)
        spec = self.ring.spec
        jitter = replace(self.config.jitter, clock_rate=decoder.rate, packet_samples=packet_samples)
        uplink = Uplink(
            decoder,
            jitter,
            model_rate=spec.sample_rate,
            frame_samples=spec.frame_samples,
            pump_period_s=self.grid.step_s,
            longest_packet_s=LONGEST_SIP_PACKET_S,
        )
        # a whole frame arrives while up to one packet is still queued, plus pacing slack
        frame_s, packet_s = spec.frame_samples / spec.sample_rate, packet_samples / decoder.rate
        queue_s = max(self.config.send_queue_max_s, frame_s + 2 * packet_s)
        downlink = Downlink(spec.sample_rate, decoder.rate, packet_samples, queue_s)
        call = Call(call_id, "sip", lease, MediaSession(self.ring, lease, uplink, downlink))
        call.state = "ringing"
        self._register(call, t0)
        log.info("call %s admitted on slot %d gen %d", call_id, lease.slot, lease.generation)
        return call

    def _register(self, call: Call, t0: float) -> None:
        """Count a set-up call live; `t0` is when its setup began (monotonic seconds)."""
        self.calls[call.id] = call
        self.metrics.calls_active.labels(call.transport).inc()
        self.metrics.setup_duration.labels(call.transport).observe(
            time.monotonic() - t0, {"call_id": call.id}
        )

    async def _admit(self, call_id: str) -> SlotLease:
        self._refuse_if_stopping(call_id)
        if self.engine.ring_name != self.ring.name:
            # reconnected to a new engine that is still warming up: its slots are in a ring the
            # media clock has not switched to yet (gateway/main.py re-attaches once it is ready)
            self.metrics.admission_refusals.labels("unavailable").inc(1, {"call_id": call_id})
            raise CallRefused("unavailable", "the engine is restarting")
        try:
            lease = await self.engine.open(call_id)
        except EngineRefused as refused:
            self.metrics.admission_refusals.labels(refused.reason).inc(1, {"call_id": call_id})
            raise CallRefused(
                refused.reason, f"engine refused the call: {refused.reason}"
            ) from None
        except EngineUnavailable as exc:
            self.metrics.admission_refusals.labels("unavailable").inc(1, {"call_id": call_id})
            raise CallRefused("unavailable", str(exc)) from None
        if self.stopping:  # the gateway began to stop while the engine answered
            await self._release(lease)
            self._refuse_if_stopping(call_id)
        return lease

    def _refuse_if_engine_changed(self, call_id: str, lease: SlotLease) -> None:
        """Registered, a call of an engine that died during its setup would miss `end_all`
        and pump into a ring no engine reads."""
        current = self.engine.ring_name if self.engine.connected else ""
        if lease.ring != current or current != self.ring.name:
            self.metrics.admission_refusals.labels("unavailable").inc(1, {"call_id": call_id})
            raise CallRefused("unavailable", "the engine went away while the call was set up")

    def _refuse_if_stopping(self, call_id: str) -> None:
        if self.stopping:
            self.metrics.admission_refusals.labels("draining").inc(1, {"call_id": call_id})
            raise CallRefused("draining", "the gateway is stopping")

    async def _release(self, lease: SlotLease) -> None:
        # if the engine is gone, it freed every slot of this gateway when the socket closed
        with contextlib.suppress(EngineUnavailable):
            await self.engine.release(lease)

    async def end(self, call_id: str, reason: str) -> dict[str, Any] | None:
        """End a call once, whoever asks; returns its final record."""
        call = self.calls.pop(call_id, None)
        if call is None:
            return None
        record = self.record(call)  # before the slot is released: its counters are final
        call.state = "ended"
        call.end_reason = reason
        call.session.closed = True
        record.update(state="ended", end_reason=reason)
        self.ended[call_id] = record
        while len(self.ended) > ENDED_KEPT:
            self.ended.popitem(last=False)
        self._report_media(call)
        await self._release(call.lease)
        try:
            if call.pc is not None:
                await call.pc.close()
            if call.on_end is not None:
                await call.on_end(reason)
        except Exception:
            # the call is over for the registry either way: count it and log its summary
            log.exception("call %s: the transport's goodbye failed", call_id)
        outcome = "completed" if reason in COMPLETED else "failed"
        self.metrics.calls_active.labels(call.transport).dec()
        self.metrics.calls.labels(call.transport, outcome).inc(1, {"call_id": call.id})
        log.info("call summary %s", json.dumps(record, sort_keys=True))
        return record

    async def end_all(self, reason: str) -> None:
        await asyncio.gather(*(self.end(call_id, reason) for call_id in list(self.calls)))

    # -- media clock -------------------------------------------------------------------------

    def pump(self, index: int, now_s: float) -> None:
        release_s = self.grid.release(index)
        for call in self.calls.values():
            try:
                self._pump_call(call, release_s, now_s)
            except Exception:
                # one call's failure must not cost the calls pumped after it their instant
                log.exception("call %s: media pump failed; ending the call", call.id)
                call.session.closed = True
                self._end_soon(call, "media_error")

    def skip(self, start: int, stop: int) -> None:
        """The media clock resumed at instant `stop` after a stall: the frames of the instants
        start, ..., stop - 1 never reach the ring."""
        count = self.grid.frames_between(start, stop)
        if count:
            for call in self.calls.values():
                if not call.session.closed:
                    call.session.counters.late_frames += count
                    self._count_late(call, count)

    def _pump_call(self, call: Call, release_s: float | None, now_s: float) -> None:
        late = call.session.counters.late_frames
        call.session.pump(now_s, release_s)
        self._count_late(call, call.session.counters.late_frames - late)
        self.metrics.send_queue.observe(call.session.downlink.queued_s)
        if release_s is not None:
            self._report_media(call)
            if call.captions is not None:
                steps = call.session.downlink.take_tokens()
                send_captions(call.captions, call.caption_channel, steps)

    def _count_late(self, call: Call, frames: int) -> None:
        if frames:
            self.metrics.late_frames.labels(call.transport).inc(frames, {"call_id": call.id})

    def _report_media(self, call: Call) -> None:
        uplink = call.session.uplink
        exemplar = {"call_id": call.id}
        jitter_delay = self.metrics.jitter_delay.labels(call.transport)
        for delay in uplink.take_delays():
            jitter_delay.observe(delay, exemplar)
        now, before = uplink.jitter.counters, call.reported
        for outcome in ("played", "lost", "late", "duplicate", "dropped"):
            delta = getattr(now, outcome) - getattr(before, outcome)
            if delta:
                self.metrics.packets.labels(call.transport, outcome).inc(delta, exemplar)
        concealed = now.lost + now.empty + now.stretched
        previous = before.lost + before.empty + before.stretched
        if concealed > previous:
            self.metrics.concealed.labels(call.transport).inc(concealed - previous, exemplar)
        call.reported = JitterCounters(**vars(now))

    # -- records -----------------------------------------------------------------------------

    def record(self, call: Call) -> dict[str, Any]:
        """The live per-call record served by GET /v1/calls/{id}."""
        session = call.session
        jitter = session.uplink.jitter
        delays = np.fromiter(jitter.recent_delays_s, float)
        engine: dict[str, int] = {}
        ctrl = self.ring.control[call.lease.slot]
        if int(ctrl["generation"]) == call.lease.generation:
            for key in ENGINE_COUNTERS:
                engine[key] = int(ctrl[key])
        return {
            "id": call.id,
            "transport": call.transport,
            "state": call.state,
            "slot": call.lease.slot,
            "generation": call.lease.generation,
            "started_at": round(call.started_wall_s, 3),
            "duration_s": round(time.monotonic() - call.started_s, 3),
            "engine": engine,
            "deadline": deadline_record(
                engine,
                delays,
                jitter.target_delay_s,
                session.uplink.concealed,
                session.downlink.queued_s,
                PathTiming(self.grid.period_s, self.grid.lead_s),
            ),
            "jitter_buffer": {
                **vars(jitter.counters),
                "target_delay_s": round(jitter.target_delay_s, 4),
                "delay_p50_s": _percentile(delays, 50),
                "delay_p95_s": _percentile(delays, 95),
                "concealed": session.uplink.concealed,
                "undecodable": session.uplink.undecodable,
            },
            "uplink": {
                "frames": session.counters.frames_sent,
                "late_frames": session.counters.late_frames,
                "padded_samples": session.uplink.framer.counters.padded_samples,
                "dropped_samples": session.uplink.framer.counters.dropped_samples,
            },
            "captions": _captions_record(call),
            **(call.describe() if call.describe is not None else {}),
            "downlink": {
                "frames": session.downlink.frames,
                "queued_s": round(session.downlink.queued_s, 4),
                "silent_packets": session.downlink.silent_packets,
                "skipped_packets": session.downlink.skipped_packets,
                "dropped_samples": session.downlink.dropped_samples,
                "skipped_frames": session.downlink_skipped,
            },
        }


def _captions_record(call: Call) -> dict[str, Any] | None:
    if call.captions is None:
        return None
    channel = call.caption_channel
    return {
        "channel": None if channel is None else channel.readyState,
        "frames": call.captions.frames,
        "pieces": call.captions.pieces,
    }


def _percentile(values: np.ndarray[Any, np.dtype[np.float64]], q: float) -> float | None:
    return None if values.size == 0 else round(float(np.percentile(values, q)), 4)
