"""G.711 PCMU (mu-law) and PCMA (A-law) codecs, vectorised with numpy.

The tables follow the ITU-T G.191 reference implementation of G.711 bit for bit: negative
inputs are reduced by one's complement before quantising (so -1 encodes like 0 with the sign
bit cleared), decoding places each value at the middle of its quantisation step, and A-law
codes carry the even-bit inversion (XOR 0x55). Encoding is one table lookup per sample over all
65536 int16 inputs; decoding is one lookup per byte over 256 codes. Tables are built once, at
import, with array arithmetic.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Pcm16 = npt.NDArray[np.int16]

_ALL_INT16 = np.arange(-32768, 32768, dtype=np.int32)


def _bit_length(values: npt.NDArray[np.int32], max_bits: int) -> npt.NDArray[np.int32]:
    bits = np.zeros_like(values)
    for k in range(max_bits):
        bits += values >= (1 << k)
    return bits


def _ulaw_encode_table() -> npt.NDArray[np.uint8]:
    x = _ALL_INT16
    magnitude = np.where(x < 0, (~x) >> 2, x >> 2) + 33  # 14-bit magnitude plus the bias
    magnitude = np.minimum(magnitude, 0x1FFF)
    segment = 1 + _bit_length(magnitude >> 6, 7)
    high = 8 - segment
    low = 15 - ((magnitude >> segment) & 0xF)
    code = (high << 4) | low
    return np.where(x >= 0, code | 0x80, code).astype(np.uint8)


def _ulaw_decode_table() -> Pcm16:
    codes = np.arange(256, dtype=np.int32)
    inverted = ~codes & 0xFF
    exponent = (inverted >> 4) & 0x7
    step = 4 << (exponent + 1)
    magnitude = (0x80 << exponent) + step * (inverted & 0xF) + step // 2 - 4 * 33
    return np.where(codes < 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_encode_table() -> npt.NDArray[np.uint8]:
    x = _ALL_INT16
    magnitude = np.where(x < 0, (~x) >> 4, x >> 4)  # 0..2047
    exponent = np.where(magnitude > 15, _bit_length(magnitude >> 4, 7), 0)
    mantissa = np.where(exponent > 0, (magnitude >> np.maximum(exponent - 1, 0)) - 16, magnitude)
    code = (exponent << 4) + mantissa
    code = np.where(x >= 0, code | 0x80, code)
    return (code ^ 0x55).astype(np.uint8)


def _alaw_decode_table() -> Pcm16:
    codes = np.arange(256, dtype=np.int32)
    folded = (codes ^ 0x55) & 0x7F
    exponent = folded >> 4
    mantissa = np.where(exponent > 0, (folded & 0xF) + 16, folded & 0xF)
    magnitude = (mantissa << 4) + 8
    magnitude = np.where(exponent > 1, magnitude << np.maximum(exponent - 1, 0), magnitude)
    return np.where(codes > 127, magnitude, -magnitude).astype(np.int16)


_ULAW_ENCODE = _ulaw_encode_table()
_ULAW_DECODE = _ulaw_decode_table()
_ALAW_ENCODE = _alaw_encode_table()
_ALAW_DECODE = _alaw_decode_table()
# Index into the encode tables: int16 value + 32768, computed without a copy via uint16 view.
_OFFSET = np.uint16(0x8000)


def _encode(table: npt.NDArray[np.uint8], pcm: Pcm16) -> bytes:
    if pcm.dtype != np.int16 or pcm.ndim != 1:
        raise ValueError(f"expected 1-D int16 samples, got {pcm.dtype} {pcm.shape}")
    return bytes(table[pcm.view(np.uint16) ^ _OFFSET].tobytes())


def ulaw_encode(pcm: Pcm16) -> bytes:
    """pcm: [samples] int16 at 8 kHz -> one PCMU byte per sample."""
    return _encode(_ULAW_ENCODE, pcm)


def alaw_encode(pcm: Pcm16) -> bytes:
    """pcm: [samples] int16 at 8 kHz -> one PCMA byte per sample."""
    return _encode(_ALAW_ENCODE, pcm)


def ulaw_decode(payload: bytes) -> Pcm16:
    """PCMU bytes -> [len(payload)] int16."""
    return _ULAW_DECODE[np.frombuffer(payload, dtype=np.uint8)]


def alaw_decode(payload: bytes) -> Pcm16:
    """PCMA bytes -> [len(payload)] int16."""
    return _ALAW_DECODE[np.frombuffer(payload, dtype=np.uint8)]


ULAW_SILENCE = 0xFF
ALAW_SILENCE = 0xD5
