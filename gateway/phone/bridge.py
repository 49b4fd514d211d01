"""Phone calls as Cadence calls: SIP events in, engine admission, RTP, one end for each call.

Inbound:
    INVITE ─► IncomingCall ─► negotiate (PCMU/PCMA, telephone-event) ─► admit with the engine
          refused ─► 503 + Retry-After (or 486)          no usable codec ─► 488
          admitted ─► 180 ─► (ring time) ─► RTP port ─► 200 + SDP ─► ACK: live
          (an INVITE without SDP: our offer goes in the 200, the ACK's answer starts media)
    re-INVITE ─► MediaChanged ─► hold/resume (the slot keeps ticking), or the new address,
                                 codec or packet time taken
    BYE, CANCEL, session expiry ─► CallEnded ─► CallRegistry.end
    DELETE /v1/calls/{id}, no RTP for rtp_timeout_s, gateway stopping ─► CallRegistry.end
          ─► on_end: BYE (or 480 if not yet answered), RTP socket closed, port given back

Outbound (POST /v1/calls/sip): admit first (a full engine refuses the request, not the callee),
RTP port, INVITE offering PCMU and PCMA (digest auth answered by the agent) ─► CallRinging
─► CallAnswered: the answer picks the codec and packet time, media starts ─► as above.

The registry's `end` is the only way out of a call, whoever starts it, so the slot is
released once and the summary is logged once; the agent's own `CallEnded` for a call we hang
up ourselves arrives after the registry already dropped the call and is ignored.
"""

import asyncio
import logging
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.calls import RETRY_AFTER_S, Call, CallRefused, CallRegistry
from gateway.config import GatewayConfig
from gateway.phone.codec import G711Decoder
from gateway.phone.pacer import RtpPacer
from gateway.phone.ports import RtpPorts
from gateway.phone.registration import Registration
from gateway.phone.rtp import RtpStream
from gateway.phone.signalling import SipSignalling
from gateway.rtp.telephone_event import Dtmf
from gateway.sip.agent import Agent, CallStateError
from gateway.sip.digest import Credentials
from gateway.sip.events import (
    AgentConfig,
    CallAnswered,
    CallConfirmed,
    CallEnded,
    CallRinging,
    Event,
    IncomingCall,
    MediaChanged,
    Output,
    Registered,
    RegistrationFailed,
)
from gateway.sip.headers import SipParseError, SipUri, parse_uri
from gateway.sip.sdp import AudioStream, Origin, SessionDescription, accepted_stream, answer, offer

log = logging.getLogger(__name__)

WATCH_PERIOD_S = 0.5  # how often RTP timeouts are checked
UNSUPPORTED_MEDIA = 488
SERVER_ERROR = 500
END_REASONS = {"remote_hangup": "peer_hangup"}  # agent words -> the registry's words
OFFERED_PTIME_MS = 20
OFFERED_EVENT = 101  # telephone-event payload type in our offers (Asterisk's choice too)


class DialError(ValueError):
    """An outbound call request that cannot be placed (bad URI)."""


class DialUnavailable(Exception):
    """An outbound call the gateway cannot place now (no free RTP port, a socket error)."""


@dataclass
class PhoneCall:
    """One SIP dialog's link to its Cadence call."""

    sip_call_id: str
    from_uri: str
    to_uri: str
    transport: str
    call: Call | None = None  # once admitted
    rtp: RtpStream | None = None  # once answered
    port: int | None = None
    gone: str | None = None  # the dialog ended (CANCEL, BYE...) while setup was still running
    outbound: bool = False
    status: int | None = None  # the final SIP status of a refused outbound call
    dtmf: list[str] = field(default_factory=list)
    decoder: G711Decoder | None = None  # switched to the answer's codec after our offer
    awaiting_answer: bool = False  # we offered in our 200 (late offer): the ACK answers


