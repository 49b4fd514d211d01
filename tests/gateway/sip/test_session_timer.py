"""RFC 4028 negotiation on the UAS side and the refresher's and non-refresher's deadlines."""

from __future__ import annotations

import pytest

from gateway.sip.message import Message
from gateway.sip.session_timer import (
    SessionTimer,
    from_uac_response,
    negotiate_uas,
    retry_interval,
)


def message(*headers: tuple[str, str]) -> Message:
    return Message(tuple(headers))


@pytest.mark.parametrize(
    ("headers", "timer", "min_se"),
    [
        ((), None, None),  # SIPp: no timer support, no timer
        ((("Supported", "timer"),), SessionTimer(1800, False), None),
        ((("Supported", "timer"), ("Session-Expires", "600")), SessionTimer(600, False), None),
        ((("Session-Expires", "600"),), SessionTimer(600, True), None),  # a proxy asked
        ((("Session-Expires", "600;refresher=uas"),), SessionTimer(600, True), None),
        ((("Supported", "timer"), ("Session-Expires", "60")), None, 90),
    ],
)
def test_negotiate_uas(
    headers: tuple[tuple[str, str], ...], timer: SessionTimer | None, min_se: int | None
) -> None:
    assert negotiate_uas(message(*headers), 90, 1800) == (timer, min_se)


def test_deadlines_and_header() -> None:
    refresher = SessionTimer(1800, True)
    assert refresher.deadline(100.0) == 1000.0
    watcher = SessionTimer(90, False)
    assert watcher.deadline(0.0) == 60.0  # 90 - min(32, 30)
    assert watcher.header(we_are_uac=False) == "90;refresher=uac"
    assert refresher.header(we_are_uac=True) == "1800;refresher=uac"


def test_uac_side() -> None:
    assert from_uac_response(message(("Session-Expires", "900;refresher=uas")), 90) == SessionTimer(
        900, False
    )
    assert from_uac_response(message(), 90) is None
    # below our Min-SE (RFC 4028 forbids it): 0 s would refresh on every wake-up
    assert from_uac_response(message(("Session-Expires", "0;refresher=uac")), 90) == SessionTimer(
        90, True
    )
    assert retry_interval(message(("Min-SE", "1200"))) == 1200
