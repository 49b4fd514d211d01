"""Opus through libopus: decoding with the codec's own loss concealment and in-band FEC,
and encoding of the send path.

aiortc decodes through PyAV, which offers neither packet-loss concealment nor forward error
correction, and encodes on a thread pool after a stereo resample, hopping threads for every
20 ms packet. The media paths bind the few libopus calls they need directly (Debian package
libopus0) and hand aiortc ready packets.
"""

import ctypes
import ctypes.util
from functools import cache

import numpy as np
from numpy.typing import NDArray

OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
MAX_FRAME_MS = 120


class OpusError(RuntimeError):
    """libopus is missing, or refused a packet."""


class OpusPacketError(OpusError, ValueError):
    """libopus could not decode a packet (the uplink conceals it like a lost one)."""


@cache
def _libopus() -> ctypes.CDLL:
    path = ctypes.util.find_library("opus")
    if path is None:
        raise OpusError("libopus not found: install it (Debian: apt-get install libopus0)")
    lib = ctypes.CDLL(path)
    lib.opus_decoder_create.restype = ctypes.c_void_p
    lib.opus_decoder_create.argtypes = [ctypes.c_int32, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    lib.opus_decoder_destroy.argtypes = [ctypes.c_void_p]
    lib.opus_decode.restype = ctypes.c_int
    lib.opus_decode.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_int32,
        ctypes.POINTER(ctypes.c_int16),
        ctypes.c_int,
        ctypes.c_int,
    ]
    lib.opus_encoder_create.restype = ctypes.c_void_p
    lib.opus_encoder_create.argtypes = [
        ctypes.c_int32,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_int),
    ]
    lib.opus_encoder_destroy.argtypes = [ctypes.c_void_p]
    lib.opus_encode.restype = ctypes.c_int32
    lib.opus_encode.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_int16),
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int32,
    ]
    lib.opus_strerror.restype = ctypes.c_char_p
    lib.opus_strerror.argtypes = [ctypes.c_int]
    return lib


def _error(code: int) -> str:
    return (_libopus().opus_strerror(code) or b"unknown error").decode()


class OpusDecoder:
    """A mono libopus decoder at `rate`; every call returns int16 samples [n]."""

    def __init__(self, rate: int = 48000) -> None:
        if rate not in OPUS_RATES:
            raise ValueError(f"Opus decodes at {OPUS_RATES}, not {rate}")
        lib = _libopus()
        err = ctypes.c_int(0)
        state = lib.opus_decoder_create(rate, 1, ctypes.byref(err))
        if err.value != 0 or not state:
            raise OpusError(f"opus_decoder_create: {_error(err.value)}")
        self._lib = lib
        self._state: int | None = state
        self.rate = rate
        self._pcm = np.zeros(rate * MAX_FRAME_MS // 1000, np.int16)
        self._ptr = self._pcm.ctypes.data_as(ctypes.POINTER(ctypes.c_int16))

    def close(self) -> None:
        if self._state is not None:
            self._lib.opus_decoder_destroy(self._state)
            self._state = None

    def __del__(self) -> None:
        self.close()

    def decode(self, packet: bytes) -> NDArray[np.int16]:
        return self._run(packet, self._pcm.size, fec=False)

    def conceal(self, samples: int) -> NDArray[np.int16]:
        """Packet-loss concealment for about `samples` missing samples: libopus conceals whole
        2.5 ms units only, so the length is rounded to the nearest (at least one)."""
        return self._run(None, self._whole_units(samples), fec=False)

    def recover(self, next_packet: bytes, samples: int) -> NDArray[np.int16]:
        """The lost packet's audio from the in-band FEC carried by the packet after it.

        Without FEC in `next_packet`, libopus falls back to concealment.
        """
        return self._run(next_packet, self._whole_units(samples), fec=True)

    def _whole_units(self, samples: int) -> int:
        unit = self.rate // 400  # 2.5 ms, the shortest Opus frame
        return max(unit, round(samples / unit) * unit)

    def _run(self, packet: bytes | None, samples: int, fec: bool) -> NDArray[np.int16]:
        if self._state is None:
            raise OpusError("decoder is closed")
        samples = min(samples, self._pcm.size)
        n = self._lib.opus_decode(
            self._state, packet, len(packet) if packet else 0, self._ptr, samples, int(fec)
        )
        if n < 0:
            raise OpusPacketError(f"opus_decode: {_error(n)}")
        return self._pcm[:n].copy()


OPUS_APPLICATION_VOIP = 2048
OPUS_SET_BITRATE = 4002
OPUS_SET_COMPLEXITY = 4010
OPUS_SET_INBAND_FEC = 4012
OPUS_SET_PACKET_LOSS_PERC = 4014
MAX_PACKET_BYTES = 1500


class OpusEncoder:
    """A mono libopus encoder for speech, with in-band FEC for the receiver's concealment."""

    def __init__(
        self, rate: int = 48000, bitrate: int = 32000, complexity: int = 5, loss_percent: int = 5
    ) -> None:
        if rate not in OPUS_RATES:
            raise ValueError(f"Opus encodes at {OPUS_RATES}, not {rate}")
        lib = _libopus()
        err = ctypes.c_int(0)
        state = lib.opus_encoder_create(rate, 1, OPUS_APPLICATION_VOIP, ctypes.byref(err))
        if err.value != 0 or not state:
            raise OpusError(f"opus_encoder_create: {_error(err.value)}")
        self._lib = lib
        self._state: int | None = state
        self.rate = rate
        for request, value in (
            (OPUS_SET_BITRATE, bitrate),
            (OPUS_SET_COMPLEXITY, complexity),
            (OPUS_SET_INBAND_FEC, 1),
            (OPUS_SET_PACKET_LOSS_PERC, loss_percent),
        ):
            code = lib.opus_encoder_ctl(ctypes.c_void_p(state), request, ctypes.c_int32(value))
            if code != 0:
                raise OpusError(f"opus_encoder_ctl({request}): {_error(code)}")
        self._out = ctypes.create_string_buffer(MAX_PACKET_BYTES)

    def encode(self, pcm: NDArray[np.int16]) -> bytes:
        """One packet from int16 [n], n a valid Opus frame size (20 ms: rate / 50)."""
        if self._state is None:
            raise OpusError("encoder is closed")
        pcm = np.ascontiguousarray(pcm, np.int16)
        ptr = pcm.ctypes.data_as(ctypes.POINTER(ctypes.c_int16))
        n = self._lib.opus_encode(self._state, ptr, pcm.size, self._out, MAX_PACKET_BYTES)
        if n < 0:
            raise OpusError(f"opus_encode: {_error(n)}")
        return self._out.raw[:n]

    def close(self) -> None:
        if self._state is not None:
            self._lib.opus_encoder_destroy(self._state)
            self._state = None

    def __del__(self) -> None:
        self.close()
