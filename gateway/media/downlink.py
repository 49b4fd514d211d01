"""The send path of one call: engine frames -> resample -> a bounded queue of packets.

Sans-IO: `accept` takes the engine's frames (int16 at the model rate) and `next_packet` hands
out exactly one packet's worth at the codec rate, or silence when nothing is queued. The
queue holds at most `max_queue_s`; beyond it the oldest audio goes, so a stall upstream can
never leave a call permanently behind; and a backlog that stands above one packet for two
seconds (left by a late frame) is dropped too (DRAIN_FRAMES). Frames that arrive before the
sender has asked for its first packet are not queued: the engine serves a slot from the
moment it is admitted, while the peer may take a few hundred milliseconds more to connect.
"""

from collections import deque
from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray

from engine.ring import DownlinkFrame
from gateway.media.pcm import to_float32, to_int16
from gateway.media.resample import Resampler

TOKEN_BACKLOG_FRAMES = 64  # about 5 s of steps at 80 ms
# The queue's level just before each frame arrives is its standing backlog: pure delay. A late
# frame (the engine published after its deadline) leaves silence sent and its audio queued,
# raising that level for good; when it has stayed above one packet for this many frames, the
# excess is dropped, so lateness costs a glitch, not lasting delay.
DRAIN_FRAMES = 25  # 2 s at 80 ms


class Downlink:
    def __init__(
        self, model_rate: int, codec_rate: int, packet_samples: int, max_queue_s: float
    ) -> None:
        self._resampler = None if model_rate == codec_rate else Resampler(model_rate, codec_rate)
        self.packet_samples = packet_samples
        self.rate = codec_rate  # of the packets handed out
        self._max = round(max_queue_s * codec_rate)
        self._queue = np.zeros(self._max + packet_samples, np.float32)
        self._fill = 0
        self.frames = 0
        self.silent_packets = 0  # packets sent with nothing queued
        self.skipped_packets = 0  # packet instants the sender passed unsent (it ran late)
        self.dropped_samples = 0
        # the steps' tokens until `take_tokens`; bounded, so a call nobody captions cannot grow
        self.tokens: deque[NDArray[np.int32]] = deque(maxlen=TOKEN_BACKLOG_FRAMES)
        self.sending = False  # set by the first next_packet
        self._floors: deque[int] = deque(maxlen=DRAIN_FRAMES)  # fill before each frame

    @property
    def queued_s(self) -> float:
        return self._fill / self.rate

    def accept(self, frames: Iterable[DownlinkFrame]) -> None:
        for frame in frames:
            if frame.tokens.size:
                self.tokens.append(frame.tokens)
            if not self.sending:
                continue
            self._drain()
            x = to_float32(frame.pcm)
            if self._resampler is not None:
                x = self._resampler.process(x)
            self._append(x)
            self.frames += 1

    def _drain(self) -> None:
        self._floors.append(self._fill)
        standing = min(self._floors) - self.packet_samples
        if len(self._floors) == self._floors.maxlen and standing > 0:
            self._discard(standing)
            self.dropped_samples += standing
            self._floors.clear()

    def take_tokens(self) -> list[NDArray[np.int32]]:
        """The tokens of the frames accepted since the last call, oldest first."""
        taken = list(self.tokens)
        self.tokens.clear()
        return taken

    def _append(self, x: NDArray[np.float32]) -> None:
        overflow = self._fill + x.size - self._max
        if overflow > 0:
            self._discard(min(overflow, self._fill))
            self.dropped_samples += overflow
            x = x[-(self._max - self._fill) :] if x.size > self._max - self._fill else x
        self._queue[self._fill : self._fill + x.size] = x
        self._fill += x.size

    def skip(self, packets: int) -> None:
        """Drop the audio of packet instants that passed unsent, so the queue stays on time."""
        drop = min(self._fill, packets * self.packet_samples)
        self._discard(drop)
        self.dropped_samples += drop
        self.skipped_packets += packets

    def next_packet(self) -> NDArray[np.int16]:
        self.sending = True
        n = self.packet_samples
        out = np.zeros(n, np.float32)
        have = min(n, self._fill)
        out[:have] = self._queue[:have]
        self._discard(have)
        if have == 0:
            self.silent_packets += 1
        return to_int16(out)

    def _discard(self, n: int) -> None:
        """Drop the oldest `n` queued samples."""
        self._queue[: self._fill - n] = self._queue[n : self._fill]
        self._fill -= n
