"""SIP messages (RFC 3261 section 7): parse bytes into `Request`/`Response`, encode back.

Parsing unfolds continuation lines, expands compact header names (`v` -> `Via`), keeps every
header in wire order, and eagerly validates the headers a transaction layer depends on (Via,
From, To, Call-ID, CSeq, Max-Forwards, Content-Length) so that typed accessors never fail
later. Any malformation raises `SipParseError` and nothing else; its `status` says how a UAS
answers it (400, or 505 for a foreign protocol version).

Over UDP one datagram is one message and Content-Length, when present, bounds the body. Over a
stream `StreamFramer` cuts messages by Content-Length, which is then mandatory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Self

from gateway.sip.headers import (
    CSeq,
    NameAddr,
    SipParseError,
    SipUri,
    Uri,
    Via,
    decimal,
    is_token,
    parse_cseq,
    parse_name_addr,
    parse_params,
    parse_uri,
    parse_via,
    split_outside_quotes,
)

COMPACT_FORMS = {
    "i": "Call-ID",
    "m": "Contact",
    "e": "Content-Encoding",
    "l": "Content-Length",
    "c": "Content-Type",
    "f": "From",
    "s": "Subject",
    "k": "Supported",
    "t": "To",
    "v": "Via",
    "o": "Event",
    "u": "Allow-Events",
    "x": "Session-Expires",
}
_CANONICAL = {
    name.lower(): name
    for name in (
        *COMPACT_FORMS.values(),
        *[
            "CSeq",
            "Max-Forwards",
            "Route",
            "Record-Route",
            "Allow",
            "Accept",
            "Require",
            "Proxy-Require",
            "Unsupported",
            "Min-SE",
            "Retry-After",
            "Expires",
            "User-Agent",
            "Server",
            "WWW-Authenticate",
            "Authorization",
            "Timestamp",
            "Proxy-Authenticate",
            "Proxy-Authorization",
            "Reason",
            "Min-Expires",
        ],
    )
}
# Headers whose value is a comma-separated list (RFC 3261 7.3.1); others may hold commas.
LIST_HEADERS = frozenset(
    [
        "via",
        "contact",
        "route",
        "record-route",
        "allow",
        "accept",
        "require",
        "proxy-require",
        "supported",
        "unsupported",
        "allow-events",
        "content-encoding",
    ]
)
MAX_MESSAGE_BYTES = 65535
_STATUS_LINE = re.compile(r"^SIP/2\.0 ([1-6][0-9][0-9])(?: (.*))?$")


def canonical_name(name: str) -> str:
    lower = name.lower()
    return COMPACT_FORMS.get(lower) or _CANONICAL.get(lower) or name


@dataclass(frozen=True)
class Message:
    """Headers and body common to requests and responses."""

    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""

    def header(self, name: str) -> str | None:
        wanted = canonical_name(name).lower()
        return next((v for n, v in self.headers if n.lower() == wanted), None)

    def header_values(self, name: str) -> list[str]:
        """All values of a header, list headers split at top-level commas."""
        wanted = canonical_name(name).lower()
        values: list[str] = []
        for n, v in self.headers:
            if n.lower() == wanted:
                parts = split_outside_quotes(v, ",") if wanted in LIST_HEADERS else [v]
                values.extend(p.strip() for p in parts if p.strip())
        return values

    @property
    def vias(self) -> tuple[Via, ...]:
        return tuple(parse_via(v) for v in self.header_values("Via"))

    @property
    def from_addr(self) -> NameAddr:
        return parse_name_addr(self._required("From"))

    @property
    def to_addr(self) -> NameAddr:
        return parse_name_addr(self._required("To"))

    @property
    def call_id(self) -> str:
        return self._required("Call-ID")

    @property
    def cseq(self) -> CSeq:
        return parse_cseq(self._required("CSeq"))

    @property
    def contacts(self) -> tuple[NameAddr, ...]:
        return tuple(parse_name_addr(v) for v in self.header_values("Contact") if v != "*")

    @property
    def record_routes(self) -> tuple[NameAddr, ...]:
        return tuple(parse_name_addr(v) for v in self.header_values("Record-Route"))

    @property
    def routes(self) -> tuple[NameAddr, ...]:
        return tuple(parse_name_addr(v) for v in self.header_values("Route"))

    def _required(self, name: str) -> str:
        value = self.header(name)
        if value is None:
            raise SipParseError(f"missing {name}")
        return value

    def with_header(self, name: str, value: str, *, first: bool = False) -> Self:
        entry = (canonical_name(name), value)
        headers = (entry, *self.headers) if first else (*self.headers, entry)
        return replace(self, headers=headers)

    def _encode(self, start_line: str) -> bytes:
        length = str(len(self.body))
        lines = [start_line]
        has_length = False
        for name, value in self.headers:
            if name.lower() == "content-length":
                value, has_length = length, True
            lines.append(f"{name}: {value}")
        if not has_length:
            lines.append(f"Content-Length: {length}")
        head = "\r\n".join(lines) + "\r\n\r\n"
        return head.encode("utf-8", "surrogateescape") + self.body


@dataclass(frozen=True)
class Request(Message):
    method: str = "OPTIONS"
    uri: Uri = field(default_factory=lambda: parse_uri("sip:invalid"))

    def encode(self) -> bytes:
        return self._encode(f"{self.method} {self.uri} SIP/2.0")


@dataclass(frozen=True)
class Response(Message):
    status: int = 200
    reason: str = "OK"

    def encode(self) -> bytes:
        return self._encode(f"SIP/2.0 {self.status} {self.reason}")


def _unfold(head: str) -> list[str]:
    lines: list[str] = []
    for line in re.split(r"\r?\n", head):
        if line[:1] in (" ", "\t"):
            if not lines:
                raise SipParseError("continuation line before the first header")
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return lines


def _parse_headers(lines: list[str]) -> tuple[tuple[str, str], ...]:
    headers: list[tuple[str, str]] = []
    for line in lines:
        name, colon, value = line.partition(":")
        name = name.rstrip(" \t")
        if not colon or not is_token(name):
            raise SipParseError(f"bad header line {line[:80]!r}")
        headers.append((canonical_name(name), value.strip()))
    return tuple(headers)


def _validate(message: Message) -> int | None:
    """Parse the headers a transaction relies on; return the Content-Length, if any."""
    if not message.vias:
        raise SipParseError("missing Via")
    for name in ("From", "To", "Call-ID", "CSeq"):
        if len([h for h in message.headers if h[0] == name]) != 1:
            raise SipParseError(f"need exactly one {name}")
    message.from_addr, message.to_addr, message.contacts, message.routes  # noqa: B018
    message.record_routes, message.cseq  # noqa: B018
    if not message.call_id or any(c.isspace() for c in message.call_id):
        raise SipParseError("bad Call-ID")
    max_forwards = message.header("Max-Forwards")
    hops = None if max_forwards is None else decimal(max_forwards, 9)
    if max_forwards is not None and (hops is None or hops > 255):
        raise SipParseError(f"bad Max-Forwards {max_forwards!r}")
    for name in {n.lower() for n, _ in message.headers} & LIST_HEADERS:
        message.header_values(name)  # a list header must split cleanly at its commas
    # Session-Expires drives a timer that ends calls; reject a malformed one here (RFC 4028 says
    # 400) so that the session timer code never meets one.
    expires = message.header("Session-Expires")
    if expires is not None:
        number, *params = expires.split(";")
        if decimal(number.strip(), 9) is None:
            raise SipParseError(f"bad Session-Expires {expires!r}")
        parse_params(params)
    lengths = {v for n, v in message.headers if n == "Content-Length"}
    if not lengths:
        return None
    length = decimal(lengths.pop(), 9)
    if lengths or length is None:
        raise SipParseError("bad Content-Length")
    return length


def parse_message(data: bytes) -> Request | Response:
    """Parse one whole SIP message (a UDP datagram or a framed stream message)."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise SipParseError("message too large")
    data = data.lstrip(b"\r\n")
    head_bytes, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        head_bytes, sep, body = data.partition(b"\n\n")
    if not sep:
        raise SipParseError("no blank line after the headers")
    head = head_bytes.decode("utf-8", "surrogateescape")
    start, *lines = _unfold(head)
    headers = _parse_headers(lines)
    message: Request | Response
    status_match = _STATUS_LINE.match(start)
    if status_match:
        message = Response(headers, b"", int(status_match.group(1)), status_match.group(2) or "")
    elif start.startswith("SIP/"):
        raise SipParseError(f"bad status line {start[:80]!r}")
    else:
        parts = start.split(" ")
        if len(parts) != 3 or not is_token(parts[0]):
            raise SipParseError(f"bad request line {start[:80]!r}")
        if parts[2] != "SIP/2.0":
            raise SipParseError(f"unsupported version {parts[2][:20]!r}", status=505)
        uri = parse_uri(parts[1])
        if isinstance(uri, SipUri) and uri.headers:
            raise SipParseError("escaped headers in a Request-URI")  # RFC 4475 3.1.2.11
        message = Request(headers, b"", parts[0], uri)
    length = _validate(message)
    if isinstance(message, Request) and message.cseq.method != message.method:
        raise SipParseError("CSeq method does not match the request method")
    if length is not None:
        if length > len(body):
            raise SipParseError("body shorter than Content-Length")
        body = body[:length]
    return replace(message, body=body)


