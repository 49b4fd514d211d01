"""Registering Cadence with a trunk or PBX, so calls to its address-of-record reach us.

Optional (`--sip-register`): many carriers' trunks and PBX extensions only route calls to a
contact that registered, with digest credentials. The agent sends the REGISTER, answers the
challenge and refreshes the binding before it lapses; this module starts it, follows the
outcome for /healthz, retries a failed registration (30 s, doubling to 10 minutes), and
removes the binding (Expires: 0) when the gateway stops, so the trunk stops routing calls to
a gateway that is gone. With `--sip-proxy` and no `--sip-registrar` the REGISTER goes to that
proxy (RFC 3261 8.1.2's outbound proxy), its Request-URI the address-of-record's domain, as
outbound calls do; a registrar named with `--sip-registrar` gets it directly (one separate
from the trunk that carries the calls).
"""

import asyncio
import contextlib
import logging
import time

from gateway.phone.signalling import SipSignalling
from gateway.sip.digest import Credentials
from gateway.sip.events import Registered, RegistrationFailed
from gateway.sip.headers import SipParseError, SipUri, parse_uri
from gateway.sip.transaction import Address

log = logging.getLogger(__name__)

UNREGISTER_WAIT_S = 2.0
EXPIRES_S = 3600
RETRY_FIRST_S = 30.0  # after a failed REGISTER (refused, timed out): retry, doubling to
RETRY_LONGEST_S = 600.0  # ... this, until one succeeds


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
        proxy: Address | None = None,
    ) -> None:
        """`proxy`: where every REGISTER is sent (None: the registrar's own address)."""
        self._signalling = signalling
        self._proxy = proxy
        self.aor = aor
        self.registrar = registrar or registrar_of(aor)
        self._credentials = credentials
        self.state = "unregistered"  # registering, registered, failed (retrying)
        self._settled = asyncio.Event()
        self._retry_in_s = RETRY_FIRST_S
        self._retry: asyncio.TimerHandle | None = None
        self._stopping = False

    def start(self) -> None:
        self.state = "registering"
        self._send(EXPIRES_S)

    async def stop(self) -> None:
        """Remove the binding; waits briefly for the registrar, then gives up quietly."""
        self._stopping = True
        if self._retry is not None:
            self._retry.cancel()
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
            self._retry_in_s = RETRY_FIRST_S
            log.info("SIP %s %s at %s (%d s)", self.aor, self.state, self.registrar, event.expires)
        else:
            self.state = "failed"
            log.error(
                "SIP registration of %s failed: %s%s; retrying in %.0f s",
                self.aor,
                event.status or "timeout",
                f" ({event.reason})" if event.reason else "",
                self._retry_in_s,
            )
            if not self._stopping:
                loop = asyncio.get_running_loop()
                self._retry = loop.call_later(self._retry_in_s, self.start)
                self._retry_in_s = min(RETRY_LONGEST_S, 2 * self._retry_in_s)
        self._settled.set()

    def _send(self, expires: int) -> None:
        agent = self._signalling.agent
        outputs = agent.register(
            self.registrar,
            self.aor,
            time.monotonic(),
            credentials=self._credentials,
            expires=expires,
            proxy=self._proxy,
        )
        self._signalling.deliver(outputs)
