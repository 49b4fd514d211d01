"""The streaming resampler against a one-shot polyphase reference, and its response."""

import numpy as np
import pytest
from numpy.typing import NDArray

from gateway.media.resample import Resampler, lowpass

RATE_PAIRS = [(48000, 24000), (24000, 48000), (8000, 24000), (24000, 8000), (24000, 16000)]


def _reference(x: NDArray[np.float32], r: Resampler) -> NDArray[np.float64]:
    """Zero-stuff by L, filter with the whole prototype, keep every M-th sample."""
    t = r._phases.shape[1]
    cutoff = 0.9 * 0.5 * min(r.in_rate, r.out_rate) / (r.in_rate * r.up)
    h = lowpass(t * r.up, cutoff, 8.6) * r.up
    u = np.zeros(x.size * r.up)
    u[:: r.up] = x
    return np.asarray(np.convolve(u, h)[:: r.down], np.float64)


@pytest.mark.parametrize(("rate_in", "rate_out"), RATE_PAIRS)
def test_chunks_match_one_shot_reference_with_exact_lengths(rate_in: int, rate_out: int) -> None:
    chunk = rate_in // 50  # 20 ms
    x = np.random.default_rng(0).standard_normal(chunk * 25).astype(np.float32)
    r = Resampler(rate_in, rate_out)
    outs = [r.process(x[i : i + chunk]) for i in range(0, x.size, chunk)]
    assert {o.size for o in outs} == {rate_out // 50}, "every 20 ms in gives 20 ms out"
    y = np.concatenate(outs)
    ref = _reference(x, r)[: y.size]
    np.testing.assert_allclose(y, ref, atol=2e-5)


@pytest.mark.parametrize(("rate_in", "rate_out"), RATE_PAIRS)
def test_passband_is_flat_and_aliases_are_suppressed(rate_in: int, rate_out: int) -> None:
    nyquist = min(rate_in, rate_out) / 2
    n = np.arange(rate_in)  # one second

    def gain(freq: float) -> float:
        r = Resampler(rate_in, rate_out)
        y = r.process(np.sin(2 * np.pi * freq * n / rate_in).astype(np.float32))[400:-400]
        return float(np.sqrt(2 * np.mean(y.astype(np.float64) ** 2)))

    for freq in (200.0, 1000.0, 0.75 * nyquist):
        assert abs(20 * np.log10(gain(freq))) < 0.1, f"{freq} Hz"
    if rate_out < rate_in:  # a tone above the output Nyquist must not fold back
        assert 20 * np.log10(gain(1.1 * nyquist) + 1e-12) < -70


def test_group_delay_is_small() -> None:
    assert Resampler(48000, 24000).delay_s < 0.0011
    assert Resampler(24000, 48000).delay_s < 0.0021
