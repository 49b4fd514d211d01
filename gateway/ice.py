"""Which local addresses WebRTC offers as ICE host candidates.

aioice offers every interface but loopback and has no setting for it; a gateway bound to
loopback (the demo, the tests) or to one interface of a multi-homed host needs to choose.
aioice looks the function up in its module on every gather, so replacing it there applies to
every peer connection of the process. Called once, from the gateway's entry point.
"""

from collections.abc import Sequence

import aioice.ice


def restrict_host_candidates(addresses: Sequence[str]) -> None:
    chosen = list(addresses)

    def host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [a for a in chosen if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

    aioice.ice.get_host_addresses = host_addresses
