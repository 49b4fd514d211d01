"""G.711 as an `AudioDecoder`: exact decode, and concealment that repeats and fades out."""

import itertools

import numpy as np
import pytest

from gateway.phone.codec import G711Decoder, encoder
from gateway.rtp.g711 import alaw_decode, ulaw_decode


@pytest.mark.parametrize(("codec", "decode"), [("PCMU", ulaw_decode), ("PCMA", alaw_decode)])
def test_decode_round_trips_through_the_encoder(codec: str, decode: object) -> None:
    tone = (8000 * np.sin(np.arange(160) * 2 * np.pi * 440 / 8000)).astype(np.int16)
    payload = encoder(codec)(tone)
    decoder = G711Decoder(codec)
    pcm = decoder.decode(payload)
    assert decoder.rate == 8000
    assert pcm.dtype == np.int16
    assert pcm.size == 160
    assert np.array_equal(pcm, decode(payload))  # type: ignore[operator]
    assert np.max(np.abs(pcm.astype(int) - tone)) < 300  # G.711 quantisation at this level


def test_concealment_repeats_the_last_packet_fading_to_silence() -> None:
    decoder = G711Decoder("PCMU")
    tone = (8000 * np.sin(np.arange(160) * 2 * np.pi * 500 / 8000)).astype(np.int16)
    heard = decoder.decode(encoder("PCMU")(tone)).astype(float)
    levels = []
    for _ in range(8):
        pcm = decoder.conceal(240)  # any length: a 30 ms gap after a 20 ms packet
        assert pcm.size == 240
        levels.append(float(np.max(np.abs(pcm))))
    assert levels[0] == pytest.approx(np.max(np.abs(heard)) / 2, rel=0.01)
    assert all(b < a for a, b in itertools.pairwise(levels[:6]))
    assert levels[-1] == 0.0
    assert np.array_equal(decoder.recover(b"", 160), np.zeros(160, np.int16))


def test_concealment_before_any_packet_is_silence() -> None:
    assert not G711Decoder("PCMA").conceal(160).any()


def test_a_packet_after_concealment_restores_full_level() -> None:
    decoder = G711Decoder("PCMU")
    loud = encoder("PCMU")(np.full(160, 10000, np.int16))
    decoder.decode(loud)
    decoder.conceal(160)
    decoder.decode(loud)
    assert np.max(np.abs(decoder.conceal(160))) == pytest.approx(
        np.max(decoder.decode(loud)) / 2, rel=0.01
    )
