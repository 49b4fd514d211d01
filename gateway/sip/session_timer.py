"""Session timers (RFC 4028): keep a dialog alive by refreshing it, or end it when nobody does.

A phone call whose BYE was lost would otherwise live forever and hold an engine slot. The
negotiation picks an interval (Session-Expires, never below either side's Min-SE) and a
refresher. The refresher sends a re-INVITE or UPDATE at half the interval; the other side
ends the call with BYE if no refresh arrived by the interval minus min(32 s, interval / 3).

Cadence as UAS lets a timer-capable caller refresh (refresher=uac) and refreshes itself only
when the caller cannot (no `Supported: timer`) but a proxy asked for a timer.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.sip.headers import SipParseError, decimal, param, parse_params
from gateway.sip.message import Message

MIN_SE_FLOOR = 90  # RFC 4028 section 4: Min-SE is never below 90 seconds


@dataclass(frozen=True)
class SessionTimer:
    interval: int  # seconds
    we_refresh: bool

    def refresh_due(self, last_refresh: float) -> float:
        return last_refresh + self.interval / 2

    def expiry(self, last_refresh: float) -> float:
        return last_refresh + self.interval - min(32.0, self.interval / 3)

    def deadline(self, last_refresh: float) -> float:
        return self.refresh_due(last_refresh) if self.we_refresh else self.expiry(last_refresh)

    def header(self, we_are_uac: bool) -> str:
        uac_refreshes = self.we_refresh == we_are_uac
        return f"{self.interval};refresher={'uac' if uac_refreshes else 'uas'}"


def _session_expires(message: Message) -> tuple[int, str | None] | None:
    value = message.header("Session-Expires")
    if value is None:
        return None
    number, *rest = value.split(";")
    seconds = decimal(number.strip(), 9)
    if seconds is None:
        raise SipParseError(f"bad Session-Expires {value!r}")
    refresher = param(parse_params(rest), "refresher")
    return seconds, (refresher.lower() if refresher else None)


def _min_se(message: Message) -> int:
    value = (message.header("Min-SE") or "").split(";")[0].strip()
    seconds = decimal(value, 9)
    return MIN_SE_FLOOR if seconds is None else seconds


def supports_timer(message: Message) -> bool:
    return "timer" in [v.lower() for v in message.header_values("Supported")] + [
        v.lower() for v in message.header_values("Require")
    ]


def negotiate_uas(
    request: Message, local_min_se: int, preferred: int
) -> tuple[SessionTimer | None, int | None]:
    """Answer a (re-)INVITE or UPDATE: (timer or None, Min-SE to send in a 422 or None)."""
    offered = _session_expires(request)
    caller_supports = supports_timer(request)
    if offered is None:
        if not caller_supports:
            return None, None
        return SessionTimer(max(preferred, local_min_se, _min_se(request)), False), None
    interval, refresher = offered
    if interval < local_min_se:
        return None, local_min_se
    if refresher is None:
        refresher = "uac" if caller_supports else "uas"
    return SessionTimer(interval, refresher == "uas"), None


def from_uac_response(response: Message, local_min_se: int) -> SessionTimer | None:
    """Our INVITE's (or refresh's) 2xx: the timer the UAS (or a proxy) settled, if any.
    An interval below our Min-SE breaks RFC 4028 (it would have drawn a 422); taken as is,
    0 s would send a refresh on every wake-up, so it is raised to our Min-SE."""
    offered = _session_expires(response)
    if offered is None:
        return None
    interval, refresher = offered
    return SessionTimer(max(interval, local_min_se), refresher != "uas")


def retry_interval(response_422: Message) -> int:
    """After 422 Session Interval Too Small, retry with the Min-SE the UAS asked for."""
    return max(_min_se(response_422), MIN_SE_FLOOR)
