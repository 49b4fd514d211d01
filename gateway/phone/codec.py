"""G.711 behind the uplink's `AudioDecoder` protocol, and the matching encoder.

G.711 carries no redundancy, so a lost packet cannot be recovered from the next one: both
`conceal` and `recover` repeat the last packet heard, quieter each time it is repeated, which
is gentler on the model than a hole of silence and fades out within a few packets.
"""

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from gateway.rtp.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode

RATE = 8000
FADE = 0.5  # gain applied per repeated packet: -6 dB, silent after about five repeats

_DECODERS: dict[str, Callable[[bytes], NDArray[np.int16]]] = {
    "PCMU": ulaw_decode,
    "PCMA": alaw_decode,
}
_ENCODERS: dict[str, Callable[[NDArray[np.int16]], bytes]] = {
    "PCMU": ulaw_encode,
    "PCMA": alaw_encode,
}


class G711Decoder:
    rate = RATE

    def __init__(self, codec: str) -> None:
        self.use(codec)
        self._last: NDArray[np.int16] = np.zeros(0, np.int16)  # the last packet heard
        self._gain = 1.0

    def use(self, codec: str) -> None:
        """Switch codec: an outbound call learns which one from the answer, after admission."""
        self._decode = _DECODERS[codec]

    def decode(self, packet: bytes) -> NDArray[np.int16]:
        pcm = self._decode(packet)
        self._last = pcm  # a fresh array; converted only if it is ever repeated
        self._gain = 1.0
        return pcm

    def conceal(self, samples: int) -> NDArray[np.int16]:
        """`samples` of the last packet repeated (tiled to length) at a falling gain."""
        self._gain *= FADE
        if self._last.size == 0 or self._gain < 1 / 64:
            return np.zeros(samples, np.int16)
        repeated = np.resize(self._last, samples) * self._gain
        return np.round(repeated).astype(np.int16)

    def recover(self, next_packet: bytes, samples: int) -> NDArray[np.int16]:
        return self.conceal(samples)


def encoder(codec: str) -> Callable[[NDArray[np.int16]], bytes]:
    """The encoder of a negotiated codec name (PCMU or PCMA)."""
    return _ENCODERS[codec]
