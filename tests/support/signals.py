"""Test signals that survive codecs and correlate sharply, and how their echo is measured."""

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray


def band_limited_noise(seconds: float, rate: int, seed: int = 7) -> NDArray[np.int16]:
    """Seeded noise in the telephone band (300-3400 Hz) at `rate`, RMS a quarter of full scale:
    it survives Opus and G.711 and its autocorrelation has one sharp peak."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    spectrum = np.fft.rfft(rng.standard_normal(n))
    freqs = np.fft.rfftfreq(n, 1 / rate)
    spectrum[(freqs < 300) | (freqs > 3400)] = 0
    x = np.fft.irfft(spectrum, n)
    x *= 0.25 / np.sqrt(np.mean(x**2))
    return np.clip(x * 32767, -32768, 32767).astype(np.int16)


def correlation(a: NDArray[np.floating[Any]], b: NDArray[np.floating[Any]]) -> float:
    """Normalised correlation of two aligned pieces of audio."""
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12))


def echo_windows(
    sent: NDArray[np.float32],
    sent_at: NDArray[np.float64],
    heard: NDArray[np.float32],
    arrival: NDArray[np.float64],
    packet: int,
    window: int,
    correlate: Callable[[NDArray[np.float32], NDArray[np.float32]], float] = correlation,
) -> tuple[float, float]:
    """(median correlation, median seconds from a sample's sending to its echo's arrival).

    `sent_at` and `arrival` are per sample (NaN where nothing arrived). Measured per window of
    sent audio, each with its own lag: a concealed or dropped packet shifts the alignment by a
    packet, which one global correlation would count as a mismatch. The first window (call
    setup) is left out.
    """
    arrival = np.maximum.accumulate(np.where(np.isnan(arrival), -np.inf, arrival))
    peaks, delays = [], []
    for start in range(window, sent.size - window + 1, window):
        ref = sent[start : start + window]
        # the echo arrives within a second of leaving
        first = max(0, int(np.searchsorted(arrival, sent_at[start], side="left")) - packet)
        hay = heard[first : first + 2 * window]
        if hay.size < window:
            continue
        size = 1 << int(np.ceil(np.log2(hay.size + window)))
        xc = np.fft.irfft(np.fft.rfft(hay, size) * np.conj(np.fft.rfft(ref, size)), size)
        lag = int(np.argmax(xc[: hay.size - window + 1]))
        peaks.append(correlate(hay[lag : lag + window], ref))
        delays.append(float(arrival[first + lag] - sent_at[start]))
    if not peaks:
        return 0.0, float("nan")
    return float(np.median(peaks)), float(np.median(delays))