class StreamFramer:
    """Cuts a TCP byte stream into whole messages by Content-Length (RFC 3261 18.3)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        messages: list[bytes] = []
        while True:
            # CRLF keep-alives (RFC 5626) may sit between messages.
            self._buffer = self._buffer.lstrip(b"\r\n")
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_MESSAGE_BYTES:
                    raise SipParseError("header section too large")
                return messages
            head = self._buffer[:end].decode("utf-8", "surrogateescape")
            found = re.search(r"(?im)^(?:content-length|l)[ \t]*:[ \t]*([0-9]{1,9})[ \t]*$", head)
            if not found:
                raise SipParseError("Content-Length is mandatory on a stream")
            total = end + 4 + int(found.group(1))
            if total > MAX_MESSAGE_BYTES:
                raise SipParseError("message too large")
            if len(self._buffer) < total:
                return messages
            messages.append(self._buffer[:total])
            self._buffer = self._buffer[total:]


REASONS = {
    100: "Trying",
    180: "Ringing",
    183: "Session Progress",
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    405: "Method Not Allowed",
    407: "Proxy Authentication Required",
    408: "Request Timeout",
    415: "Unsupported Media Type",
    416: "Unsupported URI Scheme",
    420: "Bad Extension",
    422: "Session Interval Too Small",
    480: "Temporarily Unavailable",
    481: "Call/Transaction Does Not Exist",
    482: "Loop Detected",
    486: "Busy Here",
    487: "Request Terminated",
    488: "Not Acceptable Here",
    491: "Request Pending",
    500: "Server Internal Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    505: "Version Not Supported",
    603: "Decline",
}


def response_to(
    request: Request,
    status: int,
    to_tag: str | None = None,
    headers: tuple[tuple[str, str], ...] = (),
    body: bytes = b"",
) -> Response:
    """A response copying Via, From, To, Call-ID and CSeq from the request (RFC 3261 8.2.6)."""
    copied: list[tuple[str, str]] = [(n, v) for n, v in request.headers if n == "Via"]
    to_value = request.header("To") or ""
    if to_tag is not None and request.to_addr.tag is None:
        to_value = f"{to_value};tag={to_tag}"
    copied += [("From", request.header("From") or ""), ("To", to_value)]
    copied += [("Call-ID", request.call_id), ("CSeq", request.header("CSeq") or "")]
    if status == 100 and request.header("Timestamp") is not None:
        copied.append(("Timestamp", request.header("Timestamp") or ""))
    reason = REASONS.get(status, "Unknown")
    return Response((*copied, *headers), body, status, reason)


def error_response(data: bytes, error: SipParseError) -> bytes | None:
    """Best effort 400/505 for a request that failed to parse, if it can be answered at all.

    RFC 3261 needs Via, From, To, Call-ID and CSeq to route and match a response; without any
    of them (or for a malformed response or ACK) the message can only be dropped.
    """
    head = data.lstrip(b"\r\n").split(b"\r\n\r\n", 1)[0].decode("utf-8", "surrogateescape")
    try:
        start, *lines = _unfold(head)
        headers = _parse_headers(lines)
    except SipParseError:
        return None
    method = start.split(" ", 1)[0]
    if start.startswith("SIP/") or method == "ACK" or not is_token(method):
        return None
    wanted = ("Via", "From", "To", "Call-ID", "CSeq")
    copied = tuple((n, v) for name in wanted for n, v in headers if n == name)
    if {n for n, _ in copied} != set(wanted):
        return None
    reason = REASONS.get(error.status, "Bad Request")
    return Response(copied, b"", error.status, reason).encode()
