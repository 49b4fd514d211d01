"""What the SIP agent tells its driver, and how the driver configures it.

`Agent.receive`, `Agent.handle_timer` and every command return a list of these events mixed
with `Outgoing` datagrams (gateway.sip.transaction). The driver sends each `Outgoing` as is and
hands each event to the call layer; events name calls by their SIP Call-ID.
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass, field

from gateway.sip.sdp import AudioStream, SessionDescription
from gateway.sip.transaction import Address, Outgoing, Timers


@dataclass(frozen=True)
class IncomingCall:
    """A new INVITE: answer with `ring`, `answer` or `reject` (486/503 when the engine is full)."""

    call_id: str
    from_uri: str
    to_uri: str
    remote_sdp: SessionDescription | None
    source: Address
    transport: str


@dataclass(frozen=True)
class CallRinging:
    """Our outbound call got 180/183."""

    call_id: str
    status: int


@dataclass(frozen=True)
class CallAnswered:
    """Our outbound call got its 2xx (ACK already sent); the remote SDP is the answer."""

    call_id: str
    remote_sdp: SessionDescription | None


@dataclass(frozen=True)
class CallConfirmed:
    """Our 2xx to an inbound call was acknowledged: media may flow both ways."""

    call_id: str


@dataclass(frozen=True)
class MediaChanged:
    """An offer/answer in the dialog changed the media: `stream` is what is in force now, its
    direction ours (sendrecv, sendonly, recvonly, inactive; hold and resume), its address,
    codec, payload types and packet time the peer's (a PBX moving the media, a transfer)."""

    call_id: str
    stream: AudioStream
    remote_sdp: SessionDescription

    @property
    def direction(self) -> str:
        return self.stream.direction


@dataclass(frozen=True)
class CallEnded:
    """The call is gone; `reason` is a short bounded word fit for a metric label."""

    call_id: str
    reason: str
    status: int | None = None
    retry_after: int | None = None


@dataclass(frozen=True)
class Registered:
    aor: str
    expires: int


@dataclass(frozen=True)
class RegistrationFailed:
    aor: str
    status: int | None  # None: no answer
    reason: str | None = None  # why a challenge went unanswered (credentials refused...)


@dataclass(frozen=True)
class MessageDropped:
    """A datagram that did not become a transaction: malformed, stray, or not allowed."""

    source: Address
    reason: str


Event = (
    IncomingCall
    | CallRinging
    | CallAnswered
    | CallConfirmed
    | MediaChanged
    | CallEnded
    | Registered
    | RegistrationFailed
    | MessageDropped
)
Output = Event | Outgoing


@dataclass(frozen=True)
class AgentConfig:
    """How the agent presents itself and whom it talks to. Built once by the driver."""

    address: Address  # where peers reach us: Via sent-by and Contact
    user: str = "cadence"
    allowed_networks: tuple[str, ...] = ()  # CIDRs; empty allows every source
    answer_forbidden: bool = True  # 403 to disallowed sources, else drop silently
    timers: Timers = field(default_factory=Timers)
    session_expires: int = 1800
    min_se: int = 90
    ring_timeout_s: float = 120.0  # unanswered by then: 480 inbound, CANCEL outbound
    user_agent: str = "Cadence"

    def __post_init__(self) -> None:
        # Fail when the driver builds the config, not on the first packet.
        if not 90 <= self.min_se <= self.session_expires:
            raise ValueError("need 90 <= min_se <= session_expires (RFC 4028 section 4)")
        if self.ring_timeout_s <= 0:
            raise ValueError("ring_timeout_s must be positive")
        self.networks  # noqa: B018 - parses every CIDR now

    @functools.cached_property
    def networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return tuple(ipaddress.ip_network(n, strict=False) for n in self.allowed_networks)

    def allows(self, source: Address) -> bool:
        if not self.allowed_networks:
            return True
        try:
            address = ipaddress.ip_address(source[0])
        except ValueError:
            return False
        return any(address in network for network in self.networks)
