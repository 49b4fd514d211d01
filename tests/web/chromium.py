"""Real Chromium for page tests: a fake microphone fed from a WAV file, driven by Playwright.

Chromium comes from Debian (/usr/bin/chromium); Playwright's own browser download is not used.
Tests skip where chromium is missing (and tests/web/conftest.py leaves them out without
Playwright), so the rest of the suite runs anywhere.
"""

import wave
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from playwright.sync_api import Browser, BrowserType, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
WAV_RATE = 48000
BURST_S = 0.6  # tone on, then the same time off: an envelope the echo must follow
TONES_HZ = (330.0, 440.0, 587.0, 784.0)  # a new pitch per burst keeps noise suppression off it


def tone_bursts(path: Path, seconds: float = 12.0) -> Path:
    """A 48 kHz mono WAV of alternating tone bursts and silence (Chromium loops it)."""
    n = int(seconds * WAV_RATE)
    t = np.arange(n) / WAV_RATE
    burst = (t // BURST_S).astype(int)
    on = burst % 2 == 0
    freq = np.asarray(TONES_HZ)[(burst // 2) % len(TONES_HZ)]
    phase = 2 * np.pi * freq * t
    x = 0.5 * np.sin(phase) + 0.2 * np.sin(2 * phase) + 0.1 * np.sin(3 * phase)
    fade = int(0.01 * WAV_RATE)  # 10 ms ramps: no clicks at the burst edges
    ramp = np.ones(n)
    edges = np.flatnonzero(np.diff(on.astype(int)) != 0) + 1
    for edge in edges:
        lo, hi = max(edge - fade, 0), min(edge + fade, n)
        ramp[lo:hi] = np.abs(np.linspace(-1.0, 1.0, hi - lo))
    pcm = (x * on * ramp * 0.8 * 32767).astype(np.int16)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(WAV_RATE)
        w.writeframes(pcm.tobytes())
    return path


def chromium_args(wav: Path, fake_mic_ui: bool = True) -> list[str]:
    args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--autoplay-policy=no-user-gesture-required",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={wav}",
    ]
    if fake_mic_ui:  # grants the microphone without a prompt
        args.append("--use-fake-ui-for-media-stream")
    return args


def launch(browser_type: BrowserType, wav: Path, fake_mic_ui: bool = True) -> Browser:
    """Another Chromium from a running Playwright (one Playwright per thread is allowed)."""
    return browser_type.launch(executable_path=str(CHROMIUM), args=chromium_args(wav, fake_mic_ui))


@contextmanager
def chromium(wav: Path, fake_mic_ui: bool = True) -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.skip("needs Debian's chromium (apt-get install -y chromium)")
    with sync_playwright() as p:
        browser = launch(p.chromium, wav, fake_mic_ui)
        try:
            yield browser
        finally:
            browser.close()
