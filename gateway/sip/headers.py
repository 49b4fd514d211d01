"""Typed SIP header values (RFC 3261 section 25): URIs, name-addr, Via, CSeq, parameters.

Every parser here takes the text of one header value (already unfolded) and returns a frozen
dataclass named as in the RFC grammar, or raises `SipParseError`. Every dataclass renders back
to its wire form with `str()`. Parameters keep their order and their original case so that a
value we relay (a Via, a Record-Route) goes back out exactly as it came in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

Params = tuple[tuple[str, str | None], ...]


class SipParseError(ValueError):
    """The one error a SIP or SDP parser raises on bad input.

    A driver catches only this: answer 400 when a request can be answered, otherwise drop the
    datagram and count it. `status` is the response a UAS sends for it: 400, or 505 when the
    request speaks another SIP version.
    """

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.status = status


_TOKEN = re.compile(r"^[A-Za-z0-9\-.!%*_+`'~]+$")
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-.]+)$")
_VIA_PROTOCOL = re.compile(r"^\s*SIP\s*/\s*2\.0\s*/\s*([A-Za-z0-9\-.!%*_+`'~]+)\s+", re.ASCII)


def is_token(text: str) -> bool:
    return bool(_TOKEN.match(text))


def decimal(text: str, max_digits: int) -> int | None:
    """`text` as a number if it is 1 to `max_digits` ASCII digits, else None.

    Every numeric field of SIP and SDP goes through here: `str.isdigit` alone passes digits of
    other scripts, which `int` refuses ('²') or reads ('١٢'), and `int` refuses more than
    4300 digits, so either would raise ValueError out of a parser instead of SipParseError.
    """
    if 0 < len(text) <= max_digits and text.isascii() and text.isdigit():
        return int(text)
    return None


def split_outside_quotes(text: str, separator: str) -> list[str]:
    """Split on `separator` except inside "quoted strings" and <angle brackets>."""
    parts: list[str] = []
    current: list[str] = []
    in_quotes = False
    in_angle = False
    escaped = False
    for char in text:
        if in_quotes:
            current.append(char)
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_quotes = False
            continue
        if char == '"':
            in_quotes = True
        elif char == "<":
            in_angle = True
        elif char == ">":
            in_angle = False
        elif char == separator and not in_angle:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    if in_quotes or in_angle:
        raise SipParseError(f"unbalanced quote or angle bracket in {text!r}")
    parts.append("".join(current))
    return parts


def parse_params(parts: list[str]) -> Params:
    """Parse `name[=value]` items (already split on ';'), whitespace around '=' allowed."""
    params: list[tuple[str, str | None]] = []
    for part in parts:
        name, eq, value = part.partition("=")
        name = name.strip()
        if not is_token(name):
            raise SipParseError(f"bad parameter name {name!r}")
        params.append((name, value.strip() if eq else None))
    return tuple(params)


def render_params(params: Params) -> str:
    return "".join(f";{n}" if v is None else f";{n}={v}" for n, v in params)


def param(params: Params, name: str) -> str | None:
    """Value of a parameter by case-insensitive name; '' for a flag, None when absent."""
    for key, value in params:
        if key.lower() == name.lower():
            return "" if value is None else value
    return None


def _parse_hostport(text: str) -> tuple[str, int | None]:
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise SipParseError(f"bad IPv6 reference {text!r}")
        host, rest = text[: end + 1], text[end + 1 :]
    else:
        host, _, port_text = text.partition(":")
        rest = ":" + port_text if _ else ""
    if not host or not _HOST.match(host):
        raise SipParseError(f"bad host {host!r}")
    if not rest:
        return host, None
    port = decimal(rest[1:], 5) if rest.startswith(":") else None
    if port is None:
        raise SipParseError(f"bad port in {text!r}")
    if not 0 < port < 65536:
        raise SipParseError(f"port out of range in {text!r}")
    return host, port


@dataclass(frozen=True)
class SipUri:
    """sip: or sips: URI: `scheme:[user[:password]@]host[:port][;params][?headers]`."""

    scheme: str
    host: str
    user: str | None = None
    password: str | None = None
    port: int | None = None
    params: Params = ()
    headers: str = ""

    def __str__(self) -> str:
        userinfo = ""
        if self.user is not None:
            userinfo = self.user + (f":{self.password}" if self.password is not None else "")
            userinfo += "@"
        port = f":{self.port}" if self.port is not None else ""
        headers = f"?{self.headers}" if self.headers else ""
        return f"{self.scheme}:{userinfo}{self.host}{port}{render_params(self.params)}{headers}"


@dataclass(frozen=True)
class TelUri:
    """tel: URI (RFC 3966): a global (+digits) or local number with parameters."""

    number: str
    params: Params = ()

    def __str__(self) -> str:
        return f"tel:{self.number}{render_params(self.params)}"


@dataclass(frozen=True)
class AbsoluteUri:
    """Any other scheme (RFC 3261 allows them in To/From/Request-URI); kept as text."""

    text: str

    def __str__(self) -> str:
        return self.text


Uri = SipUri | TelUri | AbsoluteUri


def parse_uri(text: str) -> Uri:
    text = text.strip()
    scheme, colon, rest = text.partition(":")
    if not colon or not scheme or not re.match(r"^[A-Za-z][A-Za-z0-9+\-.]*$", scheme):
        raise SipParseError(f"bad URI {text!r}")
    if any(c.isspace() or c in '<>"' for c in rest) or not rest:
        raise SipParseError(f"bad URI {text!r}")
    lower = scheme.lower()
    if lower == "tel":
        number, *params = rest.split(";")
        if not number or not re.match(r"^\+?[0-9A-Fa-f*#.()\-pPwW]+$", number):
            raise SipParseError(f"bad tel number {number!r}")
        return TelUri(number, parse_params(params))
    if lower not in ("sip", "sips"):
        return AbsoluteUri(text)
    # The user part may hold '?' and ';' (RFC 3261 25.1 user-unreserved) but never '@', so
    # split userinfo off first and only then look for URI headers.
    userinfo, at, hostpart = rest.rpartition("@")
    if not at:
        hostpart = rest
    hostpart, _, headers = hostpart.partition("?")
    user: str | None = None
    password: str | None = None
    if at:
        user, pcolon, pw = userinfo.partition(":")
        password = pw if pcolon else None
        if not user:
            raise SipParseError(f"empty user in {text!r}")
    hostport, *params = hostpart.split(";")
    host, port = _parse_hostport(hostport)
    return SipUri(lower, host, user, password, port, parse_params(params), headers)


def _outside_quotes_index(text: str, char: str) -> int:
    in_quotes = escaped = False
    for index, current in enumerate(text):
        if escaped:
            escaped = False
        elif in_quotes and current == "\\":
            escaped = True
        elif current == '"':
            in_quotes = not in_quotes
        elif current == char and not in_quotes:
            return index
    return -1


@dataclass(frozen=True)
class NameAddr:
    """From, To, Contact, Route, Record-Route: `[display-name] <uri> *(;param)`."""

    uri: Uri
    display_name: str | None = None
    params: Params = ()

    @property
    def tag(self) -> str | None:
        return param(self.params, "tag")

    def with_tag(self, tag: str) -> NameAddr:
        kept = tuple(p for p in self.params if p[0].lower() != "tag")
        return replace(self, params=(*kept, ("tag", tag)))

    def __str__(self) -> str:
        name = f"{self.display_name} " if self.display_name else ""
        return f"{name}<{self.uri}>{render_params(self.params)}"


def parse_name_addr(text: str) -> NameAddr:
    text = text.strip()
    angle = _outside_quotes_index(text, "<")
    if angle >= 0:
        head, tail = text[:angle], text[angle + 1 :]
        uri_text, close, after = tail.partition(">")
        if not close:
            raise SipParseError(f"missing '>' in {text!r}")
        if uri_text != uri_text.strip():
            raise SipParseError(f"whitespace inside <> in {text!r}")
        display = head.strip()
        if display.startswith('"'):
            if not display.endswith('"') or len(display) < 2:
                raise SipParseError(f"bad quoted display name {display!r}")
        elif display and not all(is_token(word) for word in display.split()):
            raise SipParseError(f"bad display name {display!r}")
        after = after.strip()
        if after and not after.startswith(";"):
            raise SipParseError(f"junk after '>' in {text!r}")
        params = parse_params(split_outside_quotes(after, ";")[1:]) if after else ()
        return NameAddr(parse_uri(uri_text), display or None, params)
    # addr-spec form: parameters after the URI belong to the header, not to the URI.
    uri_text, *param_parts = split_outside_quotes(text, ";")
    if any(c in uri_text for c in ",?") and not uri_text.lower().startswith("tel:"):
        raise SipParseError(f"addr-spec needs <> around {text!r}")
    return NameAddr(parse_uri(uri_text), None, parse_params(param_parts))


@dataclass(frozen=True)
class Via:
    """One Via entry: `SIP/2.0/<transport> host[:port] *(;param)`."""

    transport: str
    host: str
    port: int | None = None
    params: Params = ()

    @property
    def branch(self) -> str | None:
        return param(self.params, "branch")

    def __str__(self) -> str:
        port = f":{self.port}" if self.port is not None else ""
        return f"SIP/2.0/{self.transport} {self.host}{port}{render_params(self.params)}"


def parse_via(text: str) -> Via:
    match = _VIA_PROTOCOL.match(text)
    if not match:
        raise SipParseError(f"bad Via {text!r}")
    sent_by, *params = split_outside_quotes(text[match.end() :], ";")
    host, port = _parse_hostport(re.sub(r"\s*:\s*", ":", sent_by.strip()))
    return Via(match.group(1).upper(), host, port, parse_params(params))


@dataclass(frozen=True)
class CSeq:
    """`CSeq: <sequence number> <method>`; the number is below 2**31 (RFC 3261 8.1.1.5)."""

    seq: int
    method: str

    def __str__(self) -> str:
        return f"{self.seq} {self.method}"


def parse_cseq(text: str) -> CSeq:
    parts = text.split()
    if len(parts) != 2 or not is_token(parts[1]):
        raise SipParseError(f"bad CSeq {text!r}")
    seq = decimal(parts[0], 10)
    if seq is None or seq >= 2**31:
        raise SipParseError(f"bad CSeq number {text!r}")
    return CSeq(seq, parts[1])
