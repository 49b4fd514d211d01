"""G.711 against known code points of ITU-T G.711/G.191 and its round-trip properties."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.rtp.g711 import (
    ALAW_SILENCE,
    ULAW_SILENCE,
    alaw_decode,
    alaw_encode,
    ulaw_decode,
    ulaw_encode,
)

ALL_CODES = bytes(range(256))
ALL_PCM = np.arange(-32768, 32768, dtype=np.int16)


@pytest.mark.parametrize(
    ("pcm", "ulaw", "alaw"),
    [
        (0, 0xFF, 0xD5),
        (-1, 0x7F, 0x55),
        (100, 0xF2, 0xD3),
        (-100, 0x73, 0x53),  # G.191 reduces negatives by one's complement: -100 ~ 99
        (1000, 0xCE, 0xFA),
        (32767, 0x80, 0xAA),
        (-32768, 0x00, 0x2A),
    ],
)
def test_known_code_points(pcm: int, ulaw: int, alaw: int) -> None:
    samples = np.array([pcm], dtype=np.int16)
    assert ulaw_encode(samples) == bytes([ulaw])
    assert alaw_encode(samples) == bytes([alaw])


def test_decoder_extremes_and_silence() -> None:
    assert ulaw_decode(bytes([0x00, 0x80, ULAW_SILENCE])).tolist() == [-32124, 32124, 0]
    assert alaw_decode(bytes([0x2A, 0xAA, ALAW_SILENCE, 0x55])).tolist() == [-32256, 32256, 8, -8]


def test_decode_then_encode_is_identity_except_mu_law_negative_zero() -> None:
    assert alaw_encode(alaw_decode(ALL_CODES)) == ALL_CODES
    again = ulaw_encode(ulaw_decode(ALL_CODES))
    assert [c for c, d in zip(ALL_CODES, again, strict=True) if c != d] == [0x7F]


@pytest.mark.parametrize(
    ("encode", "decode"), [(ulaw_encode, ulaw_decode), (alaw_encode, alaw_decode)]
)
def test_encoding_is_monotonic_and_error_is_bounded(encode, decode) -> None:  # type: ignore[no-untyped-def]
    decoded = decode(encode(ALL_PCM)).astype(np.int32)
    assert np.all(np.diff(decoded) >= 0)  # quantisation keeps the order of samples
    error = np.abs(decoded - ALL_PCM.astype(np.int32))
    # Below the top segment the error is at most half the largest step (1024 in both laws);
    # near zero, half the smallest step: 8 for mu-law's 4-unit steps plus its bias, 8 for A.
    assert error[np.abs(ALL_PCM.astype(np.int32)) < 31000].max() <= 512
    assert error[np.abs(ALL_PCM.astype(np.int32)) < 64].max() <= 8


def test_rejects_wrong_dtype_and_shape() -> None:
    with pytest.raises(ValueError, match="int16"):
        ulaw_encode(np.zeros(4, dtype=np.float32))
    with pytest.raises(ValueError, match="int16"):
        alaw_encode(np.zeros((2, 2), dtype=np.int16))


def test_one_frame_of_sine_survives_round_trip() -> None:
    t = np.arange(160) / 8000
    pcm = (8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    for encode, decode in ((ulaw_encode, ulaw_decode), (alaw_encode, alaw_decode)):
        payload = encode(pcm)
        assert len(payload) == 160
        snr = 10 * np.log10(np.sum(pcm.astype(float) ** 2) / np.sum((decode(payload) - pcm) ** 2))
        assert snr > 30  # G.711 gives about 38 dB on a sine at this level
