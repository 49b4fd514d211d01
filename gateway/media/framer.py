"""Exact frames by samples, on the engine's clock (sans-IO).

Audio arrives in whatever pieces the codec and resampler give (480, 479, 481 samples...);
the engine takes exactly one frame per tick. `take` always returns one whole frame: if less
audio is buffered, the frame is completed with silence at its start (the audio is late, so
the gap belongs before it); what is left over after a take stays for the next frame, up to
`max_backlog` samples, beyond which the oldest is dropped so delay cannot creep up.
"""

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray


@dataclass
class FramerCounters:
    frames: int = 0
    padded_samples: int = 0
    dropped_samples: int = 0


class Framer:
    def __init__(self, frame_samples: int, max_backlog: int) -> None:
        if frame_samples <= 0 or max_backlog < 0:
            raise ValueError("frame_samples must be positive and max_backlog non-negative")
        self.frame_samples = frame_samples
        self.max_backlog = max_backlog
        self._buf = np.zeros(frame_samples + max_backlog + frame_samples, np.float32)
        self._fill = 0
        self.counters = FramerCounters()

    @property
    def buffered(self) -> int:
        return self._fill

    def push(self, pcm: NDArray[np.float32]) -> None:
        """Append mono samples; if that overflows the buffer, the oldest samples go."""
        n = pcm.size
        room = self._buf.size - self._fill
        if n > room:
            drop = min(self._fill, n - room)
            self._discard(drop)
            self.counters.dropped_samples += drop
            if n > self._buf.size:
                self.counters.dropped_samples += n - self._buf.size
                pcm = pcm[-self._buf.size :]
                n = pcm.size
        self._buf[self._fill : self._fill + n] = pcm
        self._fill += n

    def take(self) -> NDArray[np.float32]:
        """One frame [frame_samples], float32, owned by the caller."""
        n = self.frame_samples
        frame = np.zeros(n, np.float32)
        have = min(self._fill, n)
        frame[n - have :] = self._buf[:have]
        self.counters.padded_samples += n - have
        self._discard(have)
        if self._fill > self.max_backlog:
            excess = self._fill - self.max_backlog
            self._discard(excess)
            self.counters.dropped_samples += excess
        self.counters.frames += 1
        return frame

    def _discard(self, n: int) -> None:
        if n:
            self._buf[: self._fill - n] = self._buf[n : self._fill]
            self._fill -= n
