"""SDP (RFC 4566) for one audio stream, and offer/answer (RFC 3264) for G.711 calls.

Cadence speaks PCMU (payload type 0) and PCMA (8) at 8 kHz with RFC 4733 telephone-event. An
answer keeps the caller's order of preference among those, echoes the caller's telephone-event
payload type number (101 from Asterisk, browsers and SIPp's uac_pcap; 96 and others from
custom scenarios and trunks), accepts the first usable audio stream and rejects every other
m-line with port 0 as RFC 3264 section 6 requires. Hold is a direction attribute
(sendonly/inactive) or, from older phones, a 0.0.0.0 connection address.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gateway.sip.headers import SipParseError, decimal

STATIC_CODECS = {0: ("PCMU", 8000), 8: ("PCMA", 8000)}
SUPPORTED = ("PCMU", "PCMA")
DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")
_ANSWER_DIRECTION = {
    "sendrecv": "sendrecv",
    "sendonly": "recvonly",
    "recvonly": "sendonly",
    "inactive": "inactive",
}
PTIMES_MS = (10, 20, 30, 60)
DIGITS = 20  # the longest number an SDP field may carry: 2**64 (NTP-based origin ids)

Attributes = tuple[tuple[str, str | None], ...]


@dataclass(frozen=True)
class Origin:
    username: str
    session_id: int
    session_version: int
    address: str
    address_type: str = "IP4"

    def __str__(self) -> str:
        return (
            f"{self.username} {self.session_id} {self.session_version} IN "
            f"{self.address_type} {self.address}"
        )


@dataclass(frozen=True)
class MediaDescription:
    """One m= section with its own c= (if any) and a= lines in order."""

    media: str
    port: int
    protocol: str
    formats: tuple[str, ...]
    connection: str | None = None
    attributes: Attributes = ()

    def attribute(self, name: str) -> str | None:
        return next((v or "" for n, v in self.attributes if n == name), None)

    def rtpmap(self, payload_type: int) -> tuple[str, int] | None:
        """(encoding name, clock rate) from a=rtpmap, else the static assignment; None for
        a format nobody named, or one whose a=rtpmap is malformed (no clock rate): that
        format is unusable, not the whole description (offer/answer never raises)."""
        for name, value in self.attributes:
            if name == "rtpmap" and value and value.split(" ", 1)[0] == str(payload_type):
                encoding = value.split(" ", 1)[1] if " " in value else ""
                codec, _, rate = encoding.partition("/")
                clock_rate = decimal(rate.split("/")[0], DIGITS)
                return None if clock_rate is None else (codec, clock_rate)
        return STATIC_CODECS.get(payload_type)

    @property
    def direction(self) -> str:
        return next((n for n, _ in self.attributes if n in DIRECTIONS), "sendrecv")


@dataclass(frozen=True)
class SessionDescription:
    origin: Origin
    session_name: str = "-"
    connection: str | None = None
    attributes: Attributes = ()
    media: tuple[MediaDescription, ...] = ()

    def encode(self) -> bytes:
        lines = ["v=0", f"o={self.origin}", f"s={self.session_name}"]
        if self.connection:
            lines.append(f"c=IN {_address_type(self.connection)} {self.connection}")
        lines.append("t=0 0")
        lines.extend(_attribute_lines(self.attributes))
        for m in self.media:
            lines.append(f"m={m.media} {m.port} {m.protocol} {' '.join(m.formats)}")
            if m.connection:
                lines.append(f"c=IN {_address_type(m.connection)} {m.connection}")
            lines.extend(_attribute_lines(m.attributes))
        return ("\r\n".join(lines) + "\r\n").encode()


def _address_type(address: str) -> str:
    return "IP6" if ":" in address else "IP4"


def _attribute_lines(attributes: Attributes) -> list[str]:
    return [f"a={n}" if v is None else f"a={n}:{v}" for n, v in attributes]


def _connection(value: str) -> str:
    parts = value.split()
    if len(parts) != 3 or parts[0] != "IN" or parts[1] not in ("IP4", "IP6"):
        raise SipParseError(f"bad c= line {value!r}")
    return parts[2].split("/")[0]  # multicast TTL/count suffixes do not matter to a UA


def parse_sdp(data: bytes) -> SessionDescription:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SipParseError("SDP is not UTF-8") from error
    origin: Origin | None = None
    session: dict[str, str | None] = {"s": "-", "c": None}
    session_attributes: list[tuple[str, str | None]] = []
    media: list[MediaDescription] = []
    for line in text.replace("\r\n", "\n").split("\n"):
        if not line:
            continue
        kind, eq, value = line.partition("=")
        if not eq or len(kind) != 1:
            raise SipParseError(f"bad SDP line {line[:60]!r}")
        if kind == "o":
            parts = value.split()
            session_id = decimal(parts[1], DIGITS) if len(parts) == 6 else None
            version = decimal(parts[2], DIGITS) if len(parts) == 6 else None
            if session_id is None or version is None:
                raise SipParseError(f"bad o= line {value!r}")
            origin = Origin(parts[0], session_id, version, parts[5], parts[4])
        elif kind == "m":
            parts = value.split()
            port = decimal(parts[1].split("/")[0], DIGITS) if len(parts) >= 3 else None
            if port is None or port > 65535:
                raise SipParseError(f"bad m= line {value!r}")
            media.append(MediaDescription(parts[0], port, parts[2], tuple(parts[3:])))
        elif kind in ("c", "a") and media:
            media[-1] = _media_line(media[-1], kind, value)
        elif kind == "c":
            session["c"] = _connection(value)
        elif kind == "a":
            name, colon, attr_value = value.partition(":")
            session_attributes.append((name, attr_value if colon else None))
        elif kind == "s":
            session["s"] = value
    if origin is None:
        raise SipParseError("SDP without o= line")
    return SessionDescription(
        origin, session["s"] or "-", session["c"], tuple(session_attributes), tuple(media)
    )


def _media_line(m: MediaDescription, kind: str, value: str) -> MediaDescription:
    if kind == "c":
        return replace(m, connection=_connection(value))
    name, colon, attr_value = value.partition(":")
    return replace(m, attributes=(*m.attributes, (name, attr_value if colon else None)))


@dataclass(frozen=True)
class AudioStream:
    """What offer/answer settled for the one audio stream, from Cadence's point of view."""

    payload_type: int
    codec: str  # "PCMU" | "PCMA"
    telephone_event: int | None  # payload type number, the caller's
    ptime_ms: int
    remote_address: str
    remote_port: int
    direction: str  # ours: sendrecv, or sendonly/inactive while the peer holds us


