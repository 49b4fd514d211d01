"""The RTP port range: which even ports a call may bind (RTCP would take the odd one above).

Pure bookkeeping; the caller binds, and reports a port it could not bind (another process
holds it) by simply asking for the next one. Ports are handed out round-robin, so a port just
given back is the last to be reused and late packets of an ended call meet a closed port.
"""


class RtpPorts:
    def __init__(self, low: int, high: int) -> None:
        if not (1024 <= low < high <= 65535):
            raise ValueError(f"invalid RTP port range {low}-{high}")
        self._ports = list(range(low + low % 2, high, 2))
        if not self._ports:
            raise ValueError(f"the RTP port range {low}-{high} holds no even port")
        self._next = 0
        self._taken: set[int] = set()

    @property
    def free(self) -> int:
        return len(self._ports) - len(self._taken)

    def candidates(self) -> list[int]:
        """Every free port, starting after the last one handed out."""
        n = len(self._ports)
        order = [self._ports[(self._next + i) % n] for i in range(n)]
        return [p for p in order if p not in self._taken]

    def take(self, port: int) -> None:
        self._taken.add(port)
        self._next = (self._ports.index(port) + 1) % len(self._ports)

    def give_back(self, port: int) -> None:
        self._taken.discard(port)
