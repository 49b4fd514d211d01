"""Registering Cadence with a trunk or PBX, so calls to its address-of-record reach us.

Optional (`--sip-register`): many carriers' trunks and PBX extensions only route calls to a
contact that registered, with digest credentials. The agent sends the REGISTER, answers the
challenge and refreshes the binding before it lapses; this module starts it, follows the
outcome for /healthz, and removes the binding (Expires: 0) when the gateway stops, so the
trunk stops routing calls to a gateway that is gone.
"""

import asyncio
import contextlib
import logging
import time

from gateway.phone.signalling import SipSignalling
from gateway.sip.digest import Credentials
from gateway.sip.events import Registered, RegistrationFailed
from gateway.sip.headers import SipParseError, SipUri, parse_uri

log = logging.getLogger(__name__)

UNREGISTER_WAIT_S = 2.0
EXPIRES_S = 3600


def registrar_of(aor: str) -> str:
    """The registrar an address-of-record names by default: its domain (RFC 3261 10.2)."""
    uri = parse_uri(aor)
    if not isinstance(uri, SipUri):
        raise SipParseError(f"cannot register {aor!r}: not a sip: URI")
    port = f":{uri.port}" if uri.port else ""
    return f"{uri.scheme}:{uri.host}{port}"


class Registration:
    def __init__(
        self,
        signalling: SipSignalling,
        aor: str,
        registrar: str | None,
        credentials: Credentials | None,
    ) -> None:
        self._signalling = signalling
        self.aor = aor
        self.registrar = registrar or registrar_of(aor)
        self._credentials = credentials
        self.state = "unregistered"  # registering, registered, failed
        self._settled = asyncio.Event()

    def start(self) -> None:
        self.state = "registering"
        self._send(EXPIRES_S)

    async def stop(self) -> None:
        """Remove the binding; waits briefly for the registrar, then gives up quietly."""
        if self.state != "registered":
            return
        self._settled.clear()
        self._send(0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._settled.wait(), UNREGISTER_WAIT_S)

    def on_event(self, event: Registered | RegistrationFailed) -> None:
        if event.aor != self.aor:
            return
        if isinstance(event, Registered):
            self.state = "registered" if event.expires else "unregistered"
            log.info("SIP %s %s at %s (%d s)", self.aor, self.state, self.registrar, event.expires)
        else:
            self.state = "failed"
            log.error("SIP registration of %s failed: %s", self.aor, event.status or "timeout")
        self._settled.set()

    def _send(self, expires: int) -> None:
        agent = self._signalling.agent
        outputs = agent.register(
            self.registrar,
            self.aor,
            time.monotonic(),
            credentials=self._credentials,
            expires=expires,
        )
        self._signalling.deliver(outputs)