def _intersect(mirrored: str, wanted: str) -> str:
    """Send only if both allow sending, receive only if both allow receiving."""
    send = mirrored in ("sendrecv", "sendonly") and wanted in ("sendrecv", "sendonly")
    receive = mirrored in ("sendrecv", "recvonly") and wanted in ("sendrecv", "recvonly")
    return {(True, True): "sendrecv", (True, False): "sendonly", (False, True): "recvonly"}.get(
        (send, receive), "inactive"
    )


def _choose(
    offer: MediaDescription, session: SessionDescription, wanted: str = "sendrecv"
) -> AudioStream | None:
    if offer.media != "audio" or offer.protocol != "RTP/AVP" or offer.port == 0:
        return None
    codec: tuple[int, str] | None = None
    event: int | None = None
    for fmt in offer.formats:
        payload_type = decimal(fmt, DIGITS)
        if payload_type is None or payload_type > 127:
            continue
        mapped = offer.rtpmap(payload_type)
        if mapped is None:
            continue
        name, rate = mapped[0].upper(), mapped[1]
        if codec is None and name in SUPPORTED and rate == 8000:
            codec = (payload_type, name)
        elif event is None and name == "TELEPHONE-EVENT" and rate == 8000:
            event = payload_type
    address = offer.connection or session.connection
    if codec is None or address is None:
        return None
    ptime = decimal(offer.attribute("ptime") or "", DIGITS)
    if ptime not in PTIMES_MS:
        ptime = 20
    remote = offer.direction
    if address in ("0.0.0.0", "::"):
        remote = "inactive" if remote == "recvonly" else "sendonly"
    return AudioStream(
        codec[0],
        codec[1],
        event,
        ptime,
        address,
        offer.port,
        _intersect(_ANSWER_DIRECTION[remote], wanted),
    )


def _audio_attributes(stream: AudioStream, direction: str) -> Attributes:
    attributes: list[tuple[str, str | None]] = [
        ("rtpmap", f"{stream.payload_type} {stream.codec}/8000")
    ]
    if stream.telephone_event is not None:
        attributes.append(("rtpmap", f"{stream.telephone_event} telephone-event/8000"))
        attributes.append(("fmtp", f"{stream.telephone_event} 0-16"))
    attributes.extend([("ptime", str(stream.ptime_ms)), (direction, None)])
    return tuple(attributes)


def answer(
    offer: SessionDescription,
    origin: Origin,
    local_address: str,
    local_port: int,
    direction: str = "sendrecv",
) -> tuple[SessionDescription, AudioStream | None]:
    """Answer an offer: one accepted audio stream (or none) and every other m-line rejected.

    `direction` is what we want (sendonly while we hold the peer); the answer allows only
    what both the offer and we allow.
    """
    chosen: AudioStream | None = None
    media: list[MediaDescription] = []
    for m in offer.media:
        stream = _choose(m, offer, direction) if chosen is None else None
        if stream is None:
            media.append(MediaDescription(m.media, 0, m.protocol, m.formats))
            continue
        chosen = stream
        formats = [str(stream.payload_type)]
        if stream.telephone_event is not None:
            formats.append(str(stream.telephone_event))
        attributes = _audio_attributes(stream, stream.direction)
        media.append(
            MediaDescription("audio", local_port, "RTP/AVP", tuple(formats), None, attributes)
        )
    sdp = SessionDescription(origin, "Cadence", local_address, (), tuple(media))
    return sdp, chosen


def offer(
    origin: Origin,
    local_address: str,
    local_port: int,
    direction: str = "sendrecv",
    telephone_event: int = 101,
    ptime_ms: int = 20,
) -> SessionDescription:
    """An offer of PCMU then PCMA with telephone-event, as Cadence places outbound calls."""
    attributes: Attributes = (
        ("rtpmap", "0 PCMU/8000"),
        ("rtpmap", "8 PCMA/8000"),
        ("rtpmap", f"{telephone_event} telephone-event/8000"),
        ("fmtp", f"{telephone_event} 0-16"),
        ("ptime", str(ptime_ms)),
        (direction, None),
    )
    media = MediaDescription(
        "audio", local_port, "RTP/AVP", ("0", "8", str(telephone_event)), None, attributes
    )
    return SessionDescription(origin, "Cadence", local_address, (), (media,))


def accepted_stream(answer_sdp: SessionDescription) -> AudioStream | None:
    """The audio stream an answer to our offer selected (its first accepted codec)."""
    return next((s for m in answer_sdp.media if (s := _choose(m, answer_sdp))), None)