class PhoneBridge:
    def __init__(self, config: GatewayConfig, calls: CallRegistry) -> None:
        self.config = config
        self.calls = calls
        self._rng = random.Random()
        agent_config = AgentConfig(
            address=(config.sip_address, config.sip_port),
            allowed_networks=config.sip_allow,
        )
        self.agent = Agent(agent_config, self._rng)
        self.signalling = SipSignalling(self.agent, self._on_event)
        self.ports = RtpPorts(*config.rtp_ports)
        self.pacer = RtpPacer(lambda: self.calls.grid)
        self.phones: dict[str, PhoneCall] = {}  # by SIP Call-ID
        self.registration: Registration | None = None
        # the trunk's digest credentials: for the registration, and for calls dialled through
        # --sip-proxy (never offered to a host dialled directly)
        self._trunk: Credentials | None = None
        if config.sip_username is not None:
            self._trunk = Credentials(config.sip_username, config.sip_password or "")
        if config.sip_register is not None:
            proxy = register_proxy(config)
            self.registration = Registration(
                self.signalling, config.sip_register, config.sip_registrar, self._trunk, proxy
            )
            log.info(
                "SIP REGISTER of %s goes to %s",
                config.sip_register,
                f"the outbound proxy {proxy[0]}:{proxy[1]}" if proxy else "the registrar",
            )
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await self.signalling.start(self.config.sip_address, self.config.sip_port)
        if not self.config.sip_allow:
            log.warning("SIP accepts every source address: restrict it with --sip-allow")
        self._spawn(self.pacer.run())
        self._spawn(self._watch_media())
        if self.registration is not None:
            self.registration.start()

    async def stop(self) -> None:
        if self.registration is not None:
            await self.registration.stop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.signalling.stop()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Task[None] = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: "asyncio.Task[None]") -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("phone task failed", exc_info=task.exception())

    # -- SIP events --------------------------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        if isinstance(event, IncomingCall):
            caller = PhoneCall(event.call_id, event.from_uri, event.to_uri, event.transport)
            self.phones[event.call_id] = caller
            self._spawn(self._incoming(caller, event))
            return
        if isinstance(event, Registered | RegistrationFailed):
            if self.registration is not None:
                self.registration.on_event(event)
            return
        sip_id = getattr(event, "call_id", None)  # registrations and drops name no call
        phone = self.phones.get(sip_id) if isinstance(sip_id, str) else None
        if phone is None:
            return
        if isinstance(event, CallConfirmed) and phone.call is not None:
            phone.call.state = "live"
            if phone.awaiting_answer:
                dialog = self.agent.calls.get(phone.sip_call_id)
                self._answered(phone, phone.call, dialog.remote_sdp if dialog else None)
        elif isinstance(event, CallRinging) and phone.call is not None:
            phone.call.state = "ringing"
        elif isinstance(event, CallAnswered) and phone.call is not None:
            self._answered(phone, phone.call, event.remote_sdp)
        elif isinstance(event, MediaChanged) and phone.rtp is not None:
            self._media_changed(phone, phone.rtp, event.stream)
        elif isinstance(event, CallEnded):
            reason = END_REASONS.get(event.reason, event.reason)
            phone.gone = reason
            phone.status = event.status
            if phone.call is not None and phone.rtp is not None:
                self._spawn(self._end(phone.call.id, reason))

    async def _end(self, call_id: str, reason: str) -> None:
        await self.calls.end(call_id, reason)

    def _media_changed(self, phone: PhoneCall, rtp: RtpStream, stream: AudioStream) -> None:
        """A re-offer settled: hold or resume, or the peer's media moved or changed codec."""
        if stream.remote_address in ("0.0.0.0", "::"):  # the old hold form: address unchanged
            declared = rtp.stream
            stream = replace(
                stream, remote_address=declared.remote_address, remote_port=declared.remote_port
            )
        if stream != rtp.stream:
            if phone.decoder is not None:
                phone.decoder.use(stream.codec)
            rtp.accept(stream)  # packet size, payload type, direction and address with it
        assert phone.call is not None
        phone.call.state = "live" if stream.direction == "sendrecv" else "held"
        log.info(
            "call %s: %s %s %d ms to %s:%d",
            phone.call.id,
            stream.direction,
            stream.codec,
            stream.ptime_ms,
            stream.remote_address,
            stream.remote_port,
        )

    # -- inbound setup -----------------------------------------------------------------------

    async def _incoming(self, phone: PhoneCall, event: IncomingCall) -> None:
        sip_id = event.call_id
        offered = event.remote_sdp
        # without an offer in the INVITE (a "late offer"), we offer in the 200 and the ACK answers
        address = self.config.sip_address
        stream = _provisional(address) if offered is None else _negotiate(offered, address)
        if stream is None:
            log.info("SIP call %s refused: no PCMU/PCMA audio offered", sip_id)
            self._command(lambda now: self.agent.reject(sip_id, UNSUPPORTED_MEDIA, now))
            self.phones.pop(sip_id, None)
            return
        decoder = phone.decoder = G711Decoder(stream.codec)
        try:
            call = await self.calls.start_sip(decoder, stream.ptime_ms * decoder.rate // 1000)
        except CallRefused as refused:
            self._refuse(phone, refused.reason)
            return
        except Exception:
            log.exception("SIP call %s: admission failed", sip_id)
            self._command(lambda now: self.agent.reject(sip_id, SERVER_ERROR, now))
            self.phones.pop(sip_id, None)
            return
        phone.call = call
        call.on_end = lambda reason: self._hang_up(phone, reason)
        call.describe = lambda: self._describe(phone)
        try:
            await self._answer(phone, call, offered, stream)
        except Exception:
            log.exception("call %s: setup failed", call.id)
            await self.calls.end(call.id, "setup_failed")

    async def _answer(
        self, phone: PhoneCall, call: Call, offered: SessionDescription | None, stream: AudioStream
    ) -> None:
        sip_id = phone.sip_call_id
        if phone.gone is None:
            self._command(lambda now: self.agent.ring(sip_id, now))
            if self.config.sip_ring_s:
                await asyncio.sleep(self.config.sip_ring_s)
        if phone.gone is not None:
            await self.calls.end(call.id, phone.gone)
            return
        try:
            rtp = await self._open_rtp(phone, call, stream)
        except OSError as error:
            log.error("call %s: no RTP port (%s)", call.id, error)
            await self.calls.end(call.id, "no_rtp_port")
            return
        if phone.gone is not None:
            await self.calls.end(call.id, phone.gone)
            return
        if offered is None:
            local = self._offer(rtp)
            phone.awaiting_answer = True  # media starts when the ACK brings the answer
        else:
            local = _answer(offered, self.config.sip_address, rtp, self._rng)
            self.pacer.add(rtp)
        self._command(lambda now: self.agent.answer(sip_id, local, now))
        log.info(
            "call %s answered: SIP %s from %s, %s %d ms",
            call.id,
            sip_id,
            phone.from_uri,
            stream.codec,
            stream.ptime_ms,
        )

    # -- outbound ----------------------------------------------------------------------------

    async def dial(
        self, uri: str, credentials: Credentials | None = None, from_uri: str | None = None
    ) -> Call:
        """Call `uri` (through --sip-proxy if set); returns the call at once (state dialing).

        Through the trunk, the call authenticates with the configured --sip-username and
        password unless the request brings its own, and its From is the registered
        address-of-record unless the request names one.

        Raises CallRefused (engine full...), DialError (bad URI) and DialUnavailable.
        """
        if self.config.sip_proxy is not None:
            credentials = credentials or self._trunk
        from_uri = from_uri or self.config.sip_register
        try:
            target = parse_uri(uri)
        except SipParseError as error:
            raise DialError(str(error)) from None
        if not isinstance(target, SipUri):
            raise DialError(f"only sip: URIs can be dialled, not {uri!r}")
        decoder = G711Decoder("PCMU")  # until the answer says which
        call = await self.calls.start_sip(decoder, OFFERED_PTIME_MS * decoder.rate // 1000)
        call.state = "dialing"
        caller = from_uri or f"sip:{self.agent.config.user}@{self.config.sip_address}"
        phone = PhoneCall("", caller, uri, "udp")
        phone.outbound, phone.call, phone.decoder = True, call, decoder
        call.on_end = lambda reason: self._hang_up(phone, reason)
        call.describe = lambda: self._describe(phone)
        try:
            rtp = await self._open_rtp(phone, call, _provisional(self.config.sip_address))
            local = self._offer(rtp)
            sip_id, outputs = self.agent.dial(
                uri,
                local,
                time.monotonic(),
                credentials=credentials,
                proxy=self.config.sip_proxy,
                from_uri=from_uri,
            )
        except SipParseError as error:
            await self.calls.end(call.id, "dial_failed")
            raise DialError(str(error)) from None
        except OSError as error:
            await self.calls.end(call.id, "dial_failed")
            raise DialUnavailable(str(error)) from None
        phone.sip_call_id = sip_id
        self.phones[sip_id] = phone
        self.signalling.deliver(outputs)
        log.info("call %s dialling %s (SIP %s)", call.id, uri, sip_id)
        return call

    def _offer(self, rtp: RtpStream) -> SessionDescription:
        """Our offer: PCMU, PCMA, telephone-event, 20 ms packets, at the stream's port."""
        address = self.config.sip_address
        port = rtp.local[1] if rtp.local is not None else 0
        origin = Origin("cadence", self._rng.getrandbits(31), 1, address)
        return offer(origin, address, port, telephone_event=OFFERED_EVENT)

    def _answered(self, phone: PhoneCall, call: Call, remote: SessionDescription | None) -> None:
        """The answer to our offer arrived (outbound 2xx, or the ACK of a late offer)."""
        phone.awaiting_answer = False
        stream = accepted_stream(remote) if remote is not None else None
        if stream is None or phone.rtp is None or phone.decoder is None:
            log.warning("call %s: the answer has no PCMU/PCMA audio", call.id)
            self._spawn(self._end(call.id, "bad_answer"))
            return
        phone.decoder.use(stream.codec)
        phone.rtp.accept(stream)  # the downlink's packet size with it
        self.pacer.add(phone.rtp)
        call.state = "live"
        log.info("call %s answered: %s %d ms", call.id, stream.codec, stream.ptime_ms)

    def _refuse(self, phone: PhoneCall, reason: str) -> None:
        status = self.config.sip_busy_status
        retry = RETRY_AFTER_S.get(reason, 10) if status == 503 else None
        log.info("SIP call %s refused (%s): %d", phone.sip_call_id, reason, status)
        self._command(lambda now: self.agent.reject(phone.sip_call_id, status, now, retry))
        self.phones.pop(phone.sip_call_id, None)

    async def _open_rtp(self, phone: PhoneCall, call: Call, stream: AudioStream) -> RtpStream:
        loop = asyncio.get_running_loop()
        rtp = RtpStream(
            call.id,
            stream,
            call.session,
            self._rng,
            self.config.rtp_timeout_s,
            lambda press: self._dtmf(phone, press),
        )
        failure: OSError = OSError("the RTP port range is exhausted")
        for port in self.ports.candidates():
            try:
                await loop.create_datagram_endpoint(
                    lambda: rtp, local_addr=(self.config.sip_address, port)
                )
            except OSError as error:
                failure = error
                continue
            self.ports.take(port)
            phone.port, phone.rtp = port, rtp
            if self.calls.calls.get(call.id) is not call:
                # ended while the socket was bound (a hang-up, the engine lost): its goodbye
                # ran with no port to free, and none will run again
                self._free_rtp(phone)
                raise OSError(f"call {call.id} ended while its RTP port was opened")
            return rtp
        raise failure

    def _command(self, command: Callable[[float], list[Output]]) -> None:
        """Run an agent command now and send what it says; a call already gone is no error."""
        try:
            self.signalling.deliver(command(time.monotonic()))
        except CallStateError as error:
            log.info("SIP command skipped: %s", error)

    # -- during and after the call -----------------------------------------------------------

    def _dtmf(self, phone: PhoneCall, press: Dtmf) -> None:
        phone.dtmf.append(press.digit)
        call_id = phone.call.id if phone.call is not None else "-"
        log.info("call %s: DTMF %s (%.0f ms)", call_id, press.digit, press.duration_s * 1e3)
        self.calls.metrics.dtmf_digits.labels("sip").inc(1, {"call_id": call_id})

    def _describe(self, phone: PhoneCall) -> dict[str, Any]:
        sip: dict[str, Any] = {
            "call_id": phone.sip_call_id,
            "from": phone.from_uri,
            "to": phone.to_uri,
            "transport": phone.transport,
            "outbound": phone.outbound,
        }
        if phone.status is not None:
            sip["status"] = phone.status
        if phone.rtp is not None:
            sip.update(phone.rtp.describe())
        return {"dtmf": "".join(phone.dtmf), "sip": sip}

    async def _hang_up(self, phone: PhoneCall, reason: str) -> None:
        """The registry ended the call: say goodbye in SIP (if the dialog lives), free RTP."""
        if phone.gone is None:
            self._command(lambda now: self.agent.hangup(phone.sip_call_id, now))
        self._free_rtp(phone)
        self.phones.pop(phone.sip_call_id, None)

    def _free_rtp(self, phone: PhoneCall) -> None:
        if phone.rtp is not None:
            self.pacer.remove(phone.rtp.call_id)
            phone.rtp.close()
        if phone.port is not None:
            self.ports.give_back(phone.port)
        phone.rtp, phone.port = None, None

    async def _watch_media(self) -> None:
        while True:
            await asyncio.sleep(WATCH_PERIOD_S)
            now = time.monotonic()
            for phone in list(self.phones.values()):
                rtp, call = phone.rtp, phone.call
                if rtp is not None and call is not None and rtp.timeout.expired(now):
                    log.warning("call %s: no RTP for %.0f s", call.id, rtp.timeout.timeout_s)
                    await self.calls.end(call.id, "rtp_timeout")


def _provisional(address: str) -> AudioStream:
    """Media before the peer's answer to our offer: PCMU/20 ms assumed, nothing sent."""
    return AudioStream(0, "PCMU", OFFERED_EVENT, OFFERED_PTIME_MS, address, 0, "inactive")


def _negotiate(offer: SessionDescription, address: str) -> AudioStream | None:
    origin = Origin("cadence", 0, 0, address)
    return answer(offer, origin, address, 0)[1]


def _answer(
    offer: SessionDescription, address: str, rtp: RtpStream, rng: random.Random
) -> SessionDescription:
    local = rtp.local
    assert local is not None
    origin = Origin("cadence", rng.getrandbits(31), 1, address)
    return answer(offer, origin, address, local[1])[0]


def register_proxy(config: GatewayConfig) -> tuple[str, int] | None:
    """Where the REGISTER is sent instead of the registrar's own address: the outbound proxy
    (--sip-proxy), unless --sip-registrar names the registrar (one separate from the trunk)."""
    return config.sip_proxy if config.sip_registrar is None else None
